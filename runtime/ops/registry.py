"""The aten -> JAX lowering registry: one decorated function per op."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

__all__ = ["Lowering", "lower", "lookup", "registered", "LoweringError"]

_OpOverload = torch._ops.OpOverload


class LoweringError(Exception):
    """A lowering was registered wrongly (twice, or for a non-op)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    """How the runtime calls one lowering.

    Attributes:
        op: the aten overload.
        fn: JAX arrays (and static Python values) in, JAX arrays out.
        rng: the function takes a ``key=`` keyword with a fresh PRNG key.
        eager_only: the output shape depends on values (``nonzero``), so the
            function runs on concrete arrays, outside ``jax.jit``. A callable
            ``(args, kwargs) -> bool`` decides per call (``x[mask]`` needs it,
            ``x[idx]`` does not).
        mutates_returns: for ops that write arguments without being an
            in-place or ``out=`` variant: the function returns the op's
            returns followed by the new value of each written argument.
        cast_output: cast results to the dtype PyTorch's meta kernel gives.
        static_scalars: float ``Scalar`` arguments are baked into the
            executable instead of passed as inputs (the lowering needs their
            values while tracing, e.g. to compute a shape).
        view: the op is a view. Eager mode never calls this function (a view
            aliases its base's storage there); compiled graphs are functional
            and use it to compute the view's value.
        graph_only: compiled graphs use this lowering; eagerly the op keeps
            PyTorch's composite kernel (whose rounding order a half-precision
            lowering would not reproduce).
    """

    op: _OpOverload
    fn: Callable
    rng: bool = False
    eager_only: bool | Callable = False
    mutates_returns: bool = False
    cast_output: bool = True
    view: bool = False
    static_scalars: bool = False
    graph_only: bool = False


_LOWERINGS: dict[_OpOverload, Lowering] = {}


def lower(*ops: _OpOverload | torch._ops.OpOverloadPacket, **flags) -> Callable:
    """Register ``fn`` as the JAX lowering of each aten overload in ``ops``.

    A packet (``aten.add``) is not accepted: name the overloads, so each one a
    lowering claims is explicit. Registering an overload twice is an error.

    Example:
        >>> @lower(aten.neg.default)
        ... def neg(x):
        ...     return -x
    """

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, _OpOverload):
                raise LoweringError(f"{fn.__name__}: {op!r} is not an aten overload")
            if op in _LOWERINGS:
                other = _LOWERINGS[op].fn
                raise LoweringError(
                    f"{op} already lowered by {other.__module__}.{other.__name__}; "
                    f"{fn.__module__}.{fn.__name__} registers it again"
                )
            _LOWERINGS[op] = Lowering(op, fn, **flags)
        return fn

    return register


def lookup(op: _OpOverload) -> Lowering | None:
    """The lowering registered for ``op``, or None."""
    return _LOWERINGS.get(op)


def registered() -> dict[_OpOverload, Lowering]:
    """A copy of the whole table."""
    return dict(_LOWERINGS)
