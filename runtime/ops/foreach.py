"""``_foreach_*`` ops: one XLA executable for a whole list of tensors.

``torch.optim`` uses these on non-CPU devices (``foreach=True`` is the default
there), so an optimizer step is a handful of executables instead of one per
parameter per op. Each lowering maps the single-tensor lowering of the same
math (``add.Tensor``, ``sqrt``, ...) over the list, so type promotion and
special cases stay defined in one place (``elementwise.py``). The in-place
variants (``_foreach_add_``) come from these through the op schemas.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_debug.runtime.ops._common import jdtype, opmath
from tpu_debug.runtime.ops.registry import LoweringError, lookup, lower

aten = torch.ops.aten


def _fn(op):
    # resolved when traced, so registration order between families does not matter
    lowering = lookup(op)
    if lowering is None:
        raise LoweringError(
            f"the _foreach lowerings map {op} over a list, and {op} has no lowering; register one"
        )
    return lowering.fn


# ---- binary: List / Scalar / ScalarList / Tensor ---------------------------------------


def _binary(op):
    # ``alpha`` is only ever passed for the schemas that have it (add, sub); a float alpha
    # arrives traced (an executable input: a new learning rate does not recompile)
    def call(f, x, y, alpha):
        return f(x, y) if type(alpha) in (int, bool) and alpha == 1 else f(x, y, alpha=alpha)

    def list_(xs, ys, *, alpha=1):
        f = _fn(op)
        return [call(f, x, y, alpha) for x, y in zip(xs, ys)]

    def scalar(xs, s):
        f = _fn(op)
        return [f(x, s) for x in xs]

    def scalar_list(xs, ss):
        f = _fn(op)
        return [f(x, s) for x, s in zip(xs, ss)]

    def tensor(xs, t, *, alpha=1):
        f = _fn(op)
        return [call(f, x, t, alpha) for x in xs]

    return {"List": list_, "Scalar": scalar, "ScalarList": scalar_list, "Tensor": tensor}


_BINARY = {
    "add": aten.add.Tensor,
    "sub": aten.sub.Tensor,
    "mul": aten.mul.Tensor,
    "div": aten.div.Tensor,
    "maximum": aten.maximum.default,
    "minimum": aten.minimum.default,
    "clamp_min": aten.clamp_min.Tensor,
    "clamp_max": aten.clamp_max.Tensor,
    "pow": aten.pow.Tensor_Tensor,
}

for _name, _op in _BINARY.items():
    _packet = getattr(aten, f"_foreach_{_name}")
    for _overload, _impl in _binary(_op).items():
        if _overload in _packet.overloads():
            _impl.__name__ = f"foreach_{_name}_{_overload}"
            lower(getattr(_packet, _overload))(_impl)


@lower(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(base, exponents):
    f = _fn(aten.pow.Scalar)
    return [f(base, e) for e in exponents]


# ---- unary ----------------------------------------------------------------------------------

_UNARY = (
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
    "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
    "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
)


def _unary(op):
    def impl(xs):
        f = _fn(op)
        return [f(x) for x in xs]

    return impl


for _name in _UNARY:
    _impl = _unary(getattr(aten, _name).default)
    _impl.__name__ = f"foreach_{_name}"
    lower(getattr(aten, f"_foreach_{_name}").default)(_impl)


@lower(aten._foreach_zero.default)
def foreach_zero(xs):
    return [jnp.zeros_like(x) for x in xs]


@lower(aten._foreach_copy.default)
def foreach_copy(xs, srcs, non_blocking=False):
    return [jnp.broadcast_to(s.astype(x.dtype), x.shape) for x, s in zip(xs, srcs)]


@lower(aten._foreach_clone.default)
def foreach_clone(xs, *, memory_format=None):
    return [jnp.array(x, copy=True) for x in xs]


# ---- ternary ----------------------------------------------------------------------------------


def _pointwise3(op, keyword):
    def scalar(xs, t1s, t2s, value=1):
        f = _fn(op)
        return [f(x, a, b, **{keyword: value}) for x, a, b in zip(xs, t1s, t2s)]

    def scalar_list(xs, t1s, t2s, scalars):
        f = _fn(op)
        return [f(x, a, b, **{keyword: s}) for x, a, b, s in zip(xs, t1s, t2s, scalars)]

    def tensor(xs, t1s, t2s, scalars):
        f = _fn(op)
        return [
            f(x, a, b, **{keyword: scalars[i].astype(x.dtype)})
            for i, (x, a, b) in enumerate(zip(xs, t1s, t2s))
        ]

    return {"Scalar": scalar, "ScalarList": scalar_list, "Tensor": tensor}


for _name, _op in (("addcmul", aten.addcmul.default), ("addcdiv", aten.addcdiv.default)):
    _packet = getattr(aten, f"_foreach_{_name}")
    for _overload, _impl in _pointwise3(_op, "value").items():
        _impl.__name__ = f"foreach_{_name}_{_overload}"
        lower(getattr(_packet, _overload))(_impl)


@lower(aten._foreach_lerp.List)
def foreach_lerp_list(xs, ends, weights):
    f = _fn(aten.lerp.Tensor)
    return [f(x, e, w) for x, e, w in zip(xs, ends, weights)]


@lower(aten._foreach_lerp.Scalar)
def foreach_lerp_scalar(xs, ends, weight):
    f = _fn(aten.lerp.Scalar)
    return [f(x, e, weight) for x, e in zip(xs, ends)]


@lower(aten._foreach_lerp.ScalarList)
def foreach_lerp_scalar_list(xs, ends, weights):
    f = _fn(aten.lerp.Scalar)
    return [f(x, e, w) for x, e, w in zip(xs, ends, weights)]


# ---- reductions ---------------------------------------------------------------------------------


def _as_float(x, dtype):
    return x.astype(jdtype(dtype)) if dtype is not None else opmath(x)


def _vector_norm(x, ord, dtype):
    a = jnp.abs(_as_float(x, dtype))
    if ord == float("inf"):
        return jnp.max(a, initial=0) if a.size else jnp.zeros((), a.dtype)
    if ord == float("-inf"):
        return jnp.min(a)
    if ord == 0:
        return jnp.sum(a != 0).astype(a.dtype)
    if ord == 1:
        return jnp.sum(a)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a))
    return jnp.sum(a**ord) ** (1.0 / ord)


@lower(aten._foreach_norm.Scalar)
def foreach_norm(xs, ord=2, dtype=None):
    return [_vector_norm(x, ord, dtype) for x in xs]


@lower(aten._foreach_powsum.Scalar)
def foreach_powsum(xs, ord=2, dtype=None):
    out = []
    for x in xs:
        a = jnp.abs(_as_float(x, dtype))
        out.append(jnp.sum(a * a) if ord == 2 else jnp.sum(a**ord))
    return out


@lower(aten._foreach_max.default)
def foreach_max(xs):
    return [jnp.max(x) for x in xs]


@lower(aten._foreach_mm.default, precision=True)
def foreach_mm(xs, ys):
    f = _fn(aten.mm.default)
    return [f(x, y) for x, y in zip(xs, ys)]
