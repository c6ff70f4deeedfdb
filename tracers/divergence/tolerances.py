"""Tolerances per dtype: when a device result counts as diverging from PyTorch's on CPU.

An element is over tolerance when ``|device - cpu| > atol + rtol * |cpu|``,
the rule of ``torch.testing.assert_close``, whose default ``(rtol, atol)`` per
dtype are :data:`DEFAULT_TOLERANCES`. Integer and bool results must match
exactly. A table is a dict ``dtype -> (rtol, atol)``; the table of ``"off"``
holds ``inf`` everywhere (and for the ``None`` key: every other dtype too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "EXACT",
    "OFF",
    "format_tolerances",
    "parse_tolerances",
    "tolerance_for",
]

# (rtol, atol) per dtype: torch.testing.assert_close's defaults
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
EXACT = (0.0, 0.0)
OFF = (math.inf, math.inf)
_DTYPES = {str(d).removeprefix("torch."): d for d in DEFAULT_TOLERANCES}


def parse_tolerances(spec: Any) -> dict[torch.dtype, tuple[float, float]] | None:
    """The tolerance table ``spec`` asks for.

    Args:
        spec: None (defaults), ``"off"``, a mapping ``{"float32": (rtol, atol)}``
            (a single number sets rtol and atol alike), or the same as a string
            ``"float32=1e-4:1e-6,bfloat16=0.05"``.

    Returns:
        The full table (dtype -> (rtol, atol)); None for the defaults.

    Raises:
        ValueError: an unknown dtype or a value that is not a non-negative number.
        TypeError: ``spec`` is neither a string nor a mapping.

    Example:
        >>> parse_tolerances("float32=1e-4:1e-6")[torch.float32]
        (0.0001, 1e-06)
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec.strip().lower() == "off":
            return {d: OFF for d in DEFAULT_TOLERANCES} | {None: OFF}  # type: ignore[dict-item]
        spec = _split_spec(spec)
    if not isinstance(spec, Mapping):
        raise TypeError(f"tolerances={spec!r}: expected a mapping dtype -> (rtol, atol), a string, or 'off'")
    table = dict(DEFAULT_TOLERANCES)
    for name, value in spec.items():
        key = name if isinstance(name, torch.dtype) else _DTYPES.get(str(name).strip().removeprefix("torch."))
        if key not in DEFAULT_TOLERANCES:
            raise ValueError(f"tolerance for {name!r}: not a floating dtype; use one of {', '.join(_DTYPES)}")
        table[key] = _pair(name, value)
    return table


def _split_spec(text: str) -> dict[str, Any]:
    """``"float32=1e-4:1e-6,bfloat16=0.05"`` as ``{"float32": ("1e-4", "1e-6"), "bfloat16": "0.05"}``."""
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(
                f"tolerance {part!r} is not dtype=rtol[:atol]; e.g. 'float32=1e-4:1e-6,bfloat16=0.05' or 'off'"
            )
        items[name.strip()] = tuple(value.split(":")) if ":" in value else value
    return items


def _pair(name: Any, value: Any) -> tuple[float, float]:
    """``value`` (a number, or an (rtol, atol) pair of numbers or numeric strings) as (rtol, atol)."""
    pair = value if isinstance(value, (tuple, list)) else (value, value)
    try:
        rtol, atol = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"tolerance for {name}: {value!r} is not rtol[:atol] (numbers)") from None
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"tolerance for {name}: {value!r} must not be negative")
    return rtol, atol


def format_tolerances(table: Mapping[Any, tuple[float, float]] | None) -> str:
    """The canonical string of a tolerance table: its entries that differ from the
    defaults (``""`` for the defaults themselves), or ``"off"``.

    Example:
        >>> format_tolerances(parse_tolerances("float32=1e-4:1e-6"))
        'float32=0.0001:1e-06'
    """
    table = DEFAULT_TOLERANCES if table is None else table
    if all(v == OFF for v in table.values()):
        return "off"
    return ",".join(
        f"{str(d).removeprefix('torch.')}={r:g}:{a:g}"
        for d, (r, a) in table.items()
        if d is not None and DEFAULT_TOLERANCES.get(d) != (r, a)
    )


def tolerance_for(dtype: torch.dtype, table: Mapping | None) -> tuple[float, float]:
    """(rtol, atol) for a result of ``dtype`` under ``table`` (None: the defaults)."""
    table = DEFAULT_TOLERANCES if table is None else table
    found = table.get(dtype)
    if found is not None:
        return found
    return table.get(None, EXACT)  # type: ignore[call-overload]
