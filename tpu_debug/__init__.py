"""tpu_debug: see what PyTorch does on an XLA (TPU) device, op by op and compile by compile.

The ``tpu`` device is registered by ``import torch`` (a ``torch.backends`` entry point,
:mod:`tpu_debug._loader`), the way TorchTPU registers its own. ``import tpu_debug``
itself imports neither torch nor jax: each public name is imported on first use, and a
name that records (``trace``, ``compile``, ``fit``, ...) registers the device first if
autoload was off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). So a notebook or a reading verb
that only opens runs (``open_run``, ``print_report``) starts in a fraction of a second.

What the runtime needs besides happens at the device's first use (first op or first
``trace()``; ``tpu_debug.runtime.start()``): reading the ``TPU_DEBUG_*`` variables,
switching autograd's device worker thread off for that thread, and keeping JAX off libtpu
where no TPU is attached. Recording is explicit: ``with tpu_debug.trace() as session:``
or ``tpu-debug run script.py``. Options: :mod:`tpu_debug.core.options`.

PYTEST_DONT_REWRITE: pytest rewrites the asserts of a plugin distribution's packages when it
loads the plugin (:mod:`tpu_debug.pytest_plugin`); the wheel's ``.pth`` imported this package
at start-up, before that (for :mod:`tpu_debug.core.torch_tpu_finder`), and it has no asserts:
the marker keeps pytest from warning that it cannot rewrite it.
"""

from __future__ import annotations

import importlib as _importlib

from tpu_debug.core.version import __version__

__all__ = [
    "__version__",
    "trace",
    "step",
    "compile",
    "dry_run",
    "fit",
    "Trace",
    "Session",
    "open_run",
    "list_runs",
    "print_report",
    "TraceConfig",
    "TpuDebugError",
    "expect_no_recompiles",
    "transfer_guard",
    "RecompileError",
    "TransferGuardError",
]

# names that read a run store or configure: no torch, no jax
_READING = {
    "TraceConfig": "tpu_debug.trace_config",
    "TpuDebugError": "tpu_debug.core.errors",
    "RecompileError": "tpu_debug.core.errors",
    "TransferGuardError": "tpu_debug.core.errors",
    "print_report": "tpu_debug.report",
    "list_runs": "tpu_debug.runs",
    "Session": "tpu_debug.session",
    "open_run": "tpu_debug.session",
}
# names that record or run on the device: the device is registered before they are used
_RECORDING = {
    "compile": "tpu_debug.runtime.compiled",
    "dry_run": "tpu_debug.dry_runner",
    "fit": "tpu_debug.fit",
    "Trace": "tpu_debug.tracing",
    "trace": "tpu_debug.tracing",
    "step": "tpu_debug.tracing",
    "expect_no_recompiles": "tpu_debug.guards",
    "transfer_guard": "tpu_debug.guards",
}


_SUBPACKAGES = frozenset({"core", "runtime", "tracers", "tui", "cli"})


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"tpu_debug.{name}")
    if name in _RECORDING:
        _importlib.import_module("tpu_debug.runtime").install()
        module_name = _RECORDING[name]
    elif name in _READING:
        module_name = _READING[name]
    else:
        raise AttributeError(f"module 'tpu_debug' has no attribute {name!r}")
    module = _importlib.import_module(module_name)
    # a package named as the function it holds (``fit``) is bound here by its own import:
    # the attribute stays that callable package whichever way it was first reached
    value = module if module_name == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
