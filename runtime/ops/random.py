"""Random ops: in-place fills (``normal_``, ``uniform_``, ``bernoulli_``, ``cauchy_``, ...),
dropout, permutations and sampling, and the functional forms compiled graphs hold.

Every lowering here takes ``key=``, a fresh PRNG key the runtime draws from the
``tpu`` generator (``runtime/rng_state.py``) for each call, so random values are
never baked into an executable. An in-place fill returns its value twice: as
the op's result and as the new value of the tensor it writes
(``mutates_returns=True``).

AOTAutograd functionalizes a graph before it is lowered: ``x.uniform_()``
becomes ``aten.uniform`` (out of place), ``normal_`` becomes
``normal_functional``, and ``randn_like``/``randint``/``normal`` stay whole
instead of decomposing into an allocation and an in-place fill as they do
eagerly. Those forms reuse the in-place lowerings, so both modes draw the same
way; their result dtypes come from the graph's fake values.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_debug.runtime.dtypes import to_torch_dtype
from tpu_debug.runtime.ops._checks import OpArgumentError, Refusal, ValueCheck, require, scalar_type
from tpu_debug.runtime.ops._common import jdtype
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


# ---- in-place fills: the new value, returned twice ----------------------------------------


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _random_ints(key, shape, low, high, dtype):
    return jax.random.randint(key, shape, low, high, dtype=jnp.int64).astype(dtype)


@lower(aten.normal_.default, rng=True, mutates_returns=True)
def normal_(x, mean=0.0, std=1.0, *, generator=None, key):
    value = mean + std * jax.random.normal(key, x.shape, _float_dtype(x))
    return value, value


def _check_uniform(x, *args, **kwargs):
    lo = args[0] if args else kwargs.get("from", 0.0)
    hi = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
    require(lo <= hi, f"uniform_ expects to return a [from, to) range, but found from={lo:g} > to={hi:g}")


@lower(aten.uniform_.default, rng=True, mutates_returns=True, check=_check_uniform)
def uniform_(x, from_=0.0, to=1.0, *, generator=None, key, **kw):
    lo = kw.pop("from", from_)
    value = jax.random.uniform(key, x.shape, _float_dtype(x), minval=lo, maxval=to)
    return value, value


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


@lower(aten.exponential_.default, rng=True, mutates_returns=True)
def exponential_(x, lambd=1.0, *, generator=None, key):
    v = jax.random.exponential(key, x.shape, _float_dtype(x)) / lambd
    return v, v


@lower(aten.cauchy_.default, rng=True, mutates_returns=True)
def cauchy_(x, median=0.0, sigma=1.0, *, generator=None, key):
    v = median + sigma * jax.random.cauchy(key, x.shape, _float_dtype(x))
    return v, v


@lower(aten.log_normal_.default, rng=True, mutates_returns=True)
def log_normal_(x, mean=1.0, std=2.0, *, generator=None, key):
    v = jnp.exp(mean + std * jax.random.normal(key, x.shape, _float_dtype(x)))
    return v, v


@lower(aten.geometric_.default, rng=True, mutates_returns=True)
def geometric_(x, p, *, generator=None, key):
    u = jax.random.uniform(key, x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
    v = jnp.ceil(jnp.log(u) / math.log1p(-p)) if p < 1 else jnp.ones(x.shape, jnp.float32)
    return v, v


# ---- the fills' functional forms, as compiled graphs hold them ----------------------------


def _value(inplace):
    """The out-of-place form of an in-place random lowering (which returns (value, value))."""

    def functional(x, *args, key, **kwargs):
        return inplace(x, *args, key=key, **kwargs)[0]

    functional.__name__ = inplace.__name__.rstrip("_")
    return functional


lower(aten.uniform.default, rng=True, check=_check_uniform)(_value(uniform_))
lower(aten.normal_functional.default, rng=True)(_value(normal_))
lower(aten.exponential.default, rng=True)(_value(exponential_))
lower(aten.cauchy.default, rng=True)(_value(cauchy_))
lower(aten.log_normal.default, rng=True)(_value(log_normal_))
lower(aten.geometric.default, rng=True)(_value(geometric_))


# ---- sampling -----------------------------------------------------------------------------


@lower(aten.bernoulli.default, rng=True)
def bernoulli(x, *, generator=None, key):
    return jax.random.bernoulli(key, x, x.shape).astype(x.dtype)


@lower(aten.bernoulli.p, rng=True)
def bernoulli_p(x, p, *, generator=None, key):
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


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


def _check_multinomial(probs, num_samples, replacement=False, *, generator=None, out=None):
    """CPU's argument checks (``multinomial_out``); the distribution's values are a data check."""
    require(0 < probs.dim() <= 2, "prob_dist must be 1 or 2 dim")
    require(probs.is_floating_point(), "multinomial only supports floating-point dtypes for input, got: "
            f"{scalar_type(probs.dtype)}")
    if out is not None:
        require(out.dtype == torch.int64, f"multinomial expects Long tensor out, got: {scalar_type(out.dtype)}")
    require(num_samples > 0, "cannot sample n_sample <= 0 samples")
    require(replacement or num_samples <= probs.shape[-1],
            "cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    # float32 represents every integer up to 2^24 exactly, the categories CPU can tell apart
    require(probs.shape[-1] <= 1 << 24, "number of categories cannot exceed 2^24")


def _distribution(probs, num_samples, replacement=False, **_kwargs):
    # CPU checks a draw of one sample, or without replacement, on the whole tensor at once,
    # and a draw of several with replacement row by row, each entry before the row's sum
    return (probs,), (bool(replacement and num_samples > 1),)


def _test_distribution(xp, arrays, statics):
    rows = arrays[0].reshape(-1, arrays[0].shape[-1]) if arrays[0].ndim else arrays[0].reshape(1, 1)
    bad = ~xp.isfinite(rows) | (rows < 0)
    sums = xp.sum(rows, axis=1)
    (by_row,) = statics
    row_bad, row_empty = xp.any(bad, axis=1), sums <= 0
    if by_row:
        r = xp.argmax(row_bad | row_empty)  # the first row with a problem
        entry = rows[r, xp.argmax(bad[r])]
        # CPU tests ``p >= 0`` first (false for nan too), then finiteness
        code = xp.where(row_bad[r], xp.where(entry >= 0, 4, 3), xp.where(row_empty[r], 2, 0))
        return code, xp.where(row_bad[r], entry, sums[r])
    flat, sums_bad = bad.reshape(-1), xp.any(row_empty)
    entry = rows.reshape(-1)[xp.argmax(flat)]
    code = xp.where(xp.any(flat), 1, xp.where(sums_bad, 2, 0))
    return code, xp.where(xp.any(flat), entry, sums[xp.argmax(row_empty)])


_DISTRIBUTION_ERRORS = {
    1: "probability tensor contains either `inf`, `nan` or element < 0",
    2: "invalid multinomial distribution (sum of probabilities <= 0)",
    3: "invalid multinomial distribution (encountering probability entry < 0)",
    4: "invalid multinomial distribution (encountering probability entry = infinity or NaN)",
}


def _bad_distribution(code, value, statics):
    code = int(code)
    # entries are accepted in [0, inf), a row's sum above 0
    return Refusal(OpArgumentError(_DISTRIBUTION_ERRORS[code]), "self", 0, None, "sampled")


@lower(aten.multinomial.default, rng=True, check=_check_multinomial,
       values=ValueCheck(_distribution, _test_distribution, _bad_distribution))
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


# ---- factories dynamo keeps whole (eagerly: an allocation and an in-place fill) -----------


def _jax_float(dtype):
    """The JAX dtype of a float torch ``dtype``; float32 for None or a non-float one."""
    return jdtype(dtype) if dtype is not None and dtype.is_floating_point else jnp.float32


def _torch_dtype(x):
    return to_torch_dtype(x.dtype)


def _ints(key, shape, low, high, dtype):
    return _random_ints(key, tuple(shape), low, high, jdtype(dtype) if dtype is not None else jnp.int64)


@lower(aten.randn_like.default, rng=True)
def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return jax.random.normal(key, x.shape, _jax_float(dtype or _torch_dtype(x)))


@lower(aten.rand_like.default, rng=True)
def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return jax.random.uniform(key, x.shape, _jax_float(dtype or _torch_dtype(x)))


@lower(aten.randn.default, rng=True)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.normal(key, tuple(size), _jax_float(dtype or torch.get_default_dtype()))


@lower(aten.rand.default, rng=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.uniform(key, tuple(size), _jax_float(dtype or torch.get_default_dtype()))


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
    return mean + std * jax.random.normal(key, tuple(size), _jax_float(dtype or torch.get_default_dtype()))
