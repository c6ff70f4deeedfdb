"""Tolerance specs read and written without torch: dtypes by name.

``tpu_debug.tracers.recording.divergence.tolerances`` turns these tables into ``torch.dtype`` keyed
ones; the option table checks a ``tolerances`` value here, so reading options loads no torch.
A key may be a dtype's name (``"float32"``) or anything whose ``str`` is ``"torch.<name>"``
(a ``torch.dtype``). A table maps a name to ``(rtol, atol)``; the table of ``"off"`` holds
``inf`` everywhere, and for the ``None`` key (every other dtype) too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_TOLERANCES", "EXACT", "OFF", "dtype_name", "format_tolerances", "parse_tolerances"]

# (rtol, atol) per dtype: torch.testing.assert_close's defaults
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}
EXACT = (0.0, 0.0)
OFF = (math.inf, math.inf)


def dtype_name(key: Any) -> str:
    """``"float32"`` for ``"float32"``, ``" torch.float32"`` or ``torch.float32``."""
    return str(key).strip().removeprefix("torch.")


def parse_tolerances(spec: Any) -> dict[str | None, tuple[float, float]] | None:
    """The tolerance table ``spec`` asks for, keyed by dtype name.

    Args:
        spec: None (defaults), ``"off"``, a mapping ``{"float32": (rtol, atol)}``
            (a single number sets rtol and atol alike), or the same as a string
            ``"float32=1e-4:1e-6,bfloat16=0.05"``.

    Returns:
        The full table (name -> (rtol, atol)); None for the defaults.

    Raises:
        ValueError: an unknown dtype or a value that is not a non-negative number.
        TypeError: ``spec`` is neither a string nor a mapping.

    Example:
        >>> parse_tolerances("float32=1e-4:1e-6")["float32"]
        (0.0001, 1e-06)
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec.strip().lower() == "off":
            return {d: OFF for d in DEFAULT_TOLERANCES} | {None: OFF}
        spec = _split_spec(spec)
    if not isinstance(spec, Mapping):
        raise TypeError(f"tolerances={spec!r}: expected a mapping dtype -> (rtol, atol), a string, or 'off'")
    table: dict[str | None, tuple[float, float]] = dict(DEFAULT_TOLERANCES)
    for key, value in spec.items():
        name = dtype_name(key)
        if name not in DEFAULT_TOLERANCES:
            raise ValueError(
                f"tolerance for {key!r}: not a floating dtype; use one of {', '.join(DEFAULT_TOLERANCES)}"
            )
        table[name] = _pair(key, value)
    return table


def _split_spec(text: str) -> dict[str, Any]:
    """``"float32=1e-4:1e-6,bfloat16=0.05"`` as ``{"float32": ("1e-4", "1e-6"), "bfloat16": "0.05"}``."""
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(
                f"tolerance {part!r} is not dtype=rtol[:atol]; "
                "e.g. 'float32=1e-4:1e-6,bfloat16=0.05' or 'off'"
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
    """The canonical string of a tolerance table (keyed by names or dtypes): its entries that
    differ from the defaults (``""`` for the defaults themselves), or ``"off"``.

    Example:
        >>> format_tolerances(parse_tolerances("float32=1e-4:1e-6"))
        'float32=0.0001:1e-06'
    """
    table = DEFAULT_TOLERANCES if table is None else table
    if all(v == OFF for v in table.values()):
        return "off"
    return ",".join(
        f"{dtype_name(d)}={r:g}:{a:g}"
        for d, (r, a) in table.items()
        if d is not None and DEFAULT_TOLERANCES.get(dtype_name(d)) != (r, a)
    )
