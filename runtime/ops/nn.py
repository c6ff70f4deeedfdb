"""Neural-network ops: convolution, pooling, normalization, losses, resampling.

Backward ops whose math is the exact adjoint of a forward lowering are written
as ``jax.vjp`` of that forward, so the two can never disagree. Where PyTorch's
backward is *not* the derivative of its forward (``binary_cross_entropy``
clamps its logs, max pooling routes through saved indices), the backward
follows PyTorch's kernel instead.

Windows (pooling, im2col) are gathered with index tables computed in NumPy at
trace time: one gather per op, exact window semantics (padding, dilation,
``ceil_mode``, adaptive bounds) spelled out in one place, ``_windows``.

Half-precision inputs compute in float32 (PyTorch's ``opmath``) and are cast
back to the dtype PyTorch's meta kernel gives. Where a PyTorch CPU kernel
rounds to the half dtype along the way (the weights of 1d/3d linear and bicubic
resampling, the running sum of 3d adaptive average pooling), the lowering
rounds at the same points, so bfloat16 results agree bit for bit.

Masked-off gradients of ``*_backward`` ops (``output_mask`` False) are zeros:
the eager interpreter has no undefined-tensor output, and autograd ignores
gradients it did not ask for.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.runtime.ops._common import promote
from tpu_debug.runtime.ops.linalg import matmul_precision, tpu_passes, tpu_product
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_NONE, _MEAN, _SUM = 0, 1, 2  # at::Reduction


def _opmath(x):
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _ntuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


# ---- convolution ------------------------------------------------------------------


def _conv_dims(nd):
    sp = "DHW"[3 - nd :] if nd <= 3 else None
    if sp is None:
        raise NotImplementedError(f"{nd}-d convolution is not supported on tpu (1d, 2d and 3d are)")
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    passes = tpu_passes(x, w)  # issue 8: TPU numerics, bfloat16 passes
    if passes:
        def exact(a, b):
            return _conv_exact(a, b, stride, padding, dilation, transposed, output_padding, groups)

        return tpu_product(exact, x, w, passes=passes)
    return _conv_exact(x, w, stride, padding, dilation, transposed, output_padding, groups)


def _conv_exact(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    stride, padding, dilation = _ntuple(stride, nd), _ntuple(padding, nd), _ntuple(dilation, nd)
    kw = {"precision": matmul_precision()} if jnp.issubdtype(x.dtype, jnp.floating) else {}
    if x.dtype in _HALF:
        kw["preferred_element_type"] = jnp.float32
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=_conv_dims(nd),
            feature_group_count=groups, **kw,
        )
    # a transposed convolution is the input-gradient of a convolution: dilate the
    # input by the stride, pad by d*(k-1)-p, and convolve with the flipped kernel
    # whose in/out channels are swapped within each group
    output_padding = _ntuple(output_padding, nd)
    cin, cout_g = w.shape[0], w.shape[1]
    ks = w.shape[2:]
    wt = w.reshape((groups, cin // groups, cout_g) + ks)
    wt = jnp.swapaxes(wt, 1, 2).reshape((groups * cout_g, cin // groups) + ks)
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + nd)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(ks, padding, dilation, output_padding)
    ]
    return lax.conv_general_dilated(
        x, wt, window_strides=(1,) * nd, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=_conv_dims(nd),
        feature_group_count=groups, **kw,
    )


@lower(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x = x[None]
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out[0] if unbatched else out


@lower(aten.convolution_backward.default)
def convolution_backward(
    grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def fwd(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(fwd, x, w)
    gx, gw = vjp(grad.astype(jnp.float32) if grad.dtype in _HALF else grad)
    gb = jnp.sum(_opmath(grad), axis=(0,) + tuple(range(2, grad.ndim)))
    # masked-off gradients are zeros, not None (see the module docstring)
    return (
        gx if output_mask[0] else jnp.zeros_like(x),
        gw if output_mask[1] else jnp.zeros_like(w),
        gb if output_mask[2] else jnp.zeros(tuple(bias_sizes or (w.shape[1 if transposed else 0],)), grad.dtype),
    )


# ---- windows (pooling, im2col) -------------------------------------------------------


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
    g = _opmath(grad).reshape(b, grad.size // b if b else 0)
    idx = indices.reshape(g.shape)
    out = jnp.zeros((b, size), g.dtype).at[jnp.arange(b)[:, None], idx].add(g)
    return out.reshape(input_shape)


def _pool_params(nd, kernel_size, stride, padding, dilation):
    k = _ntuple(kernel_size, nd)
    s = _ntuple(stride, nd) if stride else k
    return k, s, _ntuple(padding, nd), _ntuple(dilation, nd)


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
    k, out = _ntuple(kernel_size, nd), _ntuple(output_size, nd)
    spatial = x.shape[2:]
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
    vals = jnp.where(valid, _gather(_opmath(x), nd, flat), 0)
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
    _, vjp = jax.vjp(fn, _opmath(x))
    return vjp(_opmath(grad))[0]


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
    out = _ntuple(output_size, nd)
    return _windows(spatial, [_adaptive(spatial[i], out[i]) for i in range(nd)])


def _adaptive_avg(x, nd, output_size):
    flat, valid = _adaptive_windows(x, nd, output_size)
    vals = jnp.where(valid, _gather(_opmath(x), nd, flat), 0)
    count = jnp.asarray(valid.sum(-1), vals.dtype)
    if nd == 3 and x.dtype in _HALF:
        # PyTorch's 3d kernel sums in the half dtype, rounding after every add
        rnd = _rounder(x.dtype)
        total = lax.fori_loop(
            0, vals.shape[-1], lambda k, acc: rnd(acc + vals[..., k]), jnp.zeros(vals.shape[:-1], vals.dtype)
        )
        return rnd(total / count)
    return jnp.sum(vals, axis=-1) / count


def _rounder(dtype):
    """Round float32 values to ``dtype``'s precision (XLA keeps float32 inside
    fusions otherwise, and drops a reduce_precision applied to a half value)."""
    info = jnp.finfo(dtype)
    return lambda v: lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


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
    k = _ntuple(kernel_size, 2)
    lead = cols.shape[:-2]
    c = cols.shape[-2] // (k[0] * k[1])
    shape = lead + (c,) + tuple(_ntuple(output_size, 2))
    # col2im is the adjoint of im2col
    _, vjp = jax.vjp(lambda v: _im2col(v, kernel_size, dilation, padding, stride), jnp.zeros(shape, _opmath(cols).dtype))
    return vjp(_opmath(cols))[0]


# ---- normalization --------------------------------------------------------------------


def _normalize(x, axes, eps):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return (x - mean) * rstd, mean, rstd, var


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = y * _opmath(weight).reshape(shape)
    if bias is not None:
        y = y + _opmath(bias).reshape(shape)
    return y


def _layer_norm(x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    axes = tuple(range(x.ndim - n, x.ndim))
    y, mean, rstd, _ = _normalize(_opmath(x), axes, eps)
    return _affine(y, weight, bias, tuple(normalized_shape)), mean, rstd


@lower(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


def _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    # the saved mean/rstd are the statistics: x_hat = (x - mean) * rstd and the
    # usual closed form, as PyTorch's kernel computes it
    n = len(normalized_shape)
    axes = tuple(range(x.ndim - n, x.ndim))
    outer = tuple(range(x.ndim - n))
    x, grad = _opmath(x), _opmath(grad)
    mean, rstd = mean.astype(x.dtype), rstd.astype(x.dtype)
    x_hat = (x - mean) * rstd
    g = grad * _opmath(weight) if weight is not None else grad
    gx = rstd * (
        g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True)
    )
    shape = tuple(normalized_shape)
    gw = jnp.sum(grad * x_hat, axis=outer) if weight is not None else jnp.zeros(shape, x.dtype)
    gb = jnp.sum(grad, axis=outer) if bias is not None else jnp.zeros(shape, x.dtype)
    return (
        gx if output_mask[0] else jnp.zeros_like(x),
        gw if output_mask[1] else jnp.zeros_like(gw),
        gb if output_mask[2] else jnp.zeros_like(gb),
    )


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask)


def _masked(output_mask, *grads):
    return tuple(g if m else jnp.zeros_like(g) for m, g in zip(output_mask, grads))


def _channel_shape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    xf = _opmath(x).reshape(N, group, (C // group) * HxW)
    y, mean, rstd, _ = _normalize(xf, (2,), eps)
    y = _affine(y.reshape(x.shape), weight, bias, _channel_shape(x.ndim))
    return y, mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    shape = (N, group, C // group, HxW)
    xf, gf = _opmath(x).reshape(shape), _opmath(grad).reshape(shape)
    mean = mean.astype(xf.dtype).reshape(N, group, 1, 1)
    rstd = rstd.astype(xf.dtype).reshape(N, group, 1, 1)
    x_hat = (xf - mean) * rstd
    g = gf * _opmath(weight).reshape(1, group, C // group, 1) if weight is not None else gf
    axes = (2, 3)
    gx = rstd * (g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True))
    gw = jnp.sum(gf * x_hat, axis=(0, 3)).reshape(C)
    gb = jnp.sum(gf, axis=(0, 3)).reshape(C)
    return _masked(output_mask, gx.reshape(x.shape), gw, gb)


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_train(x, weight, bias, eps):
    xf = _opmath(x)
    axes = _bn_axes(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_channel_shape(x.ndim))), axis=axes)
    invstd = lax.rsqrt(var + eps)
    y = (xf - mean.reshape(_channel_shape(x.ndim))) * invstd.reshape(_channel_shape(x.ndim))
    return _affine(y, weight, bias, _channel_shape(x.ndim)), mean, invstd, var


def _bn_eval(x, weight, bias, running_mean, running_var, eps):
    xf = _opmath(x)
    shape = _channel_shape(x.ndim)
    rm = running_mean.astype(xf.dtype)
    invstd = lax.rsqrt(running_var.astype(xf.dtype) + eps)
    y = (xf - rm.reshape(shape)) * invstd.reshape(shape)
    return _affine(y, weight, bias, shape), rm, invstd


def _updated_stats(x, mean, var, running_mean, running_var, momentum):
    # PyTorch's running statistics use the unbiased batch variance
    n = x.size // x.shape[1]
    unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.nan
    rm = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    rv = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return rm, rv


def _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        y, mean, invstd, var = _bn_train(x, weight, bias, eps)
        if running_mean is None:
            return (y, mean, invstd), None
        return (y, mean, invstd), _updated_stats(x, mean, var, running_mean, running_var, momentum)
    y, mean, invstd = _bn_eval(x, weight, bias, running_mean, running_var, eps)
    return (y, mean, invstd), (running_mean, running_var)


@lower(aten._native_batch_norm_legit.default, mutates_returns=True)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return outs + stats


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _bn_train(x, weight, bias, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_eval(x, weight, bias, running_mean, running_var, eps)


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return outs + stats


def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update.default, mutates_returns=True)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    outs, stats = _bn_legit(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return outs + (_reserve(),) + stats


@lower(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    return batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps)


@lower(aten._batch_norm_no_update.default)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        return _bn_train(x, weight, bias, eps)[:3] + (_reserve(),)
    return _bn_eval(x, weight, bias, running_mean, running_var, eps) + (_reserve(),)


def _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    xf, gf = _opmath(x), _opmath(grad)
    shape = _channel_shape(x.ndim)
    axes = _bn_axes(x)
    if train:
        mean, invstd = save_mean.astype(xf.dtype), save_invstd.astype(xf.dtype)
    else:
        mean = running_mean.astype(xf.dtype)
        invstd = lax.rsqrt(running_var.astype(xf.dtype) + eps)
    x_hat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    w = _opmath(weight).reshape(shape) if weight is not None else 1
    if train:
        g = gf * w
        gx = invstd.reshape(shape) * (
            g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True)
        )
    else:
        gx = gf * w * invstd.reshape(shape)
    return _masked(output_mask, gx, jnp.sum(gf * x_hat, axis=axes), jnp.sum(gf, axis=axes))


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve):
    # ``save_var`` holds the saved inverse std (PyTorch's naming); ``update`` is
    # the training flag, and without running stats the batch stats were used
    train = update or running_mean is None
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask)


# ---- grid sampling ----------------------------------------------------------------------------


def _grid_unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _grid_reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _grid_source_index(coord, size, padding_mode, align_corners):
    """PyTorch's grid_sampler_compute_source_index: pixel coordinates after padding."""
    coord = _grid_unnormalize(coord, size, align_corners)
    if padding_mode == 1:  # border
        coord = jnp.clip(coord, 0, size - 1)
    elif padding_mode == 2:  # reflection
        if align_corners:
            coord = _grid_reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _grid_reflect(coord, -1, 2 * size - 1)
        coord = jnp.clip(coord, 0, size - 1)
    return coord


@lower(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Trilinear (mode 0) or nearest (mode 1) sampling of (N, C, D, H, W) at grid (N, D', H', W', 3)."""
    dtype = x.dtype
    x, grid = _opmath(x), _opmath(grid)
    _n, _c, d, h, w = x.shape
    ix = _grid_source_index(grid[..., 0], w, padding_mode, align_corners)
    iy = _grid_source_index(grid[..., 1], h, padding_mode, align_corners)
    iz = _grid_source_index(grid[..., 2], d, padding_mode, align_corners)

    def gather(vol, zi, yi, xi):
        inside = (zi >= 0) & (zi < d) & (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
        zc, yc, xc = (jnp.clip(i, 0, n - 1).astype(jnp.int32) for i, n in ((zi, d), (yi, h), (xi, w)))
        return jnp.where(inside[None], vol[:, zc, yc, xc], 0)

    if interpolation_mode == 1:  # nearest, ties to even as nearbyint does
        out = jax.vmap(lambda v, z, y, xx: gather(v, jnp.round(z), jnp.round(y), jnp.round(xx)))(x, iz, iy, ix)
        return out.astype(dtype)
    if interpolation_mode != 0:
        raise NotImplementedError("grid_sampler_3d: only bilinear and nearest interpolation exist in 3-D")
    x0, y0, z0 = jnp.floor(ix), jnp.floor(iy), jnp.floor(iz)

    def one(vol, ix, iy, iz, x0, y0, z0):
        # PyTorch's corner order (top/bottom, north/south, west/east) and weights
        wx = ((x0 + 1) - ix, ix - x0)
        wy = ((y0 + 1) - iy, iy - y0)
        wz = ((z0 + 1) - iz, iz - z0)
        out = 0
        for dz in (0, 1):
            for dy in (0, 1):
                for dx in (0, 1):
                    out = out + gather(vol, z0 + dz, y0 + dy, x0 + dx) * (wx[dx] * wy[dy] * wz[dz])[None]
        return out

    return jax.vmap(one)(x, ix, iy, iz, x0, y0, z0).astype(dtype)


# ---- rrelu ----------------------------------------------------------------------------------


@lower(aten.rrelu_with_noise.default, rng=True, mutates_returns=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key):
    """Training: a slope drawn from U(lower, upper) per non-positive element, recorded in
    ``noise`` (1 elsewhere); eval: leaky_relu with the mean slope, ``noise`` untouched."""
    if not training:
        return jnp.where(x > 0, x, x * ((lower + upper) / 2)).astype(x.dtype), noise
    wide = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    r = jax.random.uniform(key, x.shape, wide, minval=lower, maxval=upper)
    slope = jnp.where(x <= 0, r, 1).astype(x.dtype)
    return (x.astype(wide) * slope.astype(wide)).astype(x.dtype), slope.astype(noise.dtype)


@lower(aten.rrelu_with_noise_functional.default, rng=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key):
    return rrelu_with_noise(x, noise, lower, upper, training, generator, key=key)


@lower(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:
        return grad * noise
    slope = (lower + upper) / 2
    return jnp.where(x > 0, grad, grad * slope)


# ---- losses ------------------------------------------------------------------------------


def _nll(x, target, weight, ignore_index):
    """Per-element losses, per-element weights; class dim 1 (0 if unbatched)."""
    if x.ndim == 1:
        x, target = x[None], target[None]
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, 1), axis=1)[:, 0]
    w = jnp.take(weight, t) if weight is not None else jnp.ones(t.shape, x.dtype)
    w = jnp.where(valid, w.astype(x.dtype), 0)
    return -picked * w, w


def _nll_forward(x, target, weight, reduction, ignore_index):
    losses, w = _nll(_opmath(x), target, None if weight is None else _opmath(weight), ignore_index)
    if reduction == _NONE:
        return (losses if x.ndim > 1 else losses[0]), jnp.zeros((), losses.dtype)
    total = jnp.sum(w)
    out = jnp.sum(losses)
    return (out / total if reduction == _MEAN else out), total


def _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    unbatched = x.ndim == 1
    xf = _opmath(x)[None] if unbatched else _opmath(x)
    t = target[None] if unbatched else target
    valid = t != ignore_index
    tt = jnp.where(valid, t, 0)
    w = jnp.take(_opmath(weight), tt) if weight is not None else jnp.ones(tt.shape, xf.dtype)
    w = jnp.where(valid, w.astype(xf.dtype), 0)
    g = _opmath(grad)
    if reduction == _NONE:
        g = g[None] if unbatched else g
    elif reduction == _MEAN:
        g = g / total_weight.astype(xf.dtype)
    contrib = -w * g
    classes = lax.broadcasted_iota(tt.dtype, xf.shape, 1)
    out = jnp.where(classes == jnp.expand_dims(tt, 1), jnp.expand_dims(contrib, 1), 0).astype(xf.dtype)
    return out[0] if unbatched else out


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index)


@lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


def _pointwise_loss(fn):
    """A loss ``fn(x, y)`` elementwise, reduced; its backward by vjp."""

    def forward(x, y, reduction, *params):
        x, y = promote(x, y)
        return _reduce(fn(_opmath(x), _opmath(y), *params), reduction)

    def backward(grad, x, y, reduction, *params):
        _, vjp = jax.vjp(lambda v: forward(v, y, reduction, *params), _opmath(x))
        return vjp(_opmath(grad).reshape(jnp.shape(forward(x, y, reduction, *params))))[0]

    return forward, backward


def _smooth_l1(x, y, beta):
    d = jnp.abs(x - y)
    if beta == 0:
        return d
    return jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


def _huber(x, y, delta):
    d = jnp.abs(x - y)
    return jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


_mse_fwd, _mse_bwd = _pointwise_loss(lambda x, y: jnp.square(x - y))
_sl1_fwd, _sl1_bwd = _pointwise_loss(_smooth_l1)
_huber_fwd, _huber_bwd = _pointwise_loss(_huber)


@lower(aten.mse_loss.default)
def mse_loss(x, y, reduction=_MEAN):
    return _mse_fwd(x, y, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad, x, y, reduction):
    return _mse_bwd(grad, x, y, reduction)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, y, reduction=_MEAN, beta=1.0):
    return _sl1_fwd(x, y, reduction, beta)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad, x, y, reduction, beta):
    return _sl1_bwd(grad, x, y, reduction, beta)


@lower(aten.huber_loss.default)
def huber_loss(x, y, reduction=_MEAN, delta=1.0):
    return _huber_fwd(x, y, reduction, delta)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad, x, y, reduction, delta):
    return _huber_bwd(grad, x, y, reduction, delta)


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, y, weight=None, reduction=_MEAN):
    x, y = _opmath(x), _opmath(y)
    # PyTorch clamps each log at -100 so that 0 and 1 give finite losses
    loss = -(y * jnp.maximum(jnp.log(x), -100.0) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, y, weight=None, reduction=_MEAN):
    # PyTorch's kernel, not the derivative of the clamped forward
    x, y, g = _opmath(x), _opmath(y), _opmath(grad)
    out = g * (x - y) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        out = out * _opmath(weight)
    if reduction == _MEAN:
        out = out / x.size
    return jnp.broadcast_to(out, x.shape)


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, y, weight=None, pos_weight=None, reduction=_MEAN):
    x, y = _opmath(x), _opmath(y)
    log_sig = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        loss = (1 - y) * x - ((_opmath(pos_weight) - 1) * y + 1) * log_sig
    else:
        loss = (1 - y) * x - log_sig
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


# ---- resampling -------------------------------------------------------------------------


def _scale(in_size, out_size, scale, dtype):
    # at::native compute_scales_value
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(in_size) / dtype(out_size)


def _nearest_index(in_size, out_size, scale, exact):
    if out_size == in_size:
        return np.arange(out_size)
    if out_size == 2 * in_size and not exact:
        return np.arange(out_size) >> 1
    s = _scale(in_size, out_size, scale, np.float32)
    dst = np.arange(out_size, dtype=np.float32)
    src = np.floor(((dst + np.float32(0.5)) if exact else dst) * s).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _upsample_nearest(x, output_size, scales, exact):
    nd = len(output_size)
    for i in range(nd):
        axis = x.ndim - nd + i
        idx = _nearest_index(x.shape[axis], output_size[i], scales[i] if scales else None, exact)
        x = jnp.take(x, idx, axis=axis)
    return x


def _linear_taps(in_size, out_size, align_corners, scale, dtype):
    """(index0, index1, lambda0, lambda1) of PyTorch's linear interpolation."""
    if out_size == in_size:
        idx = np.arange(out_size)
        return idx, idx, np.ones(out_size, dtype), np.zeros(out_size, dtype)
    if align_corners:
        ratio = dtype(in_size - 1) / dtype(out_size - 1) if out_size > 1 else dtype(0)
    else:
        ratio = _scale(in_size, out_size, scale, dtype)
    dst = np.arange(out_size).astype(dtype)
    if align_corners:
        src = ratio * dst
    else:
        src = np.maximum(ratio * (dst + dtype(0.5)) - dtype(0.5), dtype(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam1 = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    i1 = i0 + (i0 < in_size - 1)
    return i0, i1, (dtype(1) - lam1).astype(dtype), lam1


def _half_round(values, dtype):
    # NumPy (ml_dtypes) rounding, at trace time: these are constants
    return np.asarray(values, np.float32).astype(np.dtype(dtype)).astype(np.float32)


def _upsample_linear(x, output_size, align_corners, scales):
    xf = _opmath(x)
    dtype = np.float64 if xf.dtype == jnp.float64 else np.float32
    nd = len(output_size)
    # innermost dim first (width, then height, then depth): PyTorch's order of sums
    for i in reversed(range(nd)):
        axis = xf.ndim - nd + i
        i0, i1, l0, l1 = _linear_taps(xf.shape[axis], output_size[i], align_corners, scales[i] if scales else None, dtype)
        if x.dtype in _HALF and nd != 2:
            # PyTorch's 1d/3d kernels keep the weights in the half dtype (lambda1
            # rounded, lambda0 = 1 - lambda1); its 2d kernel keeps them in float32
            l1 = _half_round(l1, x.dtype)
            l0 = _half_round(1 - l1, x.dtype)
        shape = [1] * xf.ndim
        shape[axis] = -1
        xf = (
            jnp.take(xf, i0, axis=axis) * jnp.asarray(l0, xf.dtype).reshape(shape)
            + jnp.take(xf, i1, axis=axis) * jnp.asarray(l1, xf.dtype).reshape(shape)
        )
    return xf


def _input_grad(fwd, grad, input_size):
    _, vjp = jax.vjp(fwd, jnp.zeros(tuple(input_size), _opmath(grad).dtype))
    return vjp(_opmath(grad))[0]


def _nearest_pair(nd, exact):
    def forward(x, output_size, *scales):
        return _upsample_nearest(x, tuple(output_size), scales, exact)

    def backward(grad, output_size, input_size, *scales):
        return _input_grad(lambda v: forward(v, output_size, *scales), grad, input_size)

    return forward, backward


def _linear_pair(nd):
    def forward(x, output_size, align_corners, *scales):
        return _upsample_linear(x, tuple(output_size), align_corners, scales)

    def backward(grad, output_size, input_size, align_corners, *scales):
        return _input_grad(lambda v: forward(v, output_size, align_corners, *scales), grad, input_size)

    return forward, backward


for _nd, _name in ((1, "1d"), (2, "2d"), (3, "3d")):
    for _exact, _prefix in ((False, "upsample_nearest"), (True, "_upsample_nearest_exact")):
        _fwd, _bwd = _nearest_pair(_nd, _exact)
        _fwd.__name__, _bwd.__name__ = f"{_prefix}{_name}", f"{_prefix}{_name}_backward"
        lower(getattr(aten, _prefix + _name).default)(_fwd)
        lower(getattr(aten, _prefix + _name + "_backward").default)(_bwd)
    _linear = {1: "upsample_linear1d", 2: "upsample_bilinear2d", 3: "upsample_trilinear3d"}[_nd]
    _fwd, _bwd = _linear_pair(_nd)
    _fwd.__name__, _bwd.__name__ = _linear, _linear + "_backward"
    lower(getattr(aten, _linear).default)(_fwd)
    lower(getattr(aten, _linear + "_backward").default)(_bwd)


def _cubic_taps(in_size, out_size, align_corners, scale):
    """(indices (out, 4), weights (out, 4)) of PyTorch's bicubic (A = -0.75)."""
    a = np.float32(-0.75)
    if align_corners:
        ratio = np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0)
    else:
        ratio = _scale(in_size, out_size, scale, np.float32)
    dst = np.arange(out_size).astype(np.float32)
    src = ratio * dst if align_corners else ratio * (dst + np.float32(0.5)) - np.float32(0.5)
    base = np.floor(src).astype(np.int64)
    t = (src - base.astype(np.float32)).astype(np.float32)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1).astype(np.float32)
    index = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return index, weights


def _upsample_bicubic(x, output_size, align_corners, scales):
    if tuple(x.shape[-2:]) == tuple(output_size):
        return _opmath(x)
    xf = _opmath(x)
    # along the width first, then the height: PyTorch's order of the sums
    for axis, i in ((xf.ndim - 1, 1), (xf.ndim - 2, 0)):
        index, weights = _cubic_taps(xf.shape[axis], output_size[i], align_corners, scales[i] if scales else None)
        taps = jnp.take(xf, index.reshape(-1), axis=axis)
        taps = taps.reshape(xf.shape[:axis] + index.shape + xf.shape[axis + 1 :])
        shape = [1] * taps.ndim
        shape[axis], shape[axis + 1] = weights.shape
        if x.dtype in _HALF:  # PyTorch keeps the weights in the half dtype
            weights = _half_round(weights, x.dtype)
        xf = jnp.sum(taps * jnp.asarray(weights, xf.dtype).reshape(shape), axis=axis + 1)
    return xf


@lower(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bicubic(x, tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _input_grad(
        lambda v: _upsample_bicubic(v, tuple(output_size), align_corners, (scales_h, scales_w)), grad, input_size
    )


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
    w = _opmath(weight)
    rows = jnp.take(w, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * _opmath(per_sample_weights)[:, None]
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
    g = _opmath(grad)
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
        rows = rows * _opmath(per_sample_weights)[:, None]
    keep = valid & in_range
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), g.dtype).at[indices].add(keep.astype(g.dtype))
        rows = rows / jnp.maximum(jnp.take(freq, indices), 1)[:, None]
    return out.at[indices].add(jnp.where(keep[:, None], rows, 0))


def _require_dense(sparse):
    if sparse:
        raise NotImplementedError(
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
    g = jnp.take(_opmath(grad), jnp.clip(seg, 0, num_bags - 1), axis=0)
    out = jnp.sum(g * jnp.take(_opmath(weight), indices, axis=0), axis=-1)
    return jnp.where(valid, out, 0)


# ---- CTC loss ---------------------------------------------------------------------------------


def _logaddexp(a, b):
    """log(exp(a) + exp(b)) whose gradient stays finite where both are -inf (unreachable
    alignment cells): jnp.logaddexp's is NaN there, and NaN would reach log_probs."""
    m = jnp.maximum(a, b)
    dead = jnp.isneginf(m)
    m0 = jnp.where(dead, 0.0, lax.stop_gradient(m)).astype(m.dtype)
    a0, b0 = jnp.where(dead, 0.0, a).astype(a.dtype), jnp.where(dead, 0.0, b).astype(b.dtype)
    out = m0 + jnp.log(jnp.exp(a0 - m0) + jnp.exp(b0 - m0))
    return jnp.where(dead, jnp.asarray(-jnp.inf, m.dtype), out)


def _ctc_nll(log_probs, targets, input_lengths, target_lengths, blank):
    """CTC's negative log likelihood per batch element and its log_alpha table, by the
    forward recursion over the extended label sequence (blank, l1, blank, l2, ..., blank).
    Lengths are static (the IntList overload); targets are (N, S) padded or 1-D concatenated."""
    lp = jnp.swapaxes(log_probs, 0, 1)  # (N, T, C)
    n, t_max, _ = lp.shape
    il = np.asarray(input_lengths, np.int64).reshape(n)
    tl = np.asarray(target_lengths, np.int64).reshape(n)
    s_max = int(tl.max()) if n else 0
    width = 2 * s_max + 1
    pos = np.arange(s_max)[None, :]
    valid = pos < tl[:, None]
    if targets.ndim == 1:
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        index = np.where(valid, starts[:, None] + pos, 0)
        labels = jnp.where(valid, targets[index] if targets.shape[0] else 0, blank)
    else:
        labels = jnp.where(valid, targets[:, :s_max], blank)
    ext = jnp.full((n, width), blank, labels.dtype).at[:, 1::2].set(labels)
    skip = jnp.zeros((n, width), bool)
    if width > 2:
        skip = skip.at[:, 2:].set((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]))
    in_seq = np.arange(width)[None, :] < (2 * tl + 1)[:, None]
    lp_ext = jnp.take_along_axis(lp, jnp.broadcast_to(ext[:, None, :], (n, t_max, width)), axis=2)
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    first = jnp.full((n, width), neg).at[:, 0].set(lp_ext[:, 0, 0])
    if width > 1:
        first = first.at[:, 1].set(jnp.where(tl > 0, lp_ext[:, 0, 1], neg))
    first = jnp.where(in_seq & (il > 0)[:, None], first, neg)

    def step(alpha, t):
        one = jnp.concatenate([jnp.full((n, 1), neg), alpha[:, :-1]], axis=1)
        two = jnp.concatenate([jnp.full((n, 2), neg), alpha[:, :-2]], axis=1)[:, :width]
        new = _logaddexp(_logaddexp(alpha, one), jnp.where(skip, two, neg)) + lp_ext[:, t, :]
        new = jnp.where(in_seq, new, neg)
        active = (t < il)[:, None]
        return jnp.where(active, new, alpha), jnp.where(active, new, neg)

    last, rest = lax.scan(step, first, jnp.arange(1, t_max)) if t_max > 1 else (first, first[None, :0])
    log_alpha = jnp.concatenate([first[:, None, :], jnp.swapaxes(rest, 0, 1)], axis=1)
    end = jnp.take_along_axis(last, jnp.asarray(2 * tl)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(last, jnp.asarray(np.maximum(2 * tl - 1, 0))[:, None], axis=1)[:, 0]
    ll = _logaddexp(end, jnp.where(tl > 0, before, neg))
    return -ll, log_alpha


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    nll, log_alpha = _ctc_nll(log_probs, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), jnp.zeros((), nll.dtype), nll)
    return nll, log_alpha


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    """PyTorch's CTC gradient: d nll / d log_probs (here by differentiating the forward
    recursion; CPU uses a beta pass) plus exp(log_probs) on every frame inside the input
    length. PyTorch's kernel assumes log_probs come from log_softmax and returns the
    gradient its backward then maps correctly (the added term sums to zero through it).
    An infinite loss gets a zero gradient under ``zero_infinity``, as on CPU."""
    def nll_of(lp):
        return _ctc_nll(lp, targets, input_lengths, target_lengths, blank)[0]

    nll, vjp = jax.vjp(nll_of, log_probs)
    (g,) = vjp(grad)
    t_max, n = log_probs.shape[0], log_probs.shape[1]
    inside = np.arange(t_max)[:, None] < np.asarray(input_lengths, np.int64).reshape(n)[None, :]
    g = g + jnp.where(inside[:, :, None], jnp.exp(log_probs) * grad[None, :, None], jnp.zeros((), g.dtype))
    finite = ~jnp.isinf(nll)
    if zero_infinity:
        g = jnp.where(finite[None, :, None], g, jnp.zeros((), g.dtype))
    return g
