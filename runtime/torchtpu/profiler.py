"""``torch_tpu._internal.profiler``: TorchTPU's profiling context, over ``torch.profiler`` and
the JAX profiler.

``profile(activities, on_trace_ready)`` asks ``on_trace_ready`` for the directory first
(``xprof_trace_handler(dir_name)`` returns it), then records: ``ProfilerActivity.TPU``
writes a JAX profiler trace (XPlane: ``plugins/profile/<run>/*.xplane.pb``, for TensorBoard
and XProf) of the device's work under it; ``ProfilerActivity.CPU`` records the aten ops
and the runtime's ranges with ``torch.profiler`` and writes them as a Chrome trace there.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime.profiler import TpuProfilerConfig

__all__ = ["ProfilerActivity", "TpuProfilerConfig", "profile", "xprof_trace_handler"]


class ProfilerActivity(enum.Enum):
    """What :func:`profile` records: host ops (``CPU``), the device's work (``TPU``)."""

    CPU = 1
    TPU = 2
    GPU = 3


def xprof_trace_handler(dir_name: os.PathLike[str] | str, worker_rank: str | None = None) -> Callable[[Any], str]:
    """The ``on_trace_ready`` of :func:`profile` and ``torch.profiler.profile``: where the
    trace goes.

    Args:
        dir_name: the directory (made if missing).
        worker_rank: a rank name kept in the handler (``handler.worker_rank``).

    Returns:
        A callable returning ``dir_name``; called by ``torch.profiler.profile`` with the
        finished profiler, it also writes the profiler's Chrome trace there.
    """
    path = os.fspath(dir_name)

    def handler(prof: Any = None) -> str:
        os.makedirs(path, exist_ok=True)
        if prof is not None and hasattr(prof, "export_chrome_trace"):
            name = f"trace{'' if worker_rank is None else '.' + worker_rank}.{os.getpid()}.json"
            prof.export_chrome_trace(os.path.join(path, name))
        return path

    handler.dir_name = path  # type: ignore[attr-defined]
    handler.worker_rank = worker_rank  # type: ignore[attr-defined]
    return handler


@contextlib.contextmanager
def profile(activities: list[ProfilerActivity] | None = None,
            on_trace_ready: Callable[[Any], str] | None = None) -> Iterator[Any]:
    """Record the block (TorchTPU's ``profiler.profile``); see the module for what goes where.

    Args:
        activities: ``ProfilerActivity`` members; None: CPU and TPU.
        on_trace_ready: gives the directory (``xprof_trace_handler(dir_name)``).

    Raises:
        TpuArgumentError: no ``on_trace_ready``, or ``ProfilerActivity.GPU``.
    """
    if on_trace_ready is None:
        raise TpuArgumentError("profile() needs on_trace_ready: pass on_trace_ready=xprof_trace_handler(dir_name)")
    wanted = set(activities or (ProfilerActivity.CPU, ProfilerActivity.TPU))
    if ProfilerActivity.GPU in wanted:
        raise TpuArgumentError("ProfilerActivity.GPU: there is no GPU here; profile CPU and TPU")
    directory = on_trace_ready(None)
    os.makedirs(directory, exist_ok=True)
    config = TpuProfilerConfig(run_dir=directory if ProfilerActivity.TPU in wanted else None)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config) as prof:
        yield prof
    if ProfilerActivity.CPU in wanted:
        prof.export_chrome_trace(os.path.join(directory, f"trace.{os.getpid()}.json"))
