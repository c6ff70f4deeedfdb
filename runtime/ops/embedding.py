"""Embedding lookups and embedding bags (sum, mean or max of the rows of each bag), with
their backward ops and ``embedding_renorm``.

Sparse gradients (``sparse=True``) have no lowering: the runtime's tensors are dense.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._checks import OpIndexError, index_check, require
from tpu_debug.runtime.ops._common import opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


# ---- embedding ----------------------------------------------------------------------------


def _check_embedding(weight, indices, *args, **_out):
    require(weight.dim() == 2, "'weight' must be 2-D")


@lower(aten.embedding.default, check=_check_embedding, values=index_check(
    lambda weight, indices, *a, **kw: [(indices, weight.shape[0], 0)],
    lambda value, dim, size: "index out of range in self", error=OpIndexError))
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lower(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    acc = opmath(weight).dtype
    w = weight.astype(acc)
    used = jnp.zeros((weight.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True)
    a = jnp.abs(w)
    if norm_type == 2:
        norms = jnp.sqrt(jnp.sum(a * a, axis=1))
    elif norm_type == 1:
        norms = jnp.sum(a, axis=1)
    elif norm_type == float("inf"):
        norms = jnp.max(a, axis=1)
    else:
        norms = jnp.power(jnp.sum(jnp.power(a, norm_type), axis=1), 1.0 / norm_type)
    scale = jnp.where(used & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (w * scale[:, None].astype(acc)).astype(weight.dtype)


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad.shape[-1]
    idx = indices.reshape(-1).astype(jnp.int64)
    g = grad.reshape(-1, dim)
    acc = opmath(grad).dtype
    g = g.astype(acc)
    if padding_idx >= 0:
        g = jnp.where((idx != padding_idx)[:, None], g, jnp.zeros((), acc))
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, dim), acc).at[idx].add(g).astype(grad.dtype)


# ---- embedding bags -----------------------------------------------------------------------


def _bags(indices, offsets, include_last_offset):
    """(bag of each index, number of bags); indices past the last bag map out of range."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    seg = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    if include_last_offset:
        seg = jnp.where(seg >= num_bags, num_bags, seg)
    return seg.astype(jnp.int64), num_bags


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    seg, num_bags = _bags(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    w = opmath(weight)
    rows = jnp.take(w, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    count = jax.ops.segment_sum(valid.astype(jnp.int64), seg, num_bags)
    # PyTorch's meta kernel sizes bag_size like offsets, even with include_last_offset
    bag_size = jnp.pad(count, (0, offsets.shape[0] - num_bags))
    empty_max = jnp.zeros((0,), jnp.int64)
    if mode == 2:
        low = jnp.asarray(-jnp.inf, rows.dtype)
        masked = jnp.where(valid[:, None], rows, low)
        best = jax.ops.segment_max(masked, seg, num_bags)
        # PyTorch keeps the first maximum of a bag
        pos = jnp.arange(indices.shape[0])[:, None]
        is_best = (masked == jnp.take(best, jnp.clip(seg, 0, num_bags - 1), axis=0)) & valid[:, None]
        first = jax.ops.segment_min(jnp.where(is_best, pos, indices.shape[0]), seg, num_bags)
        has = count[:, None] > 0
        out = jnp.where(has, best, 0)
        max_idx = jnp.where(has, jnp.take(indices, jnp.clip(first, 0, indices.shape[0] - 1)), 0)
        return out, seg, bag_size, max_idx.astype(jnp.int64)
    total = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), seg, num_bags)
    if mode == 1:
        total = total / jnp.maximum(count, 1).astype(total.dtype)[:, None]
    return total, seg, bag_size, empty_max


@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                          per_sample_weights, include_last_offset, padding_idx)


def _bag_dense_backward(grad, indices, seg, bag_size, max_indices, num_weights, scale_grad_by_freq,
                        mode, per_sample_weights, padding_idx):
    g = opmath(grad)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    out = jnp.zeros((num_weights, g.shape[-1]), g.dtype)
    if mode == 2:
        has = bag_size[:, None] > 0
        cols = jnp.arange(g.shape[-1])[None, :]
        return out.at[max_indices, cols].add(jnp.where(has, g, 0))
    num_bags = g.shape[0]
    in_range = (seg >= 0) & (seg < num_bags)
    rows = jnp.take(g, jnp.clip(seg, 0, num_bags - 1), axis=0)
    if mode == 1:
        rows = rows / jnp.maximum(jnp.take(bag_size, jnp.clip(seg, 0, num_bags - 1)), 1).astype(g.dtype)[:, None]
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    keep = valid & in_range
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), g.dtype).at[indices].add(keep.astype(g.dtype))
        rows = rows / jnp.maximum(jnp.take(freq, indices), 1)[:, None]
    return out.at[indices].add(jnp.where(keep[:, None], rows, 0))


def _require_dense(sparse):
    if sparse:
        raise NoLoweringError(
            "embedding_bag(sparse=True) has no tpu lowering (sparse gradients); use sparse=False"
        )


@lower(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    _require_dense(sparse)
    # recompute the bag of each index: PyTorch's CPU forward leaves offset2bag empty in "sum" mode
    seg = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    return _bag_dense_backward(grad, indices, seg, bag_size, max_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lower(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    seg = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    num_bags = grad.shape[0]
    valid = (indices != padding_idx if padding_idx >= 0 else True) & (seg >= 0) & (seg < num_bags)
    g = jnp.take(opmath(grad), jnp.clip(seg, 0, num_bags - 1), axis=0)
    out = jnp.sum(g * jnp.take(opmath(weight), indices, axis=0), axis=-1)
    return jnp.where(valid, out, 0)
