"""Pooling (max, average, adaptive, fractional) and ``im2col``/``col2im`` (``unfold``/``fold``),
with their backward ops: every op that reads a window of its input.

Windows are gathered with index tables computed in NumPy at trace time: one
gather per op, exact window semantics (padding, dilation, ``ceil_mode``,
adaptive bounds) spelled out in one place, ``_windows``. Max pooling's backward
routes the gradient through the saved indices, as PyTorch's does; average
pooling's is ``jax.vjp`` of its forward.

Half-precision inputs compute in float32 (PyTorch's ``opmath``), except that
the 3-d adaptive average sums in the half dtype as PyTorch's kernel does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.runtime.ops._common import HALF, ntuple, opmath, round_to
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _pool_out(size, k, s, p, d, ceil_mode):
    # at::pooling_output_shape
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _sliding(size, k, s, p, d, ceil_mode):
    """(positions (out, k), valid (out, k)) of a sliding window along one dim."""
    out = _pool_out(size, k, s, p, d, ceil_mode)
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _adaptive(size, out):
    """(positions, valid) of PyTorch's adaptive windows [floor(i*n/o), ceil((i+1)*n/o))."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    k = int((end - start).max()) if out else 0
    pos = start[:, None] + np.arange(k)[None, :]
    return pos, pos < end[:, None]


def _windows(spatial, per_dim):
    """Combine per-dim windows into flat indices (*out, K) and a validity mask.

    ``per_dim[i]`` is (positions (out_i, k_i), valid (out_i, k_i)) along spatial
    dim i; K = prod(k_i), ordered row-major over the window (PyTorch's order).
    """
    nd = len(spatial)
    flat = np.zeros((1,) * (2 * nd), np.int64)
    valid = np.ones((1,) * (2 * nd), bool)
    stride = 1
    for i in reversed(range(nd)):
        pos, ok = per_dim[i]
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = pos.shape
        flat = flat + np.clip(pos, 0, spatial[i] - 1).reshape(shape) * stride
        valid = valid & ok.reshape(shape)
        stride *= spatial[i]
    outs = tuple(p.shape[0] for p, _ in per_dim)
    ks = tuple(p.shape[1] for p, _ in per_dim)
    full = outs + ks
    flat = np.broadcast_to(flat, full).reshape(outs + (math.prod(ks),))
    valid = np.broadcast_to(valid, full).reshape(outs + (math.prod(ks),))
    return flat, valid


def _gather(x, nd, flat):
    """x (..., *spatial) -> (..., *out, K) window values."""
    lead = x.shape[: x.ndim - nd]
    idx = flat.astype(np.int32) if flat.size and flat.max() < 2**31 else flat
    return x.reshape(lead + (math.prod(x.shape[x.ndim - nd :]),))[..., idx]


def _max_windows(x, nd, flat, valid):
    vals = _gather(x, nd, flat)
    if jnp.issubdtype(vals.dtype, jnp.floating):
        low = jnp.asarray(-jnp.inf, vals.dtype)
    else:
        low = jnp.asarray(jnp.iinfo(vals.dtype).min, vals.dtype)
    out, arg = _window_max(jnp.where(valid, vals, low))
    return out, _pick_index(flat, arg, nd)


def _window_max(vals):
    """(max, position of the max) over the last axis, PyTorch's tie/NaN rules."""
    k = vals.shape[-1]
    arg = jnp.argmax(vals, axis=-1)
    if jnp.issubdtype(vals.dtype, jnp.floating):
        # PyTorch's kernels keep the last NaN in a window (`val > max || isnan(val)`)
        nan = jnp.isnan(vals)
        last_nan = k - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        arg = jnp.where(jnp.any(nan, axis=-1), last_nan, arg)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    return out, arg


def _pick_index(flat, arg, nd):
    table = jnp.asarray(flat)  # (*out, K)
    lead = arg.shape[: arg.ndim - nd]
    table = jnp.broadcast_to(table, lead + table.shape)
    return jnp.take_along_axis(table, arg[..., None], axis=-1)[..., 0]


def _scatter_to_input(grad, indices, input_shape, nd):
    """Accumulate ``grad`` at flat spatial ``indices`` into zeros of ``input_shape``."""
    lead = input_shape[: len(input_shape) - nd]
    b = math.prod(lead)
    size = math.prod(input_shape[len(lead) :])
    g = opmath(grad).reshape(b, grad.size // b if b else 0)
    idx = indices.reshape(g.shape)
    out = jnp.zeros((b, size), g.dtype).at[jnp.arange(b)[:, None], idx].add(g)
    return out.reshape(input_shape)


def _pool_params(nd, kernel_size, stride, padding, dilation):
    k = ntuple(kernel_size, nd)
    s = ntuple(stride, nd) if stride else k
    return k, s, ntuple(padding, nd), ntuple(dilation, nd)


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    k, s, p, d = _pool_params(nd, kernel_size, stride, padding, dilation)
    spatial = x.shape[x.ndim - nd :]
    per_dim = [_sliding(spatial[i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(nd)]
    return _max_windows(x, nd, *_windows(spatial, per_dim))


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_input(grad, indices, x.shape, 2)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_input(grad, indices, x.shape, 3)


def _fractional_starts(sample, in_size, out_size, k):
    """Window starts of PyTorch's fractional max pooling (generate_intervals)."""
    last = jnp.full(sample.shape + (1,), in_size - k, jnp.int64)
    if out_size == 1:
        return last
    dt = sample.dtype
    alpha = jnp.asarray(in_size - k, dt) / jnp.asarray(out_size - 1, dt)
    i = jnp.arange(out_size - 1, dtype=dt)
    u = sample[..., None]
    seq = ((i + u) * alpha).astype(jnp.int64) - (u * alpha).astype(jnp.int64)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(x, nd, kernel_size, output_size, samples):
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x[None]
    k, out = ntuple(kernel_size, nd), ntuple(output_size, nd)
    spatial = x.shape[2:]
    # PyTorch's kernels read the samples of (batch, plane) at that row: rows beyond the input's
    # batch and planes are never read (nn.FractionalMaxPool3d's samples stay (N, C, 3) for an
    # unbatched input)
    samples = samples[: x.shape[0], : x.shape[1]]
    # samples[..., 0] drives the last spatial dim (width), then height (, depth)
    order = list(range(nd))[::-1] if nd == 2 else list(range(nd))
    flat = jnp.zeros(x.shape[:2] + (1,) * (2 * nd), jnp.int64)
    stride = 1
    for i in reversed(range(nd)):
        starts = _fractional_starts(samples[..., order.index(i)], spatial[i], out[i], k[i])
        pos = starts[..., :, None] + jnp.arange(k[i])  # (N, C, out_i, k_i)
        shape = list(x.shape[:2]) + [1] * (2 * nd)
        shape[2 + i], shape[2 + nd + i] = out[i], k[i]
        flat = flat + pos.reshape(shape) * stride
        stride *= spatial[i]
    flat = jnp.broadcast_to(flat, x.shape[:2] + tuple(out) + tuple(k)).reshape(x.shape[:2] + tuple(out) + (-1,))
    src = x.reshape(x.shape[:2] + (math.prod(spatial),))
    vals = jnp.take_along_axis(src, flat.reshape(x.shape[:2] + (-1,)), axis=-1).reshape(flat.shape)
    value, arg = _window_max(vals)
    index = jnp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    return (value[0], index[0]) if unbatched else (value, index)


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, 2, kernel_size, output_size, random_samples)


@lower(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    # PyTorch's CPU and CUDA kernels make this check; its meta kernel does not
    torch._check(random_samples.dtype == x.dtype, lambda: "Expect _random_samples to have the same dtype as input")
    return _fractional_max_pool(x, 3, kernel_size, output_size, random_samples)


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad, indices, x.shape, 2)


@lower(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad, indices, x.shape, 3)


def _avg_divisor(size, k, s, p, out, count_include_pad):
    # at::native avg_pool: pool_size counts padding (clipped to the padded
    # extent); otherwise only the in-bounds elements count
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _ = _pool_params(nd, kernel_size, stride, padding, 1)
    spatial = x.shape[x.ndim - nd :]
    per_dim = [_sliding(spatial[i], k[i], s[i], p[i], 1, ceil_mode) for i in range(nd)]
    flat, valid = _windows(spatial, per_dim)
    vals = jnp.where(valid, _gather(opmath(x), nd, flat), 0)
    total = jnp.sum(vals, axis=-1)
    if divisor_override:
        return total / divisor_override
    div = np.ones((), np.int64)
    for i in range(nd):
        d = _avg_divisor(spatial[i], k[i], s[i], p[i], per_dim[i][0].shape[0], count_include_pad)
        div = np.multiply.outer(div, d)
    return total / jnp.asarray(div, total.dtype)


@lower(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _vjp_input(fn, x, grad):
    _, vjp = jax.vjp(fn, opmath(x))
    return vjp(opmath(grad))[0]


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(
        lambda v: avg_pool2d(v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        x, grad,
    )


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(
        lambda v: avg_pool3d(v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        x, grad,
    )


def _adaptive_windows(x, nd, output_size):
    spatial = x.shape[x.ndim - nd :]
    out = ntuple(output_size, nd)
    return _windows(spatial, [_adaptive(spatial[i], out[i]) for i in range(nd)])


def _adaptive_avg(x, nd, output_size):
    flat, valid = _adaptive_windows(x, nd, output_size)
    vals = jnp.where(valid, _gather(opmath(x), nd, flat), 0)
    count = jnp.asarray(valid.sum(-1), vals.dtype)
    if nd == 3 and x.dtype in HALF:
        # PyTorch's 3d kernel sums in the half dtype, rounding after every add
        rnd = round_to(x.dtype)
        total = lax.fori_loop(
            0, vals.shape[-1], lambda k, acc: rnd(acc + vals[..., k]), jnp.zeros(vals.shape[:-1], vals.dtype)
        )
        return rnd(total / count)
    return jnp.sum(vals, axis=-1) / count


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@lower(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, 3, output_size)


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _vjp_input(lambda v: _adaptive_avg(v, 2, grad.shape[-2:]), x, grad)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    return _vjp_input(lambda v: _adaptive_avg(v, 3, grad.shape[-3:]), x, grad)


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _max_windows(x, 2, *_adaptive_windows(x, 2, output_size))


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _max_windows(x, 3, *_adaptive_windows(x, 3, output_size))


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_input(grad, indices, x.shape, 2)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_input(grad, indices, x.shape, 3)


def _im2col(x, kernel_size, dilation, padding, stride):
    k, s, p, d = _pool_params(2, kernel_size, stride, padding, dilation)
    spatial = x.shape[-2:]
    per_dim = [_sliding(spatial[i], k[i], s[i], p[i], d[i], False) for i in range(2)]
    flat, valid = _windows(spatial, per_dim)
    vals = jnp.where(valid, _gather(x, 2, flat), 0)  # (..., C, oh, ow, kh*kw)
    lead = vals.shape[:-4]
    c, oh, ow, kk = vals.shape[-4:]
    vals = jnp.moveaxis(vals, -1, -3)  # (..., C, K, oh, ow)
    return vals.reshape(lead + (c * kk, oh * ow))


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    return _im2col(x, kernel_size, dilation, padding, stride)


@lower(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    k = ntuple(kernel_size, 2)
    lead = cols.shape[:-2]
    c = cols.shape[-2] // (k[0] * k[1])
    shape = lead + (c,) + tuple(ntuple(output_size, 2))
    # col2im is the adjoint of im2col
    _, vjp = jax.vjp(lambda v: _im2col(v, kernel_size, dilation, padding, stride), jnp.zeros(shape, opmath(cols).dtype))
    return vjp(opmath(cols))[0]
