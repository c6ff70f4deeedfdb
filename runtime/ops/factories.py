"""Fills, ranges and allocations: ``fill``, ``full``, ``arange``, ``tril_indices``/``triu_indices``, and the ``*_like``/``empty``
/``zeros`` factories compiled graphs hold.

Random fills and random factories are in ``random.py``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tpu_debug.runtime.ops._common import jdtype
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, dtype=x.dtype)


@lower(aten.zero.default)
def zero(x):
    return jnp.zeros(x.shape, x.dtype)


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.result_type(torch.tensor(fill_value), torch.tensor(0.0)) if isinstance(fill_value, float) else (
            torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int) else torch.get_default_dtype()
        )
    return jnp.full(tuple(size), fill_value, dtype=jdtype(dtype))


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, dtype=jdtype(dtype or torch.get_default_dtype()))


@lower(aten.arange.start_step, static_scalars=True)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        is_float = any(isinstance(v, float) for v in (start, end, step))
        dtype = torch.get_default_dtype() if is_float else torch.int64
    if dtype.is_floating_point:
        n = int(np.ceil((end - start) / step))
        return (start + jnp.arange(max(n, 0), dtype=jnp.float64) * step).astype(jdtype(dtype))
    # integer results: PyTorch accumulates in int64, so float bounds and step truncate toward zero
    xstart, xend, xstep = int(start), int(end), int(step)
    if dtype == torch.int64:  # its size is computed in integers too
        sgn = (xstep > 0) - (xstep < 0)
        num = xend - xstart + xstep - sgn
        n = abs(num) // abs(xstep) * (1 if (num >= 0) == (xstep > 0) else -1)  # C's truncating division
    else:
        n = int(np.ceil((end - start) / step))
    return (xstart + jnp.arange(max(n, 0), dtype=jnp.int64) * xstep).astype(jdtype(dtype))


# ---- factories as they appear in compiled graphs (eager mode has its own kernels
# for empty/empty_strided/_to_copy in runtime/device.py; these serve graphs) ------


def _dtype_of(x, dtype):
    return x.dtype if dtype is None else jdtype(dtype)


@lower(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, dtype=_dtype_of(x, dtype))


@lower(aten.empty_like.default, aten.zeros_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _dtype_of(x, dtype))


@lower(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _dtype_of(x, dtype))


@lower(aten.empty.memory_format, aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), jdtype(dtype or torch.get_default_dtype()))


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jdtype(dtype or torch.get_default_dtype()))


@lower(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jdtype(dtype or torch.get_default_dtype()))


@lower(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    # the values are unspecified; zeros, like every tpu allocation read before a write
    return jnp.zeros(tuple(size), jdtype(dtype or torch.get_default_dtype()))


@lower(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(jdtype(dtype))


@lower(aten.copy.default)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


@lower(aten.tril_indices.default, static_scalars=True)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    # the sizes are Python ints, so the indices are a constant of the program (PyTorch's
    # decomposition computes them in float64, which a TPU does not have)
    rows, cols = np.tril_indices(row, k=offset, m=col)
    return jnp.asarray(np.stack([rows, cols]), jdtype(dtype or torch.int64))


@lower(aten.triu_indices.default, static_scalars=True)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    rows, cols = np.triu_indices(row, k=offset, m=col)
    return jnp.asarray(np.stack([rows, cols]), jdtype(dtype or torch.int64))
