"""``torch_tpu._internal.profiler`` (``._api``, ``._impl``, ``.profiler_api``,
``.profiler_config``) and ``torch_tpu.profiler``: TorchTPU's profiling context, over
``torch.profiler`` and the JAX profiler.

``profile(activities, on_trace_ready)`` asks ``on_trace_ready`` for the directory first
(``xprof_trace_handler(dir_name)`` returns it), then records a JAX profiler trace there
(XPlane: ``plugins/profile/<run>/*.xplane.pb``, for TensorBoard and XProf) with TorchTPU's
tracer levels for the activities (:func:`_get_profile_options`): ``ProfilerActivity.TPU``
the device's work, ``ProfilerActivity.CPU`` the host's and Python's. ``CPU`` also records the
aten ops and the runtime's ranges with ``torch.profiler`` and writes them as a Chrome trace
there. ``start_server(port)`` starts JAX's profiler server for an on-demand capture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import torch
from tpu_debug.core.errors import TpuArgumentError, TraceActiveError
from tpu_debug.runtime.profiler import TpuProfilerConfig

__all__ = ["ProfilerActivity", "TpuProfilerConfig", "profile", "register_kineto_backend", "start_server",
           "stop_server", "xprof_trace_handler"]


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


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """TorchTPU's tracer levels for a set of activities."""

    host_tracer_level: int
    device_tracer_level: int
    python_tracer_level: int


def _get_profile_options(activities: list[ProfilerActivity]) -> ProfileOptions:
    """The tracer levels TorchTPU's ``profile`` records ``activities`` with: the device tracer
    for ``TPU``, the host (level 2) and Python tracers for ``CPU``."""
    cpu, tpu = ProfilerActivity.CPU in activities, ProfilerActivity.TPU in activities
    return ProfileOptions(host_tracer_level=2 if cpu else 0, device_tracer_level=1 if tpu else 0,
                          python_tracer_level=1 if cpu else 0)


@contextlib.contextmanager
def profile(activities: list[ProfilerActivity] | None = None,
            on_trace_ready: Callable[[Any], str] | None = None) -> Iterator[Any]:
    """Record the block (TorchTPU's ``profiler.profile``); see the module for what goes where.

    Args:
        activities: ``ProfilerActivity`` members; None: CPU and TPU.
        on_trace_ready: gives the directory (``xprof_trace_handler(dir_name)``).

    Raises:
        TpuArgumentError: no ``on_trace_ready``, or ``ProfilerActivity.GPU``.
        TraceActiveError: another JAX trace runs in this process.
    """
    if on_trace_ready is None:
        raise TpuArgumentError("profile() needs on_trace_ready: pass on_trace_ready=xprof_trace_handler(dir_name)")
    wanted = list((ProfilerActivity.CPU, ProfilerActivity.TPU) if activities is None else activities)
    if ProfilerActivity.GPU in wanted:
        raise TpuArgumentError("GPU profiling is not supported. Profile ProfilerActivity.CPU and TPU")
    directory = on_trace_ready(None)
    os.makedirs(directory, exist_ok=True)
    levels = _get_profile_options(wanted)
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = levels.host_tracer_level
    options.python_tracer_level = levels.python_tracer_level
    try:
        jax.profiler.start_trace(directory, profiler_options=options)
    except RuntimeError as exc:  # JAX runs one trace per process
        raise TraceActiveError(f"profile() cannot start a JAX trace: {exc}. Stop the other JAX trace first") from None
    _profile_state.active = True
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    experimental_config=TpuProfilerConfig(run_dir=None)) as prof:
            yield prof
    finally:
        _profile_state.active = False
        jax.profiler.stop_trace()
    if ProfilerActivity.CPU in wanted:
        prof.export_chrome_trace(os.path.join(directory, f"trace.{os.getpid()}.json"))


class _ProfileState:
    """Whether :func:`profile` records now (TorchTPU's tests reset it between tests)."""

    active = False

    def reset(self) -> None:
        self.active = False


_profile_state = _ProfileState()

# the server start_server runs (JAX's), None when none does
_profiler_server: Any = None


def start_server(port: int) -> None:
    """Start the profiler server on ``port`` (JAX's, which XProf and TensorBoard's capture
    connect to for an on-demand trace of this process).

    Raises:
        TpuArgumentError: a server already runs in this process.
    """
    global _profiler_server
    if _profiler_server is not None:
        raise TpuArgumentError("start_server: a profiler server already runs in this process; call stop_server() "
                               "first")
    _profiler_server = jax.profiler.start_server(int(port))


def stop_server() -> None:
    """Stop the server :func:`start_server` started (nothing if none runs)."""
    global _profiler_server
    if _profiler_server is not None:
        _profiler_server = None
        jax.profiler.stop_server()


def register_kineto_backend() -> None:
    """TorchTPU registers its device tracer with PyTorch's profiler here; this runtime's device
    work reaches ``torch.profiler`` through :class:`TpuProfilerConfig` (``experimental_config``),
    registered with the device, so there is nothing more to register."""
