"""``import torch_tpu`` where TorchTPU is not installed: TorchTPU's modules, served by tpu_debug.

Scripts written for TorchTPU import its modules (``import torch_tpu``, ``from torch_tpu
import api``, ``from torch_tpu._internal import sync, pallas``) and run its launchers
(``python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper``). Where TorchTPU
is not installed, the finder below answers those names with tpu_debug's runtime
(``tpu_debug.runtime.torchtpu``), so the scripts run unchanged.

TorchTPU moved names between versions: ``torch_tpu.api`` was a package holding
``_device_module`` and ``streams``, later those moved under ``_internal``; ``_internal.sync``,
``.pallas`` and ``.compile`` became packages whose first module kept the old name
(``_internal.pallas.pallas.jax_op`` beside ``_internal.pallas.jax_op``). :data:`MODULES` holds
every module name of every layout, so each spelling resolves. A TorchTPU module is served as
a module of its own name (:class:`_TorchTpuModule`) that reads its names from the runtime's
implementation module and, where the table lists modules under it, is a package of them.

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

__all__ = ["MODULES", "install", "installed_elsewhere"]

_IMPL = "tpu_debug.runtime.torchtpu."

# TorchTPU module -> the tpu_debug module whose names it holds ("" for a package that only
# holds modules). A module is a package when others are listed under it.
MODULES: dict[str, str] = {
    "torch_tpu": _IMPL + "root",
    "torch_tpu._loader": _IMPL + "loader",
    "torch_tpu.api": _IMPL + "api",
    "torch_tpu.api._device_module": _IMPL + "device_module",
    "torch_tpu.api.streams": _IMPL + "streams",
    "torch_tpu.api._device_ops_backend": _IMPL + "device_ops_backend",
    "torch_tpu.utils": _IMPL + "utils",
    "torch_tpu.profiler": _IMPL + "profiler",
    "torch_tpu.ops": _IMPL + "ops",
    "torch_tpu.ops.splash_attention": _IMPL + "splash_attention",
    "torch_tpu.shims": "",
    "torch_tpu.shims.g3_multiprocessing": _IMPL + "multiprocessing",
    "torch_tpu.shims.g3_multiprocessing.g3_multiprocessing": _IMPL + "multiprocessing",
    "torch_tpu._internal": "",
    "torch_tpu._internal.sync": _IMPL + "sync",
    "torch_tpu._internal.sync.sync": _IMPL + "sync",
    "torch_tpu._internal.profiler": _IMPL + "profiler",
    "torch_tpu._internal.profiler._api": _IMPL + "profiler",
    "torch_tpu._internal.profiler._impl": _IMPL + "profiler",
    "torch_tpu._internal.profiler.profiler_api": _IMPL + "profiler",
    "torch_tpu._internal.profiler.profiler_config": _IMPL + "profiler",
    "torch_tpu._internal.pallas": _IMPL + "pallas",
    "torch_tpu._internal.pallas.pallas": _IMPL + "pallas",
    "torch_tpu._internal.pallas.mesh": _IMPL + "pallas",
    "torch_tpu._internal.execution_mode": _IMPL + "execution_mode",
    "torch_tpu._internal.execution_mode_impl": _IMPL + "execution_mode_impl",
    "torch_tpu._internal.execution_mode.execution_mode_impl": _IMPL + "execution_mode_impl",
    "torch_tpu._internal.compile": _IMPL + "compile",
    "torch_tpu._internal.compile._backend": _IMPL + "compile",
    "torch_tpu._internal.compile.compiler": _IMPL + "compile",
    "torch_tpu._internal.compile.debug": _IMPL + "compile",
    "torch_tpu._internal.compile.split_compiler": _IMPL + "compile",
    "torch_tpu._internal.compile.dynamic_compiler": _IMPL + "compile",
    "torch_tpu._internal.compile.dynamic": _IMPL + "compile",
    "torch_tpu._internal.compile.dynamic.dynamic_compiler": _IMPL + "compile",
    "torch_tpu._internal.optim": _IMPL + "optim",
    "torch_tpu._internal.optim.adamw": _IMPL + "optim",
    "torch_tpu._internal.optim.patch": _IMPL + "optim",
    "torch_tpu._internal.dynamism": _IMPL + "dynamism",
    "torch_tpu._internal.ops": _IMPL + "ops",
    "torch_tpu._internal.ops.jagged": _IMPL + "ops",
    "torch_tpu._internal.ops.splash_attention": _IMPL + "splash_attention",
    "torch_tpu._internal.testing": _IMPL + "testing",
    "torch_tpu._internal.env": _IMPL + "env",
    "torch_tpu._internal.env_utils": _IMPL + "env",
    "torch_tpu._internal.utils": "",
    "torch_tpu._internal.utils.utils": _IMPL + "utils",
    "torch_tpu._internal.utils.test_utils": _IMPL + "utils",
    "torch_tpu._internal.utils.tracer_utils": _IMPL + "utils",
    "torch_tpu._internal.utils.log_utils": _IMPL + "log_utils",
    "torch_tpu._internal.utils.hardware": _IMPL + "hardware",
    "torch_tpu._internal.utils.benchmarking": _IMPL + "benchmarking",
    "torch_tpu._internal.utils.annotations": _IMPL + "api_stages",
    "torch_tpu._internal.compiler_options": "tpu_debug.runtime.xla_options",
    "torch_tpu._internal.device": "",
    "torch_tpu._internal.device._device_module": _IMPL + "device_module",
    "torch_tpu._internal.device._device_ops_backend": _IMPL + "device_ops_backend",
    "torch_tpu._internal.stream": "",
    "torch_tpu._internal.stream.streams": _IMPL + "streams",
    "torch_tpu._internal.device_utils": "",
    "torch_tpu._internal.device_utils.annotations": _IMPL + "annotations",
    "torch_tpu._internal.distributed": "",
    "torch_tpu._internal.distributed.multiprocessing": _IMPL + "multiprocessing",
    "torch_tpu._internal.distributed.launchers": "",
    "torch_tpu._internal.distributed.launchers.singlehost_wrapper": _IMPL + "launcher",
    "torch_tpu._internal.distributed.launchers.multihost_wrapper": _IMPL + "multihost",
    "torch_tpu._internal.distributed.tpu_topology": _IMPL + "topology",
    "torch_tpu._internal.shims": "",
    "torch_tpu._internal.shims.xprof": "",
    "torch_tpu._internal.shims.pyglib": "",
    "torch_tpu._internal.shims.pyglib.contrib": "",
    "torch_tpu._internal.shims.pyglib.contrib.g3_multiprocessing": _IMPL + "multiprocessing",
    "torch_tpu._internal.shims.pyglib.contrib.g3_multiprocessing.g3_multiprocessing": _IMPL + "multiprocessing",
    "torch_tpu._internal.shims.xprof.traceme": _IMPL + "traceme",
    "torch_tpu._internal.shims.xprof.xprof_session": _IMPL + "xprof",
    "torch_tpu._internal.shims.xprof.xprof_analysis_client": _IMPL + "xprof",
    "torch_tpu._internal.profiler.xprof_adapter": _IMPL + "xprof",
    "torch_tpu._internal.shims.mlcompass": "",
    "torch_tpu._internal.shims.mlcompass.benchmark_data": _IMPL + "services",
    "torch_tpu._internal.shims.mlcompass.export_lib_borg": _IMPL + "services",
    "torch_tpu._internal.benchmarks": "",
    "torch_tpu._internal.benchmarks.export_adapter": _IMPL + "services",
    "torch_tpu._internal.distributed.gpu_env": _IMPL + "services",
    "torch_tpu._internal.utils.device_utils": _IMPL + "device_utils",
    "torch_tpu._internal.torchbenchmark": "",
    "torch_tpu._internal.torchbenchmark.device_utils": _IMPL + "device_utils",
}
_ROOT = "torch_tpu"
MARKER = "__tpu_debug_shim__"


def _ours() -> bool:
    root = sys.modules.get(_ROOT)
    return root is not None and getattr(root, MARKER, False)


def _children(name: str) -> list[str]:
    prefix = name + "."
    return sorted(n[len(prefix):] for n in MODULES if n.startswith(prefix) and "." not in n[len(prefix):])


class _TorchTpuModule(type(sys)):
    """One TorchTPU module: its names are those of its implementation module (read when first
    asked for, so importing a package stays cheap), and the modules listed under it load when
    first read as attributes (``torch_tpu._internal.pallas`` after ``import torch_tpu``), as
    TorchTPU's do. Assigning a name the implementation holds as a property (``execution_mode.
    eager_mode = mode``) sets it there."""

    def __init__(self, name: str, impl: str) -> None:
        super().__init__(name, f"TorchTPU's {name}, served by tpu_debug's runtime (TorchTPU is not installed).")
        object.__setattr__(self, "_tpu_debug_impl_name", impl)
        if _children(name):
            object.__setattr__(self, "__path__", [])
        if name == _ROOT:
            object.__setattr__(self, MARKER, True)

    def _tpu_debug_impl(self):
        name = object.__getattribute__(self, "_tpu_debug_impl_name")
        if not name:
            return None
        import importlib

        return importlib.import_module(name)

    def __getattr__(self, attr: str):
        child = f"{self.__name__}.{attr}"
        if child in MODULES:
            import importlib

            return importlib.import_module(child)
        impl = self._tpu_debug_impl()
        if impl is not None and not (attr.startswith("__") and attr.endswith("__")):
            try:
                return getattr(impl, attr)
            except AttributeError:
                pass
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __setattr__(self, attr: str, value) -> None:
        impl = self._tpu_debug_impl() if not attr.startswith("__") else None
        if impl is not None and hasattr(type(impl), attr) and hasattr(getattr(type(impl), attr), "__set__"):
            setattr(impl, attr, value)
            return
        super().__setattr__(attr, value)

    def __dir__(self):
        impl = self._tpu_debug_impl()
        names = set(super().__dir__()) | set(_children(self.__name__))
        if impl is not None:
            names |= set(getattr(impl, "__all__", ())) or {n for n in dir(impl) if not n.startswith("_")}
        return sorted(names)


class _Loader:
    """Makes one TorchTPU module (see :class:`_TorchTpuModule`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.impl = MODULES[name]

    def create_module(self, spec):
        return _TorchTpuModule(self.name, self.impl)

    def exec_module(self, module) -> None:
        impl = module._tpu_debug_impl()
        if impl is not None:
            # the names a star import and a reader of ``__all__`` see, and the file a caller
            # looking beside the module finds (``Path(torch_tpu.__file__).parent``)
            if hasattr(impl, "__all__"):
                object.__setattr__(module, "__all__", list(impl.__all__))
            if getattr(impl, "__file__", None):
                object.__setattr__(module, "__file__", impl.__file__)

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
        return bool(_children(fullname))


class _Finder:
    """The end of ``sys.meta_path``: TorchTPU's module names, when no real TorchTPU answers."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MODULES or (fullname != _ROOT and not _ours()):
            return None
        import importlib.util

        loader = _Loader(fullname)
        return importlib.util.spec_from_loader(fullname, loader, is_package=loader.is_package(fullname))

    def invalidate_caches(self) -> None:
        return None


_FINDER = _Finder()


def installed_elsewhere() -> bool:
    """Whether a ``torch_tpu`` other than the modules served here is installed (found on
    ``sys.path``, as a real TorchTPU is): ``importlib.util.find_spec("torch_tpu")`` cannot tell,
    since this finder answers it too."""
    import importlib.machinery

    return importlib.machinery.PathFinder.find_spec(_ROOT) is not None


def install() -> None:
    """Append the finder to ``sys.meta_path`` (once; idempotent)."""
    if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.append(_FINDER)


install()
