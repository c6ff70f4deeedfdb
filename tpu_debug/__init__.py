"""tpu_debug: see what PyTorch does on an XLA (TPU) device, op by op and compile by compile.

``import tpu_debug`` registers the ``tpu`` device (once). Recording is explicit:
``with tpu_debug.trace() as session:`` or ``tpu-debug run script.py``.
"""

from __future__ import annotations

from tpu_debug._version import __version__
from tpu_debug.runtime import install as _install

_install()

from tpu_debug.config import TraceConfig  # noqa: E402
from tpu_debug.runtime.compiled import compile  # noqa: E402
from tpu_debug.errors import TpuDebugError  # noqa: E402
from tpu_debug.report import print_report  # noqa: E402
from tpu_debug.runs import list_runs  # noqa: E402
from tpu_debug.session import Session, open_run  # noqa: E402
from tpu_debug.tracing import Trace, trace  # noqa: E402
from tpu_debug.tracing import step  # noqa: E402  (issue 9)
from tpu_debug.errors import RecompileError, TransferGuardError  # noqa: E402  (issue 5)
from tpu_debug.guards import expect_no_recompiles, transfer_guard  # noqa: E402  (issue 5)

__all__ = [
    "__version__",
    "trace",
    "step",
    "compile",
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
