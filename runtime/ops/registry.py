"""The aten -> JAX lowering registry: one decorated function per op."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tpu_debug.core.errors import LoweringError

__all__ = ["Lowering", "LoweringError", "composite", "composites", "lookup", "lower", "registered"]

_OpOverload = torch._ops.OpOverload


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
        precision: the function reads the float32 matmul precision and the
            numerics setting while it is traced (products and convolutions,
            through ``linalg.dot_general`` or ``linalg.matmul_precision``), so
            an eager executable of it is keyed by them: changing
            ``torch.tpu.precision`` compiles it again, and nothing else.
        meta: for an op whose PyTorch meta kernel refuses calls the lowering
            runs (``_grouped_mm``'s takes bfloat16 only, the dtype of the CUDA
            kernel): the op's output tensors computed from meta or fake input
            tensors, in PyTorch's calling convention. The eager interpreter
            takes output shapes and dtypes from it, and dynamo and
            AOTAutograd use it for `tpu` inputs (``compiled.register_metas``),
            so both modes accept what the lowering does.
        check: PyTorch's checks of the call's arguments that its meta kernel does not make
            and its CPU kernel does (a negative convolution padding, a ``uniform_`` range
            whose ends are swapped), raising what CPU raises. Called with the op's
            arguments as given (`tpu` tensors, Python scalars, an ``out=`` tensor for an
            ``out=`` overload) before each eager or lazy call of the lowering or of its
            in-place and ``out=`` forms: a scalar that is an executable input (not part of
            the key) is checked at every call. It reads shapes, dtypes and Python values,
            never a tensor's data.
        values: PyTorch's checks of the call's argument values (an index in range, a
            probability distribution): a :class:`~tpu_debug.runtime.ops._checks.ValueCheck`,
            run by runtime/value_checks.py where the mode allows (``config.data_checks``)
            and whenever a probe listens for ``on_invalid_value``.
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
    precision: bool = False
    meta: Callable | None = None
    check: Callable | None = None
    values: Any = None


_LOWERINGS: dict[_OpOverload, Lowering] = {}
_FLAGS = frozenset(f.name for f in dataclasses.fields(Lowering)) - {"op", "fn"}


def _refuse_twice(op: _OpOverload, fn: Callable) -> None:
    other = _LOWERINGS[op].fn if op in _LOWERINGS else _COMPOSITES.get(op)
    if other is not None:
        raise LoweringError(
            f"{op} already lowered by {other.__module__}.{other.__name__}; "
            f"{fn.__module__}.{fn.__name__} registers it again (keep one of the two)"
        )


def lower(*ops: _OpOverload | torch._ops.OpOverloadPacket, **flags) -> Callable:
    """Register ``fn`` as the JAX lowering of each aten overload in ``ops``.

    A packet (``aten.add``) is not accepted: name the overloads, so each one a
    lowering claims is explicit. ``flags`` are the fields of ``Lowering``
    (``rng=True``, ``precision=True``, ...).

    Raises:
        LoweringError: an overload is registered twice, or an argument is not an
            aten overload.

    Example::

        @lower(aten.neg.default)
        def neg(x):
            return -x
    """
    unknown = sorted(set(flags) - _FLAGS)
    if unknown:
        raise LoweringError(
            f"lower({', '.join(map(str, ops))}): unknown flag(s) {', '.join(unknown)}; "
            f"the flags are {', '.join(sorted(_FLAGS))}"
        )

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, _OpOverload):
                raise LoweringError(
                    f"{fn.__module__}.{fn.__name__}: {op!r} is not an aten overload; "
                    "name the overloads it lowers (aten.add.Tensor, not aten.add)"
                )
            _refuse_twice(op, fn)
        for op in ops:
            _LOWERINGS[op] = Lowering(op, fn, **flags)
        return fn

    return register


def lookup(op: _OpOverload) -> Lowering | None:
    """The lowering registered for ``op``, or None."""
    return _LOWERINGS.get(op)


def registered() -> dict[_OpOverload, Lowering]:
    """A copy of the whole table."""
    return dict(_LOWERINGS)


_COMPOSITES: dict[_OpOverload, Callable] = {}


def composite(*ops: _OpOverload) -> Callable:
    """Register ``fn`` as the `tpu` kernel of composite aten overloads, above autograd.

    For an op whose PyTorch composite kernel refuses a `tpu` argument (it reads the
    argument's values on the host): ``fn`` takes and returns torch tensors and calls
    other aten ops, so views and autograd come from those ops as they do from the
    composite kernel. It is registered for the ``PrivateUse1`` and
    ``AutogradPrivateUse1`` keys, and runs eagerly (dynamo does not trace into it).

    Raises:
        LoweringError: an overload already has a lowering or a composite kernel.

    Example::

        @composite(aten.tensor_split.tensor_indices_or_sections)
        def tensor_split(x, indices_or_sections, dim=0):
            ...
    """

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, _OpOverload):
                raise LoweringError(f"{fn.__module__}.{fn.__name__}: {op!r} is not an aten overload")
            _refuse_twice(op, fn)
        for op in ops:
            _COMPOSITES[op] = fn
        return fn

    return register


def composites() -> dict[_OpOverload, Callable]:
    """A copy of the composite-kernel table."""
    return dict(_COMPOSITES)
