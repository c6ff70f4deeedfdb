"""Where library code lives, so that a frame can be told apart from the user's.

A collective or a program named at "the user's line" is named at the innermost frame
that is not torch, JAX, numpy, tpu_debug or the standard library; those are the
directories of their packages as imported in this process.
"""

from __future__ import annotations

import os
import sys
import sysconfig

__all__ = ["library_roots"]

_LIBRARIES = ("torch", "jax", "jaxlib", "numpy", "tpu_debug", "tpu_debug.core", "tpu_debug.runtime",
              "tpu_debug.tracers", "tpu_debug.fit", "tpu_debug.tui")
_roots: tuple[str, ...] | None = None


def library_roots() -> tuple[str, ...]:
    """The directories (each ending in a separator, symbolic links resolved) of the libraries
    imported when first asked, and of the standard library; a package imported later is not
    among them, and code under ``site-packages`` counts as library code wherever it is."""
    global _roots
    if _roots is None:
        roots = set()
        for name in _LIBRARIES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__file__", None):
                roots.add(os.path.dirname(os.path.realpath(module.__file__)) + os.sep)
        for key in ("stdlib", "platstdlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                roots.add(os.path.realpath(path) + os.sep)
        _roots = tuple(sorted(roots))
    return _roots
