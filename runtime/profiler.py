"""``torch.profiler`` on the ``tpu`` device: the runtime's work as profiler ranges.

While a ``torch.profiler.profile`` (or ``torch.autograd.profiler.profile``)
session records, a probe (:class:`ProfilerProbe`) is subscribed to the runtime
and turns each compile, program run and host<->device copy into a
``record_function`` range on the thread that did it:

==============================  ============================================
range name                      what ran
==============================  ============================================
``tpu::<name>``                 an executable: an eager op (``mm``) or a lazy
                                or compiled graph's program
``tpu::compile::<name>``        its compile (or its read-back from the
                                persistent compile cache)
``tpu::<direction>::<op>``      a copy (``tpu::h2d::_to_copy``, ``tpu::d2h::...``)
==============================  ============================================

so ``prof.export_chrome_trace()`` holds them nested under the aten ops that
caused them, and ``prof.key_averages()`` counts and times them by name. The
probe is subscribed when the profiler starts recording and unsubscribed when it
stops (hooks on ``torch.autograd.profiler.profile``, which both profiler APIs
run): with no profiler running, the runtime has no probe and pays nothing.

TorchTPU's ``torch.tpu.profiler.TpuProfilerConfig`` is accepted as the
profiler's ``experimental_config``; see :class:`TpuProfilerConfig` for what
each argument does here.

The device itself has no events in PyTorch's profiler. PyTorch takes a device's
activity from C++ only: a kineto ``IActivityProfiler`` registered for PrivateUse1
(what ``ProfilerActivity.TPU``, PyTorch's name for the renamed PrivateUse1, turns
on) or PrivateUse1 profiler stubs (what ``torch.autograd.profiler.profile(use_device=
"tpu")`` calls at each range); a Python backend can register neither, and no Python
call adds an event to a running session. So a session that asks for the device
(:func:`_asks_for_the_device`: ``torch.profiler.profile()``'s default activities do),
saw the runtime run programs and writes no JAX trace ends with one
:class:`NoDeviceTraceWarning` naming where the device's timeline is (a session that ran
nothing on `tpu`, a CPU job's, is told nothing); and a legacy ``use_device="tpu"``
session, whose stubs would fail at every range (a C++ warning each, and garbage
times), records as a CPU session instead.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch.autograd import profiler as _autograd_profiler
from torch.autograd.profiler import ProfilerState

from tpu_debug.core.records import CompileInfo, TransferInfo
from tpu_debug.core.errors import TpuArgumentError, TraceActiveError
from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed.rank_state import is_library

__all__ = ["NoDeviceTraceWarning", "ProfilerProbe", "TpuProfilerConfig", "install_profiler_hooks"]

_LEVELS = {"host_tracer_level": (0, 3), "device_tracer_level": (0, 1), "python_tracer_level": (0, 1)}
# below this host tracer level the runtime's own ranges are left out (TorchTPU: 1 is
# "user-instrumented ranges only", 2 adds the XLA runtime's)
_RUNTIME_RANGES_LEVEL = 2


class TpuProfilerConfig(torch.profiler._ExperimentalConfig):
    """TorchTPU's profiler configuration, passed as ``experimental_config``.

    Args:
        host_tracer_level: 0 or 1: no ``tpu::`` ranges (only the user's
            ``record_function`` ranges and the aten ops); 2 (default) or 3:
            compiles, program runs and copies as ranges.
        device_tracer_level: 1 (default) with ``run_dir``: a JAX profiler trace
            (XPlane, for TensorBoard or XProf) of the same window is written under
            ``run_dir``; 0: none.
        python_tracer_level: JAX's Python tracer level for that trace (0 or 1).
        run_dir: where the JAX trace goes; None: no JAX trace.
        worker_rank: added to the trace's metadata as ``tpu_worker_rank``.
        experimental_options: TorchTPU's backend options; this runtime has none, so
            any raises unless ``check_experimental_options`` is False (then ignored).
        check_experimental_options: refuse unknown experimental options.

    Raises:
        TpuArgumentError: a level out of range, a ``worker_rank`` that is not a
            string or holds ``:``, ``,``, ``"`` or ``\\``, or an experimental option.
        TraceActiveError: (when the profiler starts) ``run_dir`` given while another
            JAX trace runs; the profiler then does not start.

    Example::

        cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir="prof")
        with torch.profiler.profile(experimental_config=cfg) as prof:
            step()
    """

    def __init__(
        self,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        run_dir: os.PathLike[str] | str | None = None,
        worker_rank: str | None = None,
        experimental_options: Mapping[str, int | bool | str] | None = None,
        check_experimental_options: bool = True,
    ) -> None:
        levels = {
            "host_tracer_level": host_tracer_level,
            "device_tracer_level": device_tracer_level,
            "python_tracer_level": python_tracer_level,
        }
        for name, value in levels.items():
            low, high = _LEVELS[name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise TpuArgumentError(f"{name} must be an integer from {low} to {high}, got {value!r}")
        if worker_rank is not None:
            if not isinstance(worker_rank, str):
                raise TpuArgumentError(f"worker_rank must be a string, got {type(worker_rank).__name__}")
            if ":" in worker_rank or "," in worker_rank:
                raise TpuArgumentError(f"worker_rank cannot contain ':' or ',': {worker_rank!r}")
            if '"' in worker_rank or "\\" in worker_rank:
                # kineto writes trace metadata into the chrome trace unescaped
                raise TpuArgumentError(f"worker_rank cannot contain '\"' or '\\': {worker_rank!r}")
        if experimental_options and check_experimental_options:
            raise TpuArgumentError(
                f"experimental_options {sorted(experimental_options)} are TorchTPU backend options; "
                "tpu_debug's runtime has none. Drop them, or pass check_experimental_options=False "
                "to ignore them"
            )
        super().__init__()
        self.host_tracer_level = host_tracer_level
        self.device_tracer_level = device_tracer_level
        self.python_tracer_level = python_tracer_level
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.worker_rank = worker_rank


class ProfilerProbe:
    """A probe that opens a ``record_function`` range at each begin notification and
    closes it at the matching end.

    An activity that raised sends no end: its range stays open until the next end of
    an enclosing activity on that thread, or :meth:`close_all`, closes it (a range
    is always closed before the one it is nested in, as the profiler requires).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self.runs = 0  # executables run while subscribed: whether a session saw device work

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _open(self, kind: str, name: str) -> None:
        rf = _autograd_profiler.record_function(name)
        rf.__enter__()
        self._stack().append((kind, rf))

    def _close(self, kind: str) -> None:
        stack = self._stack()
        if not any(k == kind for k, _ in stack):
            return  # begun before this probe subscribed
        while stack:
            k, rf = stack.pop()
            rf.__exit__(None, None, None)
            if k == kind:
                return

    def close_all(self) -> None:
        """Close this thread's open ranges (innermost first)."""
        stack = self._stack()
        while stack:
            stack.pop()[1].__exit__(None, None, None)

    def on_execute_begin(self, mode: str, name: str, key: Any) -> None:
        self.runs += 1
        self._open("execute", f"tpu::{name}")

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        self._close("execute")

    def on_compile_begin(self, mode: str, name: str) -> None:
        self._open("compile", f"tpu::compile::{name}")

    def on_compile(self, info: CompileInfo) -> None:
        if not info.replayed:
            self._close("compile")

    def on_transfer_begin(self, direction: str, op: str) -> None:
        self._open("transfer", f"tpu::{direction}::{op}")

    def on_transfer(self, info: TransferInfo) -> None:
        self._close("transfer")


class _Sessions:
    """The profiler sessions recording now: the first subscribes the probe, the last
    unsubscribes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[int] = set()  # id() of each recording profiler
        self.probe: ProfilerProbe | None = None
        self.jax_traces: dict[int, str] = {}
        self.runs_at_start: dict[int, int] = {}  # id() of a session -> the probe's runs when it began


_sessions = _Sessions()


def _config(prof: Any) -> TpuProfilerConfig | None:
    cfg = getattr(prof, "experimental_config", None)
    return cfg if isinstance(cfg, TpuProfilerConfig) else None


def _start_jax_trace(prof: Any) -> None:
    """Start the JAX trace a TpuProfilerConfig asks for, before the profiler records, so a
    refusal leaves the profiler off."""
    cfg = _config(prof)
    if cfg is None or cfg.run_dir is None or cfg.device_tracer_level < 1:
        return
    import jax.profiler

    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = cfg.host_tracer_level
    options.python_tracer_level = cfg.python_tracer_level
    try:
        jax.profiler.start_trace(cfg.run_dir, profiler_options=options)
    except RuntimeError as exc:  # JAX runs one trace per process
        raise TraceActiveError(
            f"TpuProfilerConfig(run_dir={cfg.run_dir!r}) cannot start a JAX trace: {exc}. "
            "Stop the other JAX trace (tpu_debug's tensorboard capture, jax.profiler), or "
            "drop run_dir"
        ) from None
    _sessions.jax_traces[id(prof)] = cfg.run_dir


class NoDeviceTraceWarning(UserWarning):
    """A ``torch.profiler`` session asked for the `tpu` device's activity, which it cannot
    record here (see the module)."""


def _asks_for_the_device(prof: Any) -> bool:
    """Whether ``prof`` (a ``torch.autograd.profiler.profile``) asks for the `tpu` device's
    activity: ``ProfilerActivity.TPU`` (``PrivateUse1``) in ``torch.profiler.profile``'s
    activities, or ``use_device="tpu"``."""
    return prof.use_device is not None and prof.use_device == torch._C._get_privateuse1_backend_name()


def _no_device_trace_message(prof: Any) -> str:
    if prof.use_cpu:
        ranges = "its compiles, runs and copies are the host ranges tpu::<name> of this profile"
    else:
        ranges = ("without ProfilerActivity.CPU this profile is empty; with it, the runtime's compiles, runs "
                  "and copies are host ranges tpu::<name>")
    return ("torch.profiler records no tpu device activity: tpu_debug's runtime is a Python backend, and PyTorch "
            f"takes a device's events only from a C++ profiler plugin; {ranges}. For the device's timeline use "
            "tpu_debug.trace(tensorboard=True) and `tpu-debug tensorboard`, or "
            "experimental_config=torch.tpu.profiler.TpuProfilerConfig(run_dir=...)")


def _user_stacklevel() -> int:
    """The ``stacklevel`` naming the innermost frame of the user's code, for a warning raised
    by the caller of this function."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and is_library(frame.f_code):
        frame, level = frame.f_back, level + 1
    return level


def _prepare_session(prof: Any) -> None:
    """Before a session is set up: a legacy ``use_device="tpu"`` session records as a CPU one
    (PyTorch's PrivateUse1 stubs, which it would call at each range, exist only in C++)."""
    if _asks_for_the_device(prof) and prof.profiler_kind == ProfilerState.KINETO_PRIVATEUSE1_FALLBACK:
        prof.profiler_kind = ProfilerState.KINETO


def _tell_no_device_trace(prof: Any, ran: bool) -> None:
    """At a session's end: say that the device work it saw has no device events, where the
    session asked for them and writes no JAX trace of its own."""
    if not ran or not _asks_for_the_device(prof):
        return
    cfg = _config(prof)
    if cfg is None or cfg.run_dir is None or cfg.device_tracer_level < 1:
        warnings.warn(_no_device_trace_message(prof), NoDeviceTraceWarning, stacklevel=_user_stacklevel())


def _session_started(prof: Any) -> None:
    cfg = _config(prof)
    with _sessions.lock:
        _sessions.active.add(id(prof))
        ranges = cfg is None or cfg.host_tracer_level >= _RUNTIME_RANGES_LEVEL
        if ranges and _sessions.probe is None:
            _sessions.probe = ProfilerProbe()
            probes.subscribe(_sessions.probe)
        if _sessions.probe is not None:
            _sessions.runs_at_start[id(prof)] = _sessions.probe.runs
    if cfg is not None and cfg.worker_rank is not None:
        torch.autograd._add_metadata_json("tpu_worker_rank", json.dumps(cfg.worker_rank))


def _session_stopping(prof: Any) -> None:
    probe = _sessions.probe
    if probe is not None:
        probe.close_all()


def _session_stopped(prof: Any) -> None:
    with _sessions.lock:
        _sessions.active.discard(id(prof))
        at_start = _sessions.runs_at_start.pop(id(prof), None)
        ran = at_start is not None and _sessions.probe is not None and _sessions.probe.runs > at_start
        probe = _sessions.probe if not _sessions.active else None
        _sessions.probe = None if probe is not None else _sessions.probe
    if probe is not None:
        probes.unsubscribe(probe)
        probe.close_all()
    _stop_jax_trace(prof)
    _tell_no_device_trace(prof, ran)


def _stop_jax_trace(prof: Any) -> None:
    if _sessions.jax_traces.pop(id(prof), None) is not None:
        import jax.profiler

        jax.profiler.stop_trace()


def install_profiler_hooks() -> None:
    """Wrap ``torch.autograd.profiler.profile``'s set-up, start and stop of recording (which
    ``torch.profiler.profile`` uses too) so a session subscribes the probe (idempotent).

    The three methods are where the profiler sets up a session and turns recording on and
    off; PyTorch has no Python callback for those, so they are wrapped: set-up adjusts the
    session before the original runs, start subscribes after it, stop runs around it."""
    cls = _autograd_profiler.profile
    if getattr(cls, "_tpu_debug_hooked", False):
        return
    prepare, start, exit_ = cls._prepare_trace, cls._start_trace, cls.__exit__

    def _prepare_trace(self):
        _prepare_session(self)
        prepare(self)

    def _start_trace(self):
        _start_jax_trace(self)
        try:
            start(self)
        except BaseException:
            _stop_jax_trace(self)
            raise
        _session_started(self)

    def __exit__(self, exc_type, exc_val, exc_tb):
        if id(self) not in _sessions.active:
            return exit_(self, exc_type, exc_val, exc_tb)
        _session_stopping(self)
        try:
            return exit_(self, exc_type, exc_val, exc_tb)
        finally:
            _session_stopped(self)

    cls._prepare_trace = _prepare_trace
    cls._start_trace = _start_trace
    cls.__exit__ = __exit__
    cls._tpu_debug_hooked = True
