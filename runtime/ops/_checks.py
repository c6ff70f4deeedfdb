"""How PyTorch's CPU kernels word their argument errors: the helpers the lowerings'
argument checks (``Lowering.check``) build their messages with.

A check raises what CPU raises for the same call, with CPU's text (a program or a test
written against PyTorch matches on it): :class:`~tpu_debug.core.errors.OpArgumentError`
where CPU raises a RuntimeError, :class:`~tpu_debug.core.errors.OpIndexError` where it
raises an IndexError. Checks read shapes, dtypes and Python values, never tensor data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from tpu_debug.core.errors import OpArgumentError, OpIndexError

__all__ = [
    "OpArgumentError",
    "OpIndexError",
    "Refusal",
    "ValueCheck",
    "c_type",
    "cpp_type",
    "first_outside",
    "index_check",
    "is_mask",
    "require",
    "scalar_type",
    "sizes",
]

# c10's ScalarType names ("Float"), as its TORCH_CHECK messages print a dtype
_SCALAR_TYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf",
}
# the C++ type names caffe2's TypeMeta prints ("float", "long int")
_CPP_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


# the C type names c10's checked_convert prints ("int64_t")
_C_TYPES = {**_CPP_TYPES, torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t",
            torch.int8: "int8_t", torch.uint8: "uint8_t"}


def scalar_type(dtype: torch.dtype) -> str:
    """``Float`` for torch.float32: a dtype as PyTorch's C++ checks name it."""
    return _SCALAR_TYPES.get(dtype, str(dtype).removeprefix("torch."))


def cpp_type(dtype: torch.dtype) -> str:
    """``float`` for torch.float32, ``long int`` for torch.int64 (TypeMeta's names)."""
    return _CPP_TYPES.get(dtype, str(dtype).removeprefix("torch."))


def c_type(dtype: torch.dtype) -> str:
    """``int64_t`` for torch.int64, ``float`` for torch.float32 (c10's checked_convert names)."""
    return _C_TYPES.get(dtype, str(dtype).removeprefix("torch."))


def sizes(shape) -> str:
    """``[2, 3]``: a shape as c10 prints an IntArrayRef."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def require(ok: bool, message: str, error: type[Exception] = OpArgumentError) -> None:
    """Raise ``error(message)`` unless ``ok`` (TORCH_CHECK)."""
    if not ok:
        raise error(message)


# ---- checks of argument values ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """What PyTorch says about a failed value check: the error, the values accepted
    (``low <= v < high``, None for no bound), and what XLA does instead (see
    ``InvalidValueInfo.silent``)."""

    error: Exception
    argument: str
    low: float | int | None
    high: float | int | None
    silent: str


@dataclasses.dataclass(frozen=True, slots=True)
class ValueCheck:
    """A check of an op call's argument values that PyTorch's CPU kernel makes and XLA does
    not (``Lowering.values``). It runs on the host (an eager call's values, read) or inside
    a program (lazy and compiled), so ``test`` is written once over an array namespace.

    Attributes:
        select: the call's arguments (torch tensors eagerly and lazily, JAX arrays in a
            compiled graph; both have ``.shape`` and ``.dtype``) -> (the arrays whose values
            are checked, a tuple of static Python values the test and the message need).
        test: ``(xp, arrays, statics) -> (code, value)`` with ``xp`` numpy or jax.numpy:
            ``code`` 0 when every value passes, else which check failed (a scalar), and
            ``value`` the first offending value (a scalar, any real dtype).
        refusal: ``(code, value, statics) -> Refusal`` for a failed check.
    """

    select: Callable
    test: Callable
    refusal: Callable


def first_outside(xp, flat, low, high):
    """(whether any element of 1-D ``flat`` is outside ``[low, high)``, the first such element)."""
    bad = (flat < low) | (flat >= high)
    if flat.shape[0] == 0:
        return xp.asarray(False), xp.asarray(0, flat.dtype)
    return xp.any(bad), flat[xp.argmax(bad)]


def is_mask(t) -> bool:
    """A boolean or uint8 index tensor (torch or JAX): a mask, not indices."""
    return "bool" in str(t.dtype) or "uint8" in str(t.dtype)


def index_check(select: Callable, message: Callable, *, error: type[Exception] = OpArgumentError,
                negatives: bool = False) -> ValueCheck:
    """Indices in range: ``select(*args, **kwargs)`` gives ``[(index, size, label), ...]`` (the
    index arrays and the size of the dimension each indexes), ``message(value, label, size)``
    PyTorch's text for the first index out of range; ``negatives``: ``-size <= i < size`` is
    accepted (PyTorch wraps negative indices), else ``0 <= i < size``. Boolean masks among
    the indices are not indices and are skipped."""

    def pick(*args, **kwargs):
        entries = [(t, size, label) for t, size, label in select(*args, **kwargs)
                   if t is not None and not is_mask(t)]
        return tuple(t for t, _s, _l in entries), tuple((size, label) for _t, size, label in entries)

    def test(xp, arrays, statics):
        if xp is np:  # on the host: one pass over each index, the details only for a failure
            low = [-size if negatives else 0 for size, _label in statics]
            if all(not a.size or (a.min() >= lo and a.max() < size)
                   for a, lo, (size, _l) in zip(arrays, low, statics)):
                return 0, 0
        code, value = xp.asarray(0), xp.asarray(0.0, xp.float64)
        for k in range(len(arrays) - 1, -1, -1):  # the first failing array wins
            size = statics[k][0]
            bad, v = first_outside(xp, arrays[k].reshape(-1), -size if negatives else 0, size)
            code, value = xp.where(bad, k + 1, code), xp.where(bad, xp.asarray(v, xp.float64), value)
        return code, value

    def refusal(code, value, statics):
        size, label = statics[int(code) - 1]
        value = int(value)
        return Refusal(error(message(value, label, size)), "index", -size if negatives else 0, size, "clamped")

    return ValueCheck(pick, test, refusal)
