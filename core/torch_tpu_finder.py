"""``import torch_tpu`` where TorchTPU is not installed: TorchTPU's modules, served by tpu_debug.

Scripts written for TorchTPU import its modules (``import torch_tpu``, ``from torch_tpu
import api``, ``from torch_tpu._internal import sync, pallas``) and run its launcher
(``python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper``). Where TorchTPU
is not installed, the finder below answers those names with tpu_debug's runtime
(``tpu_debug.runtime.torchtpu``), so the scripts run unchanged.

It never shadows a real TorchTPU: it sits at the end of ``sys.meta_path``, after the
finders of ``sys.path``, so a ``torch_tpu`` installed anywhere on the path is found first;
and it answers a submodule only while ``torch_tpu`` itself is its own, so a real package
is never given a submodule of ours.

The wheel's ``tpu_debug_torch_tpu.pth`` imports this module when Python starts, so the
name resolves before ``import torch`` too; the runtime installs it again (idempotent)
when it registers the device. Here in core, not beside the modules it serves in
``runtime/torchtpu/``, because importing ``tpu_debug.runtime`` reads the options (tens of
milliseconds at every start of Python); at start-up this costs ``tpu_debug`` and
``tpu_debug.core`` (a version string) and this module, which imports nothing but ``sys``
and builds modules only when a ``torch_tpu`` name is imported.
"""

from __future__ import annotations

import sys

__all__ = ["MODULES", "install"]

_IMPL = "tpu_debug.runtime.torchtpu."

# TorchTPU module -> the tpu_debug module that implements it ("" for a package that only
# holds submodules). A package gets an empty ``__path__``; a module is that implementation
# module itself, under both names.
MODULES: dict[str, str] = {
    "torch_tpu": "",
    "torch_tpu.api": _IMPL + "api",
    "torch_tpu.utils": _IMPL + "utils",
    "torch_tpu._internal": "",
    "torch_tpu._internal.sync": _IMPL + "sync",
    "torch_tpu._internal.profiler": _IMPL + "profiler",
    "torch_tpu._internal.pallas": _IMPL + "pallas",
    "torch_tpu._internal.execution_mode": _IMPL + "execution_mode",
    "torch_tpu._internal.compile": _IMPL + "compile",
    "torch_tpu._internal.utils": "",
    "torch_tpu._internal.utils.utils": _IMPL + "utils",
    "torch_tpu._internal.utils.test_utils": _IMPL + "utils",
    "torch_tpu._internal.utils.log_utils": _IMPL + "log_utils",
    "torch_tpu._internal.device": "",
    "torch_tpu._internal.device._device_module": _IMPL + "device_module",
    "torch_tpu._internal.distributed": "",
    "torch_tpu._internal.distributed.launchers": "",
    "torch_tpu._internal.distributed.launchers.singlehost_wrapper": _IMPL + "launcher",
}
_ROOT = "torch_tpu"
MARKER = "__tpu_debug_shim__"


def _ours() -> bool:
    root = sys.modules.get(_ROOT)
    return root is not None and getattr(root, MARKER, False)


class _Loader:
    """Makes one TorchTPU module: a package of submodules, or the implementation module."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.impl = MODULES[name]

    def create_module(self, spec):
        import importlib

        if self.impl:
            return importlib.import_module(self.impl)
        return _Package(self.name)

    def exec_module(self, module) -> None:
        return None  # a package's submodules load on import; an implementation module ran already

    # ``python -m <module>`` (runpy) runs the implementation's code as ``__main__``
    def _impl_spec(self):
        import importlib.util

        return importlib.util.find_spec(self.impl) if self.impl else None

    def get_source(self, fullname: str):
        spec = self._impl_spec()
        if spec is None or not spec.origin:
            return None
        import importlib.util

        with open(spec.origin, "rb") as f:
            return importlib.util.decode_source(f.read())

    def get_code(self, fullname: str):
        # compiled from the file, not asked of the implementation's loader: that may be another
        # import hook's (pytest's assertion rewriter) without get_code
        source = self.get_source(fullname)
        return None if source is None else compile(source, self._impl_spec().origin, "exec", dont_inherit=True)

    def is_package(self, fullname: str) -> bool:
        return not self.impl


class _Package(type(sys)):
    """A TorchTPU package: its submodules are imported when first read as attributes
    (``torch_tpu._internal.pallas`` after ``import torch_tpu``), as TorchTPU's are."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"TorchTPU's {name}, served by tpu_debug's runtime (TorchTPU is not installed).")
        self.__path__ = []
        setattr(self, MARKER, True)

    def __getattr__(self, attr: str):
        child = f"{self.__name__}.{attr}"
        if child in MODULES:
            import importlib

            return importlib.import_module(child)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self):
        prefix = self.__name__ + "."
        return sorted({*super().__dir__(), *(n[len(prefix):] for n in MODULES if n.startswith(prefix)
                                             and "." not in n[len(prefix):])})


class _Finder:
    """The end of ``sys.meta_path``: TorchTPU's module names, when no real TorchTPU answers."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MODULES or (fullname != _ROOT and not _ours()):
            return None
        import importlib.util

        loader = _Loader(fullname)
        spec = importlib.util.spec_from_loader(fullname, loader, is_package=loader.is_package(fullname))
        if loader.impl:
            impl = loader._impl_spec()
            if impl is not None and impl.origin:
                spec.origin, spec.has_location = impl.origin, True
        return spec

    def invalidate_caches(self) -> None:
        return None


_FINDER = _Finder()


def install() -> None:
    """Append the finder to ``sys.meta_path`` (once; idempotent)."""
    if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.append(_FINDER)


install()
