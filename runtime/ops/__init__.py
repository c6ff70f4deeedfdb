"""aten -> JAX lowerings, one small registered function per op.

Modules are grouped by op family; ``load()`` imports them all, which fills the
registry (``registry.lookup``).
"""

from __future__ import annotations

import importlib

from tpu_debug.runtime.ops.registry import Lowering, LoweringError, lookup, lower, registered

__all__ = ["load", "lower", "lookup", "registered", "Lowering", "LoweringError", "FAMILIES"]

FAMILIES = (
    "elementwise",
    "reductions",
    "linalg",
    "nn",
    "shape",
    "indexing",
    "factories",
    "foreach",
    "views",
    "extra",
    "graph",
)

_loaded = False


def load() -> None:
    """Import every op family once (registering its lowerings)."""
    global _loaded
    if _loaded:
        return
    for name in FAMILIES:
        try:
            importlib.import_module(f"tpu_debug.runtime.ops.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"tpu_debug.runtime.ops.{name}":
                raise
    _loaded = True
