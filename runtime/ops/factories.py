"""Fills, ranges and random ops."""

from __future__ import annotations

import jax
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


# ---- random: each takes a fresh key; values are never baked into the program ------


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


@lower(aten.normal_.default, rng=True, mutates_returns=True)
def normal_(x, mean=0.0, std=1.0, *, generator=None, key):
    value = mean + std * jax.random.normal(key, x.shape, _float_dtype(x))
    return value, value


@lower(aten.uniform_.default, rng=True, mutates_returns=True)
def uniform_(x, from_=0.0, to=1.0, *, generator=None, key, **kw):
    lo = kw.pop("from", from_)
    value = jax.random.uniform(key, x.shape, _float_dtype(x), minval=lo, maxval=to)
    return value, value


def _random_ints(key, shape, low, high, dtype):
    return jax.random.randint(key, shape, low, high, dtype=jnp.int64).astype(dtype)


@lower(getattr(aten.random_, "from"), rng=True, mutates_returns=True)
def random_from(x, from_, to, *, generator=None, key):
    high = to if to is not None else 2**63 - 1
    v = _random_ints(key, x.shape, from_, high, x.dtype)
    return v, v


@lower(aten.random_.to, rng=True, mutates_returns=True)
def random_to(x, to, *, generator=None, key):
    v = _random_ints(key, x.shape, 0, to, x.dtype)
    return v, v


@lower(aten.random_.default, rng=True, mutates_returns=True)
def random_default(x, *, generator=None, key):
    if x.dtype == jnp.bool_:
        high = 2
    elif jnp.issubdtype(x.dtype, jnp.floating):
        high = 2 ** jnp.finfo(x.dtype).nmant + 1
    else:
        high = int(jnp.iinfo(x.dtype).max) + 1 if x.dtype != jnp.int64 else 2**63 - 1
    v = _random_ints(key, x.shape, 0, high, x.dtype)
    return v, v


@lower(aten.bernoulli_.float, rng=True, mutates_returns=True)
def bernoulli_float(x, p=0.5, *, generator=None, key):
    v = jax.random.bernoulli(key, p, x.shape).astype(x.dtype)
    return v, v


@lower(aten.bernoulli_.Tensor, rng=True, mutates_returns=True)
def bernoulli_tensor(x, p, *, generator=None, key):
    v = jax.random.bernoulli(key, p, x.shape).astype(x.dtype)
    return v, v


@lower(aten.bernoulli.default, rng=True)
def bernoulli(x, *, generator=None, key):
    return jax.random.bernoulli(key, x, x.shape).astype(x.dtype)


@lower(aten.bernoulli.p, rng=True)
def bernoulli_p(x, p, *, generator=None, key):
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


@lower(aten.exponential_.default, rng=True, mutates_returns=True)
def exponential_(x, lambd=1.0, *, generator=None, key):
    v = jax.random.exponential(key, x.shape, _float_dtype(x)) / lambd
    return v, v


@lower(aten.native_dropout.default, rng=True)
def native_dropout(x, p, train, *, key):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)), keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


@lower(aten.randperm.default, rng=True)
def randperm(n, *, dtype=torch.int64, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n).astype(jdtype(dtype or torch.int64))


@lower(aten.multinomial.default, rng=True)
def multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    logits = jnp.log(probs.astype(jnp.float32))
    if replacement:
        shape = probs.shape[:-1] + (num_samples,)
        keys = jax.random.split(key, 1)[0]
        return jax.random.categorical(keys, logits[..., None, :], axis=-1, shape=shape).astype(jnp.int64)
    # Gumbel top-k: sampling without replacement
    g = jax.random.gumbel(key, probs.shape, jnp.float32)
    return jax.lax.top_k(logits + g, num_samples)[1].astype(jnp.int64)


@lower(aten.randperm.generator_out, rng=True)
def randperm_out(n, *, generator=None, out, key):
    return jax.random.permutation(key, n).astype(out.dtype)


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


@lower(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(jdtype(dtype))


@lower(aten.copy.default)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)
