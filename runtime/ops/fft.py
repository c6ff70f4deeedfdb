"""Discrete Fourier transforms: aten's three primitives ``_fft_r2c``, ``_fft_c2r`` and
``_fft_c2c``, to which every ``torch.fft`` function decomposes.

Real inputs are promoted to a float dtype first, half types computing in float32
(PyTorch's ``opmath``); ``normalization`` is aten's ``fft_norm_mode``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from tpu_debug.runtime.ops._common import float_opmath
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _fft_scale(y, n, normalization):
    # aten fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n
    if normalization == 1:
        return y / jnp.sqrt(jnp.asarray(n, y.real.dtype))
    if normalization == 2:
        return y / jnp.asarray(n, y.real.dtype)
    return y


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    (x,) = float_opmath(x)
    n = math.prod(x.shape[d] for d in dim)
    y = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(x.astype(jnp.result_type(x, 1j)), axes=dim)
    return _fft_scale(y, n, normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")  # "forward": the inverse unscaled
    return _fft_scale(y, math.prod(sizes), normalization)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    if not dim:
        return x
    y = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _fft_scale(y, math.prod(x.shape[d] for d in dim), normalization)
