"""A device registration that waits for the runtime's modules to finish importing, and the
lazy public names of the runtime's packages.

torch's backend autoload calls the ``torch.backends`` entry point (``tpu_debug._loader``) at
the end of ``import torch``. When that import was started by a module of ``tpu_debug.runtime``
(the runtime's package only names its modules, so the first one that needs torch imports it),
that module is half-imported and the device cannot be registered yet: registering imports the
device's modules, which import it back. The entry point leaves its registration here, and it
runs when the runtime's packages next hand out a name (:func:`lazy_exports`) with none of the
runtime's modules importing. (A program that imports a runtime module by its dotted path
before torch, ``import tpu_debug.runtime.eager``, gets the device at its first use of a runtime
name, ``tpu_debug.runtime.install()`` say.) The hand-off lives in core because the entry point
sits above the runtime and the runtime may not import it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["defer", "lazy_exports", "run_deferred", "runtime_importing"]

RUNTIME = "tpu_debug.runtime"

_waiting: list[Callable[[], None]] = []


def runtime_importing() -> bool:
    """True while a module of ``tpu_debug.runtime`` (or the package) is being imported."""
    return any(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
        if name == RUNTIME or name.startswith(RUNTIME + ".")
    )


def defer(register: Callable[[], None]) -> None:
    """Run ``register`` when :func:`run_deferred` is next called with no runtime module importing (once)."""
    if register not in _waiting:
        _waiting.append(register)


def run_deferred() -> None:
    """Run the registrations :func:`defer` kept, in order, each once; nothing while a runtime
    module is being imported (a registration imports them)."""
    while _waiting and not runtime_importing():
        _waiting.pop(0)()


def lazy_exports(
    namespace: dict[str, Any], modules: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__`` (PEP 562) that import each public name's
    module on first use: ``modules`` maps a module to the names it gives the package. A
    submodule is an attribute too (``from tpu_debug.runtime import eager``), imported on first use.

    Importing the package then loads none of them, so its light modules (the probes, the
    options) import without torch or jax. A name handed out binds in ``namespace`` (the
    package's ``globals()``) and runs a registration torch's autoload left waiting.

    Example::

        __getattr__, __dir__ = lazy_exports(globals(), {"tpu_debug.runtime.device": ("install",)})
    """
    where = {name: module for module, names in modules.items() for name in names}
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is not None:
            value = namespace[name] = getattr(importlib.import_module(module), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")  # a submodule, as `import` binds it
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        run_deferred()
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
