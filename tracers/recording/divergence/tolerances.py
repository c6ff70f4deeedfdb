"""Tolerances per dtype: when a device result counts as diverging from PyTorch's on CPU.

An element is over tolerance when ``|device - cpu| > atol + rtol * |cpu|``,
the rule of ``torch.testing.assert_close``, whose default ``(rtol, atol)`` per
dtype are :data:`DEFAULT_TOLERANCES`. Integer and bool results must match
exactly. A table is a dict ``dtype -> (rtol, atol)``; the table of ``"off"``
holds ``inf`` everywhere (and for the ``None`` key: every other dtype too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tpu_debug.core import tolerances as by_name
from tpu_debug.core.tolerances import EXACT, OFF, format_tolerances

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
    getattr(torch, name): pair for name, pair in by_name.DEFAULT_TOLERANCES.items()
}


def parse_tolerances(spec: Any) -> dict[torch.dtype, tuple[float, float]] | None:
    """The tolerance table ``spec`` asks for, keyed by ``torch.dtype`` (the spec is read by
    :func:`tpu_debug.core.tolerances.parse_tolerances`, which names what it accepts and raises).

    Example:
        >>> parse_tolerances("float32=1e-4:1e-6")[torch.float32]
        (0.0001, 1e-06)
    """
    table = by_name.parse_tolerances(spec)
    if table is None:
        return None
    return {None if n is None else getattr(torch, n): pair for n, pair in table.items()}  # type: ignore[misc]


def tolerance_for(dtype: torch.dtype, table: Mapping | None) -> tuple[float, float]:
    """(rtol, atol) for a result of ``dtype`` under ``table`` (None: the defaults)."""
    table = DEFAULT_TOLERANCES if table is None else table
    found = table.get(dtype)
    if found is not None:
        return found
    return table.get(None, EXACT)  # type: ignore[call-overload]
