"""Resampling: ``interpolate``'s nearest, linear (1-d to 3-d) and bicubic upsampling, its
antialiased bilinear and bicubic resizing, and 3-d grid sampling, with their backward ops.

Source indices and interpolation weights depend only on shapes, so they are
computed in NumPy at trace time, the way PyTorch's CPU kernels compute them.
Where those kernels keep the weights in a half dtype (1-d/3-d linear and
bicubic), the lowering rounds them the same way, so bfloat16 results agree bit
for bit. Backward ops are ``jax.vjp`` of the forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._common import HALF, opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


# ---- upsampling ---------------------------------------------------------------------------


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
    xf = opmath(x)
    dtype = np.float64 if xf.dtype == jnp.float64 else np.float32
    nd = len(output_size)
    # innermost dim first (width, then height, then depth): PyTorch's order of sums
    for i in reversed(range(nd)):
        axis = xf.ndim - nd + i
        i0, i1, l0, l1 = _linear_taps(xf.shape[axis], output_size[i], align_corners, scales[i] if scales else None, dtype)
        if x.dtype in HALF and nd != 2:
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
    _, vjp = jax.vjp(fwd, jnp.zeros(tuple(input_size), opmath(grad).dtype))
    return vjp(opmath(grad))[0]


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
        return opmath(x)
    xf = opmath(x)
    # along the width first, then the height: PyTorch's order of the sums
    for axis, i in ((xf.ndim - 1, 1), (xf.ndim - 2, 0)):
        index, weights = _cubic_taps(xf.shape[axis], output_size[i], align_corners, scales[i] if scales else None)
        taps = jnp.take(xf, index.reshape(-1), axis=axis)
        taps = taps.reshape(xf.shape[:axis] + index.shape + xf.shape[axis + 1 :])
        shape = [1] * taps.ndim
        shape[axis], shape[axis + 1] = weights.shape
        if x.dtype in HALF:  # PyTorch keeps the weights in the half dtype
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


# ---- antialiased resizing (interpolate(..., antialias=True)) ------------------------------


def _aa_bilinear(x):  # a triangle: linear interpolation, widened when downsampling
    return np.maximum(np.float32(1) - np.abs(x), np.float32(0))


def _aa_bicubic(x):  # Keys' cubic with A = -0.5, as Pillow (the plain bicubic mode uses -0.75)
    a = np.float32(-0.5)
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, np.float32(0))).astype(np.float32)


_AA_FILTERS = {"bilinear": (_aa_bilinear, 2), "bicubic": (_aa_bicubic, 4)}


def _aa_taps(in_size, out_size, align_corners, scale, mode):
    """(indices (out, K), weights (out, K)) of PyTorch's antialiased resize along one axis
    (Pillow's method): the filter spans ``scale`` input pixels per output pixel when
    downsampling, its taps normalized to sum to one. float32, as the CPU kernel computes
    them for a float32 input."""
    f32 = np.float32
    filter_fn, interp_size = _AA_FILTERS[mode]
    if align_corners:
        ratio = f32(in_size - 1) / f32(out_size - 1) if out_size > 1 else f32(0)
    else:
        ratio = _scale(in_size, out_size, scale, f32)
    support = f32(interp_size * 0.5) * ratio if ratio >= 1 else f32(interp_size * 0.5)
    taps = int(np.ceil(support)) * 2 + 1
    invscale = f32(1) / ratio if ratio >= 1 else f32(1)
    index = np.zeros((out_size, taps), np.int64)
    weights = np.zeros((out_size, taps), np.float32)
    for i in range(out_size):
        center = ratio * f32(i + 0.5)
        lo = max(int(center - support + f32(0.5)), 0)  # C's truncation toward zero
        size = min(max(min(int(center + support + f32(0.5)), in_size) - lo, 0), taps)
        w = filter_fn((np.arange(size, dtype=f32) + f32(lo) - center + f32(0.5)) * invscale)
        total = w.sum(dtype=f32)
        weights[i, :size] = w / total if total != 0 else w
        index[i, :size] = lo + np.arange(size)
    return index, weights


def _upsample_aa(x, output_size, align_corners, scales, mode):
    xf = opmath(x)
    # along the width first, then the height: PyTorch's order of the sums
    for axis, i in ((xf.ndim - 1, 1), (xf.ndim - 2, 0)):
        index, weights = _aa_taps(xf.shape[axis], output_size[i], align_corners, scales[i] if scales else None, mode)
        taps = jnp.take(xf, index.reshape(-1), axis=axis)
        taps = taps.reshape(xf.shape[:axis] + index.shape + xf.shape[axis + 1 :])
        shape = [1] * taps.ndim
        shape[axis], shape[axis + 1] = weights.shape
        xf = jnp.sum(taps * jnp.asarray(weights, xf.dtype).reshape(shape), axis=axis + 1)
    return xf


def _aa_pair(mode):
    def forward(x, output_size, align_corners, scales_h=None, scales_w=None):
        return _upsample_aa(x, tuple(output_size), align_corners, (scales_h, scales_w), mode)

    def backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        return _input_grad(lambda v: forward(v, output_size, align_corners, scales_h, scales_w), grad, input_size)

    return forward, backward


for _mode in _AA_FILTERS:
    _fwd, _bwd = _aa_pair(_mode)
    _fwd.__name__, _bwd.__name__ = f"_upsample_{_mode}2d_aa", f"_upsample_{_mode}2d_aa_backward"
    lower(getattr(aten, f"_upsample_{_mode}2d_aa").default)(_fwd)
    lower(getattr(aten, f"_upsample_{_mode}2d_aa_backward").default)(_bwd)


# ---- grid sampling ------------------------------------------------------------------------


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
    x, grid = opmath(x), opmath(grid)
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
        raise NoLoweringError(
            f"grid_sampler_3d has no tpu lowering for interpolation_mode={interpolation_mode}; "
            "use bilinear (0) or nearest (1), the 3-D modes"
        )
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
