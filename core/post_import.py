"""Run a callback right after a module is imported, or now if it already is.

The device registers its compile backends when dynamo is first imported, and the c10d
backends guard ``init_device_mesh`` when the device mesh module is: neither imports the
module itself, since a program that never uses it should not pay for it.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

__all__ = ["when_imported"]

_lock = threading.Lock()


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``callback()`` once, right after module ``name`` has executed."""

    def __init__(self, name: str, callback: Callable[[], object]) -> None:
        self.name = name
        self.callback = callback
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._finding:
            return None
        self._finding = True  # the other finders find the module, and may look it up again
        try:
            spec = next(
                (
                    found
                    for finder in list(sys.meta_path)
                    if finder is not self and hasattr(finder, "find_spec")
                    for found in [finder.find_spec(fullname, path, target)]
                    if found is not None
                ),
                None,
            )
        finally:
            self._finding = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            del loader.exec_module  # the loader's own method again (a reload is plain)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                self.callback()

        loader.exec_module = exec_then_call  # this module's loader instance only
        return spec


def when_imported(name: str, callback: Callable[[], object]) -> None:
    """Call ``callback()`` now if module ``name`` is imported, else right after it is."""
    with _lock:
        if name not in sys.modules:
            if not any(isinstance(f, _PostImportHook) and f.name == name and f.callback == callback
                       for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportHook(name, callback))
            return
    callback()
