"""Ops that move data around without arithmetic: concatenation, flips, padding,
resize, triangles, scatters into slices, masked fills.

Views (view, transpose, select, expand, ...) are not here: the device kernels
build them as aliases of one storage. The functional ``*_copy`` and
``*_scatter`` forms that functionalization and compiled graphs emit are.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.runtime import eager
from tpu_debug.runtime import lazy as _lazy
from tpu_debug.runtime.ops._checks import OpIndexError, c_type, require, sizes
from tpu_debug.runtime.ops._common import canonical_dim, canonical_dims, compute_dtype
from tpu_debug.runtime.ops.registry import composite, lower

aten = torch.ops.aten


def _result_dtype(arrays):
    """PyTorch's result_type over tensors (cat, stack)."""
    return compute_dtype(*arrays)[1]


# ---- concatenation ---------------------------------------------------------------


def _check_cat(tensors, dim=0, **_out):
    """CPU's cat checks (``cat_meta``), with its messages: PyTorch's meta kernel words them otherwise."""
    for i, t in enumerate(tensors):
        require(t.dim() > 0, f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    # 1-D empty tensors are skipped whatever the others' shape (legacy behaviour)
    kept = [(i, t) for i, t in enumerate(tensors) if not (t.dim() == 1 and t.numel() == 0)]
    if not kept:
        return
    ref = kept[0][1]
    d = dim + ref.dim() if dim < 0 else dim
    if not 0 <= d < ref.dim():
        return  # the meta kernel names a dimension out of range
    for i, t in kept[1:]:
        require(t.dim() == ref.dim(), f"Tensors must have same number of dimensions: got {ref.dim()} and {t.dim()}")
        for k in range(ref.dim()):
            require(k == d or t.shape[k] == ref.shape[k],
                    f"Sizes of tensors must match except in dimension {d}. Expected size {ref.shape[k]} but got "
                    f"size {t.shape[k]} for tensor number {i} in the list.")


@lower(aten.cat.default, check=_check_cat)
def cat(tensors, dim=0):
    dtype = _result_dtype(tensors)
    # PyTorch skips 1-D empty tensors whatever the others' shape (legacy behaviour);
    # they still take part in type promotion
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    axis = canonical_dim(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    dtype = _result_dtype(tensors)
    axis = canonical_dim(dim, tensors[0].ndim + 1)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=axis)


# ---- reordering --------------------------------------------------------------------


@lower(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, canonical_dims(dims, x.ndim)) if x.ndim else x


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(canonical_dim(d, x.ndim) for d in dims))


@lower(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@lower(aten.repeat_interleave.Tensor, eager_only=True)
def repeat_interleave(repeats, *, output_size=None):
    counts = np.asarray(repeats)
    return jnp.asarray(np.repeat(np.arange(counts.shape[0], dtype=counts.dtype), counts))


@composite(aten.tensor_split.tensor_indices_or_sections)
def tensor_split_tensor(x, indices_or_sections, dim=0):
    """The split points as a tensor. PyTorch's kernel reads them on the host and refuses a
    `tpu` tensor of them; here they come to the host and PyTorch's composite kernel splits
    ``x`` into views of it."""
    op = aten.tensor_split.tensor_indices_or_sections
    points = indices_or_sections
    if torch._subclasses.fake_tensor.is_fake(points):
        # tracing (dynamo's fake tensors, AOTAutograd's functional wrappers of them): the
        # Python form of the kernel, which makes unbacked sizes
        return op.decompose(x, points.cpu(), dim)
    if points.device.type == "tpu":
        # a read the user did not write: the transfer tracer files it as a tensor used as
        # an index (an implicit sync), not as a ``.to()``
        _lazy.computed(points)
        points = eager.to_cpu(points, op="index")
    # PyTorch's C++ composite kernel: its checks and messages are the ones a CPU call gives
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, x, points, dim)


# ---- identity copies ---------------------------------------------------------------


@lower(aten.clone.default)
def clone(x, *, memory_format=None):
    return x


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return x


@lower(aten.alias_copy.default)
def alias_copy(x):
    return x


@lower(aten.expand_copy.default)
def expand_copy(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(
        (x.shape[i - lead] if s == -1 else s) for i, s in enumerate(size)
    )
    return jnp.broadcast_to(x, shape)


@lower(aten.permute_copy.default)
def permute_copy(x, dims):
    return jnp.transpose(x, tuple(canonical_dim(d, x.ndim) for d in dims))


def _check_narrow_copy(x, dim, start, length, **_out):
    require(x.dim() > 0, "narrow() cannot be applied to a 0-dim tensor.")
    require(dim < x.dim(), "Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.  "
            "(Could this error message be improved?  If so, please report an enhancement request to PyTorch.)")
    require(dim >= -x.dim(), f"Dimension out of range (expected to be in range of [{-x.dim()}, {x.dim() - 1}], "
            f"but got {dim})", OpIndexError)
    size = x.shape[dim]
    require(-size <= start <= size, f"start out of range (expected to be in range of [{-size}, {size}], but got "
            f"{start})", OpIndexError)
    start = start + size if start < 0 else start
    require(length >= 0 and start + length <= size,
            f"start ({start}) + length ({length}) exceeds dimension size ({size}).")


@lower(aten.narrow_copy.default, check=_check_narrow_copy)
def narrow_copy(x, dim, start, length):
    axis = canonical_dim(dim, x.ndim)
    if start < 0:
        start += x.shape[axis]
    return lax.slice_in_dim(x, start, start + length, axis=axis)


# ---- padding -------------------------------------------------------------------------


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value).astype(x.dtype), config)


def _source_index(n, before, after, mode):
    """For each output position along a padded dim of size n, the input index it reads.

    Negative pads crop; ``reflect`` mirrors without repeating the edge,
    ``replicate`` repeats the edge element."""
    i = np.arange(-before, n + after)
    if mode == "reflect":
        period = 2 * (n - 1) if n > 1 else 1
        i = np.abs(i) % period if n > 1 else np.zeros_like(i)
        i = np.where(i > n - 1, period - i, i)
    return np.clip(i, 0, n - 1)


def _mode_pad(mode):
    def forward(x, padding):
        for k in range(len(padding) // 2):
            axis = x.ndim - 1 - k
            src = _source_index(x.shape[axis], padding[2 * k], padding[2 * k + 1], mode)
            x = jnp.take(x, jnp.asarray(src), axis=axis)
        return x

    def backward(grad, x, padding):
        _, vjp = jax.vjp(lambda v: forward(v, padding), x)
        return vjp(grad.astype(x.dtype))[0]

    return forward, backward


_reflect, _reflect_backward = _mode_pad("reflect")
_edge, _edge_backward = _mode_pad("replicate")
for _n in (1, 2, 3):
    lower(getattr(aten, f"reflection_pad{_n}d").default)(_reflect)
    lower(getattr(aten, f"reflection_pad{_n}d_backward").default)(_reflect_backward)
    lower(getattr(aten, f"replication_pad{_n}d").default)(_edge)
    lower(getattr(aten, f"replication_pad{_n}d_backward").default)(_edge_backward)


# ---- resize -------------------------------------------------------------------------------


@lower(aten.resize.default)
def resize(x, size, *, memory_format=None):
    """Functional ``resize_``: the first elements of ``x`` in the new shape, zeros beyond."""
    n = math.prod(size)
    flat = x.reshape(-1)[:n]
    if flat.shape[0] < n:
        flat = jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), x.dtype)])
    return flat.reshape(tuple(size))


# ---- triangles and diagonals -------------------------------------------------------------


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


def _diag_coords(n_rows, n_cols, offset):
    """Row and column indices of diagonal ``offset`` of an n_rows x n_cols matrix."""
    if offset >= 0:
        n = max(min(n_rows, n_cols - offset), 0)
        return np.arange(n), np.arange(n) + offset
    n = max(min(n_rows + offset, n_cols), 0)
    return np.arange(n) - offset, np.arange(n)


@lower(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    m = x.shape[-1]
    n = m + abs(offset)
    rows, cols = _diag_coords(n, n, offset)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype).at[..., rows, cols].set(x)
    nd = x.ndim + 1
    d1, d2 = canonical_dim(dim1, nd), canonical_dim(dim2, nd)
    return jnp.moveaxis(out, (-2, -1), (d1, d2))


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    rows, cols = _diag_coords(moved.shape[-2], moved.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


# ---- scatters into views (functionalization's inverse views) ---------------------------------


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    axis = canonical_dim(dim, x.ndim)
    where = (slice(None),) * axis + (slice(start, end, step),)
    return x.at[where].set(src.astype(x.dtype))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    axis = canonical_dim(dim, x.ndim)
    if index < 0:
        index += x.shape[axis]
    return x.at[(slice(None),) * axis + (index,)].set(src.astype(x.dtype))


def _check_as_strided_scatter(x, src, size, stride, storage_offset=None, **_out):
    """The view ``as_strided`` makes of the input must lie within its storage."""
    offset = storage_offset or 0
    span = 0 if any(n == 0 for n in size) else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    need = x.element_size() * (offset + span) if span else 0
    have = x.numel() * x.element_size()
    require(need <= have, f"setStorage: sizes {sizes(size)}, strides {sizes(stride)}, storage offset {offset}, "
            f"and itemsize {x.element_size()} requiring a storage size of {need} are out of bounds for storage "
            f"of size {have}")


@lower(aten.as_strided_scatter.default, check=_check_as_strided_scatter)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    idx = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    flat = x.reshape(-1).at[idx.reshape(-1)].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


# ---- masked fill ------------------------------------------------------------------------------


def _check_masked_fill(x, mask, value, **_out):
    """CPU converts the fill value to the input's type and refuses a conversion that overflows:
    a complex value into a real tensor (a complex tensor whatever its value: its type decides
    here, nothing is read from the device), an integer outside the integer type's range."""
    if x.is_complex():
        return
    if isinstance(value, torch.Tensor):
        overflow = value.is_complex()
    elif isinstance(value, complex):
        overflow = value.imag != 0
    elif isinstance(value, int) and not isinstance(value, bool) and not x.is_floating_point() and x.dtype != torch.bool:
        info = torch.iinfo(x.dtype)
        overflow = not info.min <= value <= info.max
    else:
        overflow = False
    require(not overflow, f"value cannot be converted to type {c_type(x.dtype)} without overflow")


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor, check=_check_masked_fill)
def masked_fill(x, mask, value):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    fill = jnp.asarray(value).astype(x.dtype)
    return jnp.where(jnp.broadcast_to(mask, shape), fill, jnp.broadcast_to(x, shape))
