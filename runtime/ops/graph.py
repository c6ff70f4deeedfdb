"""Ops that appear in compiled graphs but rarely reach the eager dispatcher (issue 3).

AOTAutograd functionalizes a graph before lowering it: ``x.uniform_()`` becomes
``aten.uniform`` (out of place), ``normal_`` becomes ``normal_functional``,
``randn_like`` stays whole instead of decomposing through ``empty_like`` +
``normal_`` as it does eagerly. These lowerings give those forms the same
values and key handling as their in-place counterparts in ``factories.py`` and
``extra.py``; result dtypes come from the graph's fake values.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_debug.runtime.dtypes import to_jax_dtype as jdtype
from tpu_debug.runtime.ops.extra import cauchy_, geometric_, log_normal_
from tpu_debug.runtime.ops.factories import exponential_, normal_, uniform_
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


def _value(inplace):
    """The out-of-place form of an in-place random lowering (which returns (value, value))."""

    def functional(x, *args, key, **kwargs):
        return inplace(x, *args, key=key, **kwargs)[0]

    functional.__name__ = inplace.__name__.rstrip("_")
    return functional


lower(aten.uniform.default, rng=True)(_value(uniform_))
lower(aten.normal_functional.default, rng=True)(_value(normal_))
lower(aten.exponential.default, rng=True)(_value(exponential_))
lower(aten.cauchy.default, rng=True)(_value(cauchy_))
lower(aten.log_normal.default, rng=True)(_value(log_normal_))
lower(aten.geometric.default, rng=True)(_value(geometric_))


def _float(dtype):
    return jdtype(dtype) if dtype is not None and dtype.is_floating_point else jnp.float32


@lower(aten.randn_like.default, rng=True)
def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return jax.random.normal(key, x.shape, _float(dtype or _torch_dtype(x)))


@lower(aten.rand_like.default, rng=True)
def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return jax.random.uniform(key, x.shape, _float(dtype or _torch_dtype(x)))


@lower(aten.randn.default, rng=True)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.normal(key, tuple(size), _float(dtype or torch.get_default_dtype()))


@lower(aten.rand.default, rng=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.uniform(key, tuple(size), _float(dtype or torch.get_default_dtype()))


def _torch_dtype(x):
    from tpu_debug.runtime.dtypes import to_torch_dtype

    return to_torch_dtype(x.dtype)


# ---- the rest ------------------------------------------------------------------------------


@lower(aten._conj.default)
def _conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lower(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    # the values are unspecified; zeros, like every tpu allocation read before a write
    return jnp.zeros(tuple(size), jdtype(dtype or torch.get_default_dtype()))


@lower(aten.resize.default)
def resize(x, size, *, memory_format=None):
    """Functional ``resize_``: the first elements of ``x`` in the new shape, zeros beyond."""
    n = math.prod(size)
    flat = x.reshape(-1)[:n]
    if flat.shape[0] < n:
        flat = jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), x.dtype)])
    return flat.reshape(tuple(size))


@lower(aten._trilinear.default, graph_only=True)  # eagerly: PyTorch's composite (bmm rounding)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``bilinear``'s kernel: each input gains size-1 dims at its ``expand`` positions, the
    three are multiplied (broadcasting) and summed over ``sumdim``."""

    def expanded(x, dims):
        for d in sorted(dims):
            x = jnp.expand_dims(x, d)
        return x

    prod = expanded(i1, expand1) * expanded(i2, expand2) * expanded(i3, expand3)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod


@lower(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, atol=None, rtol=None, hermitian=False):
    """PyTorch's pseudo-inverse: singular values (eigenvalues' magnitudes if ``hermitian``)
    at or below max(atol, rtol * largest) count as zero; rtol defaults to eps * max(m, n)
    when atol is absent or zero."""
    m, n = a.shape[-2], a.shape[-1]
    real = jnp.finfo(a.dtype).dtype if jnp.iscomplexobj(a) else a.dtype
    atol_v = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    if rtol is None:
        eps_rtol = jnp.finfo(real).eps * max(m, n)
        rtol_v = jnp.where(atol_v > 0, jnp.zeros((), real), eps_rtol) if atol is not None else jnp.asarray(eps_rtol, real)
    else:
        rtol_v = jnp.asarray(rtol, real)
    if hermitian:
        w, v = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)  # PyTorch reads the lower triangle only
        big = jnp.max(jnp.abs(w), axis=-1, keepdims=True, initial=0.0)
        tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * big)
        inv = jnp.where(jnp.abs(w) > tol, 1.0 / jnp.where(w == 0, 1, w), 0).astype(a.dtype)
        return (v * inv[..., None, :]) @ jnp.conj(jnp.swapaxes(v, -1, -2))
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    big = jnp.max(s, axis=-1, keepdims=True, initial=0.0)
    tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * big)
    inv = jnp.where(s > tol, 1.0 / jnp.where(s == 0, 1, s), 0).astype(a.dtype)
    return jnp.conj(jnp.swapaxes(vh, -1, -2)) @ (inv[..., :, None] * jnp.conj(jnp.swapaxes(u, -1, -2)))


# ---- random ops dynamo keeps whole (eagerly they decompose into empty + an in-place fill) -----


def _ints(key, shape, low, high, dtype):
    out = jdtype(dtype) if dtype is not None else jnp.int64
    return jax.random.randint(key, tuple(shape), low, high, dtype=jnp.int64).astype(out)


@lower(aten.randint.default, rng=True)
def randint(high, size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _ints(key, size, 0, high, dtype or torch.int64)


@lower(aten.randint.low, rng=True)
def randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _ints(key, size, low, high, dtype or torch.int64)


@lower(aten.randint_like.default, rng=True)
def randint_like(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return _ints(key, x.shape, 0, high, dtype or _torch_dtype(x))


@lower(aten.randint_like.low_dtype, rng=True)
def randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
                     key):
    return _ints(key, x.shape, low, high, dtype or _torch_dtype(x))


def _normal(key, mean, std, shape):
    dtype = jnp.result_type(mean, std) if hasattr(mean, "dtype") or hasattr(std, "dtype") else jnp.float32
    dtype = dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32
    return mean + std * jax.random.normal(key, tuple(shape), dtype)


@lower(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return _normal(key, mean, std, mean.shape)


@lower(aten.normal.float_Tensor, rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return _normal(key, mean, std, std.shape)


@lower(aten.normal.Tensor_Tensor, rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    return _normal(key, mean, std, jnp.broadcast_shapes(mean.shape, std.shape))


@lower(aten.normal.float_float, rng=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                       key):
    return mean + std * jax.random.normal(key, tuple(size), _float(dtype or torch.get_default_dtype()))
