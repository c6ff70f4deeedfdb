"""tpu_debug: see what PyTorch does on an XLA (TPU) device, op by op and compile by compile.

``import tpu_debug`` registers the ``tpu`` device (once), and that is all it does to
the process. What the runtime needs besides happens at the device's first use (first
op or first ``trace()``; ``tpu_debug.runtime.start()``): reading the ``TPU_DEBUG_*``
variables, switching autograd's device worker thread off for that thread, and keeping
JAX off libtpu where no TPU is attached (``jax_platforms=cpu``). Recording is explicit:
``with tpu_debug.trace() as session:`` or ``tpu-debug run script.py``. Options:
:mod:`tpu_debug_core.options`.
"""

from __future__ import annotations

import sys as _sys

from tpu_debug._version import __version__

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


def _read_only() -> bool:
    """True when the ``tpu-debug`` console script runs a reading verb: see
    ``tpu_debug_launcher``. Nothing else turns it on."""
    launcher = _sys.modules.get("tpu_debug_launcher")
    return bool(getattr(launcher, "read_only", False))


if not _read_only():
    from tpu_debug.runtime import install as _install

    _install()

    from tpu_debug.config import TraceConfig
    from tpu_debug.dryrun import dry_run
    from tpu_debug.fit import fit
    from tpu_debug_core.errors import RecompileError, TpuDebugError, TransferGuardError
    from tpu_debug.guards import expect_no_recompiles, transfer_guard
    from tpu_debug.report import print_report
    from tpu_debug.runs import list_runs
    from tpu_debug.runtime.compiled import compile
    from tpu_debug.session import Session, open_run
    from tpu_debug.tracing import Trace, step, trace
else:
    # Read-only mode: the reading verbs read a run store and need neither torch
    # nor jax. The API is imported on first use; a name that needs the device registers it
    # first, so using it here ends in the same state as a plain ``import tpu_debug``.
    _READING = {
        "TraceConfig": "tpu_debug.config",
        "TpuDebugError": "tpu_debug_core.errors",
        "RecompileError": "tpu_debug_core.errors",
        "TransferGuardError": "tpu_debug_core.errors",
        "print_report": "tpu_debug.report",
        "list_runs": "tpu_debug.runs",
        "Session": "tpu_debug.session",
        "open_run": "tpu_debug.session",
    }
    _RECORDING = {
        "compile": "tpu_debug.runtime.compiled",
        "dry_run": "tpu_debug.dryrun",
        "fit": "tpu_debug.fit",
        "Trace": "tpu_debug.tracing",
        "trace": "tpu_debug.tracing",
        "step": "tpu_debug.tracing",
        "expect_no_recompiles": "tpu_debug.guards",
        "transfer_guard": "tpu_debug.guards",
    }

    def __getattr__(name: str):
        import importlib

        if name == "runtime":
            module = importlib.import_module("tpu_debug.runtime")
            module.install()
            return module
        if name in _RECORDING:
            importlib.import_module("tpu_debug.runtime").install()
            module_name = _RECORDING[name]
        elif name in _READING:
            module_name = _READING[name]
        else:
            raise AttributeError(f"module 'tpu_debug' has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
