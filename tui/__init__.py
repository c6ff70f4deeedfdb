"""The terminal UI (``tpu-debug tui``): a Textual app that reads one run store.

Example::

    from tpu_debug.tui import run_app
    run_app(tpu_debug.open_run())   # the latest run
"""

from __future__ import annotations

from tpu_debug.tui.app import TpuDebugApp, run_app

__all__ = ["TpuDebugApp", "run_app"]
