"""aten -> JAX lowerings, one small registered function per op.

Modules are grouped by op family (``FAMILIES``); ``load()`` imports them all,
which fills the registry (``registry.lookup``). A new family is one module here
and its name in ``FAMILIES``. The ``prims`` family registers when the compiled
mode first runs (``prims.register``): its ops exist only once ``torch.compile``
has imported them.
"""

from __future__ import annotations

import importlib

from tpu_debug.runtime.ops.registry import (
    Lowering,
    LoweringError,
    composite,
    composites,
    lookup,
    lower,
    registered,
)

__all__ = [
    "FAMILIES", "Lowering", "LoweringError", "composite", "composites", "load", "lookup", "lower", "registered",
]

FAMILIES = (
    "elementwise",
    "activations",
    "special",
    "fft",
    "reductions",
    "linalg",
    "convolution",
    "pooling",
    "normalization",
    "losses",
    "resampling",
    "embedding",
    "shape",
    "indexing",
    "factories",
    "random",
    "foreach",
    "views",
    "transformer",
    "recurrent",
    "prims",
)

_loaded = False


def load() -> None:
    """Import every op family once (registering its lowerings).

    Raises:
        ModuleNotFoundError: a family listed in ``FAMILIES`` is missing (an
            incomplete install); the error names the module.
    """
    global _loaded
    if _loaded:
        return
    for name in FAMILIES:
        importlib.import_module(f"tpu_debug.runtime.ops.{name}")
    _loaded = True
