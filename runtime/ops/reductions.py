"""Reductions, scans, sorting, softmax, segment reductions and tensor hashing.

PyTorch's reduction rules, held here so every lowering agrees:

- ``dim=None`` (and, for most ops, ``dim=[]``) reduces every dimension;
  ``any``/``all`` with ``dim=[]`` reduce nothing.
- integer and bool inputs sum/prod/cumsum to int64 unless ``dtype=`` says
  otherwise; ``dtype=`` casts the input before reducing.
- float16/bfloat16 accumulate in float32 and round once at the end, as
  PyTorch's CPU kernels do; where PyTorch composes an op from several tensor
  ops (logsumexp) or its kernel stores intermediates in the input dtype
  (softmax), the lowering rounds at the same points.
- max/min/amax/amin and their indices propagate NaN (the first NaN wins an
  arg-reduction); sort/topk/kthvalue order NaN above +inf.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from tpu_debug.core.errors import NoLoweringError
from tpu_debug.runtime.ops._checks import OpIndexError, cpp_type, require, scalar_type
from tpu_debug.runtime.ops._common import HALF, canonical_dim, canonical_dims, jdtype, promote
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten


# ---- helpers -------------------------------------------------------------------


def _axes(dim, ndim: int, *, empty_means_all: bool = True) -> tuple[int, ...]:
    """Canonical reduction axes; None (or [] where PyTorch says so) is every axis."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim)) if empty_means_all else ()
    return canonical_dims(dim, ndim)


def _is_float(dt) -> bool:
    return jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.complexfloating)


def _acc(dt):
    """The accumulation dtype PyTorch's CPU kernels use for ``dt``."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dt) in HALF else jnp.dtype(dt)


def _round_to(v, dt):
    """Round float32 ``v`` to reduced dtype ``dt`` and back (PyTorch's per-op rounding)."""
    return v.astype(dt).astype(v.dtype) if jnp.dtype(dt) in HALF else v


def _sum_dtype(x, dtype):
    """Result dtype of sum/prod/cumsum: ``dtype=``, else int64 for integers and bool."""
    if dtype is not None:
        return jnp.dtype(jdtype(dtype))
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.dtype(jnp.int64)
    return x.dtype


def _float_result(x, dtype=None):
    """Result dtype of an op that is float-only (mean, var, norm, softmax)."""
    if dtype is not None:
        return jnp.dtype(jdtype(dtype))
    if _is_float(x.dtype):
        return x.dtype
    return jnp.dtype(jdtype(torch.get_default_dtype()))


def _count(shape, axes) -> int:
    return math.prod(shape[a] for a in axes)


def _nan_key(x):
    """Keys that order NaN above everything and -0.0 equal to 0.0 (PyTorch's order)."""
    if not _is_float(x.dtype):
        if x.dtype == jnp.bool_:
            return (x.astype(jnp.uint8),)
        return (x,)
    nan = jnp.isnan(x)
    value = jnp.where(nan | (x == 0), jnp.zeros((), x.dtype), x)
    return (nan, value)


def _sort_ascending(x, axis: int):
    """Stable ascending sort along ``axis``, NaN last: (values, int64 indices)."""
    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    keys = _nan_key(x)
    out = lax.sort((*keys, x, iota), dimension=axis, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


def _sort(x, axis: int, descending: bool):
    """Stable sort along ``axis`` (ties keep input order in both directions)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    if not descending:
        return _sort_ascending(x, axis)
    n = x.shape[axis]
    values, idx = _sort_ascending(jnp.flip(x, axis), axis)
    return jnp.flip(values, axis), jnp.flip(n - 1 - idx, axis)


def _arg_extreme(x, axis, *, largest: bool):
    """First index of the max (min) along ``axis``, a NaN counting as the extreme."""
    if _is_float(x.dtype):
        nan = jnp.isnan(x)
        filled = jnp.where(nan, jnp.asarray(-jnp.inf if largest else jnp.inf, x.dtype), x)
        best = jnp.argmax(filled, axis) if largest else jnp.argmin(filled, axis)
        any_nan = jnp.any(nan, axis)
        return jnp.where(any_nan, jnp.argmax(nan, axis), best).astype(jnp.int64)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    return (jnp.argmax(x, axis) if largest else jnp.argmin(x, axis)).astype(jnp.int64)


def _extreme(x, axes, keepdims, *, largest: bool):
    """max/min over ``axes`` with NaN propagating."""
    if not axes and x.ndim:
        return x
    if x.dtype == jnp.bool_:
        return jnp.any(x, axes, keepdims=keepdims) if largest else jnp.all(x, axes, keepdims=keepdims)
    r = jnp.max(x, axes, keepdims=keepdims) if largest else jnp.min(x, axes, keepdims=keepdims)
    if _is_float(x.dtype):
        nan = jnp.any(jnp.isnan(x), axes, keepdims=keepdims)
        r = jnp.where(nan, jnp.asarray(jnp.nan, x.dtype), r)
    return r


# ---- sum, mean, prod ------------------------------------------------------------


def _sum(x, axes, keepdim, out_dtype):
    x = x.astype(out_dtype) if x.dtype != out_dtype else x
    acc = _acc(out_dtype)
    return jnp.sum(x, axes, dtype=acc, keepdims=keepdim).astype(out_dtype)


@lower(aten.sum.default)
def sum_(x, *, dtype=None):
    return _sum(x, tuple(range(x.ndim)), False, _sum_dtype(x, dtype))


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return _sum(x, _axes(dim, x.ndim), keepdim, _sum_dtype(x, dtype))


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = _sum_dtype(x, dtype)
    if _is_float(x.dtype):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return _sum(x, _axes(dim, x.ndim), keepdim, out_dtype)


def _mean(x, axes, keepdim, out_dtype):
    acc = _acc(out_dtype)
    total = jnp.sum(x.astype(acc), axes, keepdims=keepdim)
    return (total / jnp.asarray(_count(x.shape, axes), acc)).astype(out_dtype)


def _check_mean(x, *args, dtype=None, **_out):
    if dtype is None:
        require(x.is_floating_point() or x.is_complex(), "mean(): could not infer output dtype. Input dtype "
                f"must be either a floating point or complex dtype. Got: {scalar_type(x.dtype)}")
    else:
        require(dtype.is_floating_point or dtype.is_complex, "mean(): could not infer output dtype. Optional "
                f"dtype must be either a floating point or complex dtype. Got: {scalar_type(dtype)}")


@lower(aten.mean.default, check=_check_mean)
def mean(x, *, dtype=None):
    return _mean(x, tuple(range(x.ndim)), False, _float_result(x, dtype))


@lower(aten.mean.dim, check=_check_mean)
def mean_dim(x, dim, keepdim=False, *, dtype=None):
    return _mean(x, _axes(dim, x.ndim), keepdim, _float_result(x, dtype))


def _prod(x, axes, keepdim, out_dtype):
    x = x.astype(out_dtype)
    acc = _acc(out_dtype)
    return jnp.prod(x.astype(acc), axes, keepdims=keepdim).astype(out_dtype)


@lower(aten.prod.default)
def prod(x, *, dtype=None):
    return _prod(x, tuple(range(x.ndim)), False, _sum_dtype(x, dtype))


@lower(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return _prod(x, _axes(dim, x.ndim), keepdim, _sum_dtype(x, dtype))


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(x, dim):
    return jnp.sum(x != 0, _axes(dim, x.ndim), dtype=jnp.int64)


@lower(aten.count_nonzero.default)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, _axes(dim, x.ndim), dtype=jnp.int64)


# ---- max, min and friends --------------------------------------------------------


def _check_nonempty(name: str, x, dims) -> None:
    """CPU refuses a max/min over an empty dimension: it has no identity. (A dimension out
    of range is left to the meta kernel, which names it.)"""
    for d in dims:
        d = d + x.dim() if d < 0 else d
        if 0 <= d < x.dim():
            require(x.shape[d] != 0, f"{name}: Expected reduction dim {d} to have non-zero size.", OpIndexError)


def _check_extreme(name: str):
    def check(x, dim=(), keepdim=False, *, out=None):
        if dim:
            _check_nonempty(f"{name}()", x, [dim] if isinstance(dim, int) else dim)
        else:
            require(x.numel() != 0, f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                    "Specify the reduction dim with the 'dim' argument.")
        if out is not None:
            require(out.dtype == x.dtype, f"Expected the dtype for input and out to match, but got "
                    f"{scalar_type(x.dtype)} for input's dtype and {scalar_type(out.dtype)} for out's dtype.")

    return check


def _check_aminmax(x, *, dim=None, keepdim=False, min=None, max=None):
    if dim is None:
        require(x.numel() != 0, "aminmax(): cannot compute aminmax over an empty dimension as the operation "
                "has no identity.")
    else:
        _check_nonempty("aminmax", x, (dim,))
    for out in (min, max):
        if out is not None:
            require(out.dtype == x.dtype, f"Expected out tensor to have dtype {cpp_type(x.dtype)}, but got "
                    f"{cpp_type(out.dtype)} instead")


@lower(aten.amax.default, check=_check_extreme("amax"))
def amax(x, dim=(), keepdim=False):
    return _extreme(x, _axes(dim, x.ndim), keepdim, largest=True)


@lower(aten.amin.default, check=_check_extreme("amin"))
def amin(x, dim=(), keepdim=False):
    return _extreme(x, _axes(dim, x.ndim), keepdim, largest=False)


@lower(aten.max.default)
def max_(x):
    return _extreme(x, tuple(range(x.ndim)), False, largest=True)


@lower(aten.min.default)
def min_(x):
    return _extreme(x, tuple(range(x.ndim)), False, largest=False)


def _extreme_dim(x, dim, keepdim, *, largest):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values = _extreme(x, (axis,), keepdim, largest=largest)
    idx = _arg_extreme(x, axis, largest=largest)
    if keepdim:
        idx = jnp.expand_dims(idx, axis)
    return values, idx


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, largest=True)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, largest=False)


def _arg(x, dim, keepdim, *, largest):
    if dim is None:
        idx = _arg_extreme(x.reshape(-1), 0, largest=largest) if x.ndim else jnp.zeros((), jnp.int64)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    idx = _arg_extreme(x, axis, largest=largest)
    return jnp.expand_dims(idx, axis) if keepdim else idx


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, largest=True)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, largest=False)


@lower(aten.aminmax.default, check=_check_aminmax)
def aminmax(x, *, dim=None, keepdim=False):
    axes = _axes(dim, x.ndim)
    return (
        _extreme(x, axes, keepdim, largest=False),
        _extreme(x, axes, keepdim, largest=True),
    )


# ---- any / all -------------------------------------------------------------------


def _logical(x, dim, keepdim, fn):
    axes = _axes(dim, x.ndim, empty_means_all=False)
    return fn(x != 0 if x.dtype != jnp.bool_ else x, axes, keepdims=keepdim)


@lower(aten.any.default)
def any_(x):
    return _logical(x, None, False, jnp.any)


@lower(aten.any.dim, aten.any.dims)
def any_dim(x, dim=None, keepdim=False):
    return _logical(x, dim, keepdim, jnp.any)


@lower(aten.all.default)
def all_(x):
    return _logical(x, None, False, jnp.all)


@lower(aten.all.dim, aten.all.dims)
def all_dim(x, dim=None, keepdim=False):
    return _logical(x, dim, keepdim, jnp.all)


@lower(aten.equal.default, cast_output=False)
def equal(x, y):
    """True when both have the same shape and equal elements (NaN != NaN), as a 0-d bool."""
    if x.shape != y.shape:
        return jnp.zeros((), jnp.bool_)
    x, y = promote(x, y)
    return jnp.all(x == y)


# ---- variance and standard deviation -------------------------------------------------


def _var_mean(x, dim, correction, keepdim):
    out_dtype = _float_result(x)
    acc = _acc(out_dtype)
    axes = _axes(dim, x.ndim)
    xf = x.astype(acc)
    n = _count(x.shape, axes)
    mu = jnp.sum(xf, axes, keepdims=True) / jnp.asarray(n, acc)
    dev = xf - mu
    if jnp.issubdtype(acc, jnp.complexfloating):
        sq = (dev * jnp.conj(dev)).real
    else:
        sq = dev * dev
    c = 1 if correction is None else correction
    var = jnp.sum(sq, axes, keepdims=keepdim) / jnp.asarray(max(n - c, 0), sq.dtype)
    if not keepdim:
        mu = jnp.squeeze(mu, axes) if axes else mu
    return var, mu, out_dtype


def _real(dt):
    return jnp.finfo(dt).dtype if jnp.issubdtype(dt, jnp.complexfloating) else dt


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var_mean(x, dim, correction, keepdim)
    return v.astype(_real(out))


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v).astype(_real(out))


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var_mean(x, dim, correction, keepdim)
    return v.astype(_real(out)), m.astype(out)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v).astype(_real(out)), m.astype(out)


# ---- logsumexp and norms ----------------------------------------------------------------


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    # PyTorch runs this as separate tensor ops (amax, sub, exp, sum, log, add),
    # so reduced-precision inputs are rounded after each; the lowering does too
    out_dtype = _float_result(x)
    acc = _acc(out_dtype)
    axes = _axes(dim, x.ndim)

    def rnd(v):
        return _round_to(v, out_dtype)

    xf = x.astype(out_dtype).astype(acc)
    if x.size == 0:
        return jnp.log(jnp.sum(jnp.exp(xf), axes, keepdims=keepdim)).astype(out_dtype)
    m = jnp.max(xf, axes, keepdims=True)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), acc), m)
    total = rnd(jnp.sum(rnd(jnp.exp(rnd(xf - m))), axes, keepdims=True))
    r = rnd(rnd(jnp.log(total)) + m)
    if not keepdim:
        r = jnp.squeeze(r, axes) if axes else r
    return r.astype(out_dtype)


def _vector_norm(x, ord, axes, keepdim, out_dtype):
    acc = _acc(out_dtype)
    a = jnp.abs(x.astype(out_dtype)).astype(_real(acc))
    ord = float(ord)
    if ord == math.inf:
        r = _extreme(a, axes, keepdim, largest=True) if a.size else jnp.zeros(
            jnp.sum(a, axes, keepdims=keepdim).shape, a.dtype)
    elif ord == -math.inf:
        r = _extreme(a, axes, keepdim, largest=False)
    elif ord == 0:
        r = jnp.sum((a != 0).astype(a.dtype), axes, keepdims=keepdim)
    elif ord == 1:
        r = jnp.sum(a, axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a, axes, keepdims=keepdim))
    else:
        r = jnp.power(jnp.sum(jnp.power(a, ord), axes, keepdims=keepdim), 1.0 / ord)
    return r.astype(_real(out_dtype))


@lower(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(x, ord, _axes(dim, x.ndim), keepdim, _float_result(x, dtype))


@lower(aten.norm.Scalar)
def norm_scalar(x, p=2):
    return _vector_norm(x, p, tuple(range(x.ndim)), False, _float_result(x))


@lower(aten.norm.ScalarOpt_dtype)
def norm_dtype(x, p, *, dtype):
    return _vector_norm(x, 2 if p is None else p, tuple(range(x.ndim)), False, _float_result(x, dtype))


@lower(aten.norm.ScalarOpt_dim)
def norm_dim(x, p, dim, keepdim=False):
    return _vector_norm(x, 2 if p is None else p, _axes(dim, x.ndim), keepdim, _float_result(x))


@lower(aten.norm.ScalarOpt_dim_dtype)
def norm_dim_dtype(x, p, dim, keepdim, *, dtype):
    return _vector_norm(x, 2 if p is None else p, _axes(dim, x.ndim), keepdim, _float_result(x, dtype))


@lower(aten.renorm.default)
def renorm(x, p, dim, maxnorm):
    axis = canonical_dim(dim, x.ndim)
    others = tuple(d for d in range(x.ndim) if d != axis)
    acc = _acc(x.dtype)
    norms = _vector_norm(x.astype(acc), p, others, True, acc)
    scale = jnp.where(norms > maxnorm, maxnorm / (norms + 1e-7), jnp.ones((), acc))
    return (x.astype(acc) * scale).astype(x.dtype)


# ---- scans ---------------------------------------------------------------------


def _scan_axis(x, dim):
    return canonical_dim(dim, x.ndim) if x.ndim else None


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    out_dtype = _sum_dtype(x, dtype)
    if x.ndim == 0:
        return x.astype(out_dtype)
    xf = x.astype(out_dtype).astype(_acc(out_dtype))
    return jnp.cumsum(xf, _scan_axis(x, dim)).astype(out_dtype)


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    out_dtype = _sum_dtype(x, dtype)
    if x.ndim == 0:
        return x.astype(out_dtype)
    xf = x.astype(out_dtype).astype(_acc(out_dtype))
    return jnp.cumprod(xf, _scan_axis(x, dim)).astype(out_dtype)


@lower(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    out_dtype = x.dtype
    xf = x.astype(_acc(out_dtype))
    return lax.associative_scan(jnp.logaddexp, xf, axis=_scan_axis(x, dim)).astype(out_dtype)


def _cum_extreme(x, dim, *, largest):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    if x.shape[axis] == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    v = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x

    def combine(a, b):
        # b holds later elements: it wins on NaN, or on >= (<=) against a non-NaN
        av, ai = a
        bv, bi = b
        better = bv >= av if largest else bv <= av
        if _is_float(v.dtype):
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & better)
        else:
            take_b = better
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    values, indices = lax.associative_scan(combine, (v, idx), axis=axis)
    return values.astype(x.dtype), indices


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, largest=True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, largest=False)


# ---- sorting and selection -----------------------------------------------------------


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return _sort(x, canonical_dim(dim, x.ndim), descending)


@lower(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, canonical_dim(dim, x.ndim), descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values, idx = _sort(x, axis, descending=largest)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(idx, 0, k, axis=axis)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values, idx = _sort(x, axis, descending=False)
    v = lax.index_in_dim(values, k - 1, axis, keepdims=keepdim)
    i = lax.index_in_dim(idx, k - 1, axis, keepdims=keepdim)
    return v, i


def _median_along(x, axis, keepdim, *, ignore_nan):
    values, idx = _sort(x, axis, descending=False)
    n = x.shape[axis]
    if _is_float(x.dtype):
        nan = jnp.isnan(x)
        valid = n - jnp.sum(nan, axis, keepdims=True)
    else:
        valid = jnp.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], n, jnp.int64)
    if ignore_nan:
        pos = jnp.maximum(valid - 1, 0) // 2
    else:
        # a NaN anywhere makes the median NaN: sorted NaNs sit after the valid values
        pos = jnp.where(valid < n, valid, (n - 1) // 2)
    pos = pos.astype(jnp.int64)
    v = jnp.take_along_axis(values, pos, axis)
    i = jnp.take_along_axis(idx, pos, axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


@lower(aten.median.default)
def median(x):
    if x.ndim == 0:
        return x
    return _median_along(x.reshape(-1), 0, False, ignore_nan=False)[0]


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median_along(x, canonical_dim(dim, x.ndim), keepdim, ignore_nan=False)


@lower(aten.nanmedian.default)
def nanmedian(x):
    if x.ndim == 0:
        return x
    return _median_along(x.reshape(-1), 0, False, ignore_nan=True)[0]


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median_along(x, canonical_dim(dim, x.ndim), keepdim, ignore_nan=True)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value (the smallest on ties) and its last index."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values, idx = _sort(jnp.moveaxis(x, axis, -1), x.ndim - 1, descending=False)
    eq = values[..., :, None] == values[..., None, :]
    if _is_float(x.dtype):
        nan = jnp.isnan(values)
        eq = eq | (nan[..., :, None] & nan[..., None, :])
    counts = jnp.sum(eq, axis=-1)
    best = jnp.argmax(counts, axis=-1)[..., None]
    value = jnp.take_along_axis(values, best, axis=-1)[..., 0]
    same = jnp.take_along_axis(eq, best[..., None], axis=-2)[..., 0, :]
    index = jnp.max(jnp.where(same, idx, -1), axis=-1)
    if keepdim:
        value, index = jnp.expand_dims(value, axis), jnp.expand_dims(index, axis)
    return value, index


# ---- segment reduction and hashing --------------------------------------------------------


_SEGMENT_OPS = {
    "sum": (jnp.add, 0.0), "mean": (jnp.add, 0.0), "prod": (jnp.multiply, 1.0),
    "max": (jnp.maximum, -jnp.inf), "amax": (jnp.maximum, -jnp.inf),
    "min": (jnp.minimum, jnp.inf), "amin": (jnp.minimum, jnp.inf),
}


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Reduce consecutive segments of ``data`` along ``axis``, element by element in order.

    Like PyTorch's CPU kernel, each segment starts from ``initial`` (or the
    reduction's identity) and folds its elements in sequence in the data's
    dtype; "mean" then divides by the segment length (empty: ``initial``, else NaN).
    """
    if reduce not in _SEGMENT_OPS:
        raise NoLoweringError(
            f"segment_reduce has no tpu lowering for reduce={reduce!r}; "
            f"use one of {', '.join(sorted(_SEGMENT_OPS))}"
        )
    fold, identity = _SEGMENT_OPS[reduce]
    axis = axis % data.ndim
    if offsets is None:
        zero = jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype)
        offsets = jnp.concatenate([zero, jnp.cumsum(lengths, axis=-1)], axis=-1)
    start, end = offsets[..., :-1], offsets[..., 1:]  # batch.. x S
    trail = (1,) * (data.ndim - axis - 1)
    out_shape = start.shape + data.shape[axis + 1 :]
    out = jnp.full(out_shape, identity if initial is None else initial, data.dtype)

    def step(j, out):
        x = jnp.expand_dims(lax.dynamic_index_in_dim(data, j, axis, keepdims=False), axis)
        inside = ((start <= j) & (j < end)).reshape(start.shape + trail)
        return jnp.where(inside, fold(out, x), out)

    out = lax.fori_loop(0, data.shape[axis], step, out)
    if reduce != "mean":
        return out
    count = (end - start).reshape(start.shape + trail).astype(data.dtype)
    mean = out / count
    return jnp.where(count == 0, jnp.asarray(initial, data.dtype), mean) if initial is not None else mean


@lower(aten.hash_tensor.default)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    # PyTorch: widen to the 64-bit float / integer type, bitcast to uint64, xor-reduce
    if jnp.issubdtype(x.dtype, jnp.floating):
        wide = x.astype(jnp.float64)
    else:
        wide = x.astype(jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    dims = tuple(range(x.ndim)) if not dim else tuple(d % max(x.ndim, 1) for d in dim)
    if x.ndim == 0:
        return bits
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, dims)
    if keepdim:
        out = jnp.expand_dims(out, dims)
    return out


# ---- softmax ------------------------------------------------------------------------


def _softmax_axis(x, dim):
    return canonical_dim(dim, x.ndim) if x.ndim else 0


def _as_1d(*arrays):
    """0-dim softmax inputs are softmaxed as one-element vectors."""
    return tuple(a.reshape(1) if a.ndim == 0 else a for a in arrays)


# PyTorch's CPU kernels round some float32 intermediates to the input's
# bfloat16/float16 dtype; the lowerings do the same so reduced-precision
# results agree with CPU to the last bit in the common cases:
#   softmax along a non-last dim rounds exp(x - max);
#   log_softmax along the last dim rounds sum(exp(x - max)) and its log.


@lower(aten._softmax.default)
def softmax(x, dim, half_to_float):
    out_dtype = jnp.dtype(jnp.float32) if half_to_float else x.dtype
    if x.size == 0:
        return jnp.zeros(x.shape, out_dtype)
    (xf,) = _as_1d(x.astype(_acc(x.dtype)))
    axis = _softmax_axis(x, dim)
    e = jnp.exp(xf - jnp.max(xf, axis, keepdims=True))
    if axis != xf.ndim - 1:
        e = _round_to(e, x.dtype)
    r = e / jnp.sum(e, axis, keepdims=True)
    return r.reshape(x.shape).astype(out_dtype)


@lower(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    out_dtype = jnp.dtype(jnp.float32) if half_to_float else x.dtype
    if x.size == 0:
        return jnp.zeros(x.shape, out_dtype)
    (xf,) = _as_1d(x.astype(_acc(x.dtype)))
    axis = _softmax_axis(x, dim)
    shifted = xf - jnp.max(xf, axis, keepdims=True)
    total = jnp.sum(jnp.exp(shifted), axis, keepdims=True)
    last = axis == xf.ndim - 1
    if last:
        total = _round_to(total, x.dtype)
    log_total = jnp.log(total)
    if last:
        log_total = _round_to(log_total, x.dtype)
    return (shifted - log_total).reshape(x.shape).astype(out_dtype)


@lower(aten._softmax_backward_data.default)
def softmax_backward(grad, output, dim, input_dtype):
    acc = _acc(grad.dtype)
    g, y = _as_1d(grad.astype(acc), output.astype(acc))
    axis = _softmax_axis(grad, dim)
    r = y * (g - jnp.sum(g * y, axis, keepdims=True))
    return r.reshape(grad.shape).astype(jdtype(input_dtype))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, output, dim, input_dtype):
    acc = _acc(grad.dtype)
    g, y = _as_1d(grad.astype(acc), output.astype(acc))
    axis = _softmax_axis(grad, dim)
    r = g - jnp.exp(y) * jnp.sum(g, axis, keepdims=True)
    return r.reshape(grad.shape).astype(jdtype(input_dtype))

