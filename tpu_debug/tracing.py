"""``tpu_debug.trace()``: record everything the runtime does inside a block (or a function)."""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import inspect
import os
import platform as _platform
import signal
import socket
import sys
import threading
import time
from importlib import metadata as _metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from tpu_debug.core import options as _options
from tpu_debug.core.errors import ConfigError, TpuDebugError, TraceActiveError
from tpu_debug.core.version import __version__
from tpu_debug.runs import new_run_dir
from tpu_debug.runtime import start
from tpu_debug.runtime.distributed.launch import process_info
from tpu_debug.runtime.target import require_libtpu
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.session import Session
from tpu_debug.trace_config import TraceConfig
from tpu_debug.trace_signals import (
    HANDLERS,
    GiveUp,
    HeldSignals,
    Terminated,
    hold_unraisable,
    release_unraisable,
    resender,
    say,
    without_handler_frame,
)
from tpu_debug.tracer_parts import PARTS, Running, TracerPart, start_order, stop_all
from tpu_debug.tracers.events import ProcessEvent
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording.recorder import Recorder
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import DB_NAME

__all__ = ["Terminated", "Trace", "active_trace", "step", "trace"]

_lock = threading.Lock()
_active: Trace | None = None

# how ``tpu-debug run`` reports a script that Ctrl-C or SIGTERM ended: 128 + the signal
_STATUS_OF_EXIT = {128 + signal.SIGINT: "interrupted", 128 + signal.SIGTERM: "terminated"}


def active_trace() -> Trace | None:
    """The trace that is recording now, if any."""
    return _active


def _version(dist: str, module: str) -> str:
    mod = sys.modules.get(module)
    version = getattr(mod, "__version__", None) if mod is not None else None
    if version:
        return str(version)
    try:
        return _metadata.version(dist)
    except _metadata.PackageNotFoundError:
        return "not installed"


def _platform_info() -> dict[str, Any]:
    import jax

    devices = jax.devices()
    return {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }


def run_metadata(name: str, config: TraceConfig) -> dict[str, Any]:
    """The metadata a new run starts with."""
    return {
        "name": name,
        "tpu_debug_version": __version__,
        "torch_version": _version("torch", "torch"),
        "jax_version": _version("jax", "jax"),
        "jaxlib_version": _version("jaxlib", "jaxlib"),
        "python_version": _platform.python_version(),
        **_platform_info(),
        "argv": list(sys.argv),
        "command": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "start_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
        "status": "running",
        "options": config.as_dict(),
    }


@atexit.register
def _close_at_exit() -> None:
    # a trace entered by hand and never exited still gets its final flush
    if _active is not None:
        _active.__exit__(None, None, None)


def _default_name(origin: Any) -> str:
    if origin is not None and not origin.file.startswith("<"):
        return Path(origin.file).stem
    if sys.argv and sys.argv[0] and sys.argv[0] not in ("-c", "-m"):
        return Path(sys.argv[0]).stem
    return "trace"


class Trace(contextlib.ContextDecorator):
    """A recording: ``with trace() as session`` or ``@trace()``. Use :func:`trace` to make one."""

    def __init__(self, config: TraceConfig, *, target: Target | None = None) -> None:
        self.config = config
        # the TPU target, parsed once here (or by trace(), which names the option in its error):
        # the tracers and the runtime take the parsed Target
        self.target = target if target is not None else config.target_spec()
        self.session: Session | None = None
        self.origin = None
        self._recorder: Recorder | None = None
        self._writer: RunWriter | None = None
        self._start = 0.0
        self._running: Running | None = None  # what the started parts share (tracer_parts.py)
        self._parts: list[TracerPart] = []  # the parts started (or starting), to be stopped
        self._saved_handlers: dict[int, Any] = {}  # signal handlers to put back when the trace ends

    def _recreate_cm(self) -> Trace:
        # as a decorator, each call is its own run
        return Trace(self.config, target=self.target)

    def __enter__(self) -> Session:
        global _active
        origin = user_location(2)
        if threading.current_thread() is threading.main_thread():
            resender.start()
        held = HeldSignals().hold()
        try:
            with _lock:
                if _active is not None:
                    where = (
                        f" (started at {_active.origin})"
                        if _active.origin is not None
                        else " (started outside your code, e.g. by 'tpu-debug run')"
                    )
                    raise TraceActiveError(
                        f"a trace is already recording{where}; tpu_debug records one trace at a time. "
                        "End it before starting another."
                    )
                _active = self
        except BaseException:
            held.release()
            raise
        try:
            self.origin = origin
            self._start_all(origin)
            for sig, (default, ours) in HANDLERS.items():
                # SIGTERM unwinds the program like Ctrl-C, so the run is closed and says why it
                # ended; a program's own handler is left in charge
                if held.previous.get(sig) in (default, ours):
                    self._saved_handlers[sig] = default
                    held.previous[sig] = ours
            if self._saved_handlers:
                hold_unraisable()
        except BaseException as exc:
            try:
                self._finish(*self._ending(type(exc), exc, setting_up=True), held)
            finally:
                with _lock:
                    _active = None
                held.release()
            raise
        try:
            held.release()  # a signal held during set-up ends the run now that it is fully started
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self.session

    def _start_all(self, origin: Any) -> None:
        name = self.config.name or _default_name(origin)
        run_dir = new_run_dir(self.config.logdir, name)
        self._writer = RunWriter(run_dir / DB_NAME, run_metadata(name, self.config))
        self._recorder = Recorder(self._writer, hlo=self.config.hlo, op_events=self.config.op_events)
        # time.perf_counter() at the run's time 0 (CLOCK_MONOTONIC on Linux, shared by every
        # process of the machine): lines the run's timestamps up with other clocks
        self._writer.set_meta(clock_origin=time.perf_counter() - self._recorder.clock())
        self._record_process()
        self.session = Session(run_dir / DB_NAME, flush=self._writer.flush)
        self._start = time.perf_counter()
        running = self._running = Running(self.config, self.target, self._writer, self._recorder, self.session, say)
        for part in start_order([p for p in PARTS if p.applies(running)]):
            self._parts.append(part)  # stopped even when its start fails half-way
            part.start(running)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        global _active
        if exc is not None and isinstance(exc, (KeyboardInterrupt, Terminated)):
            exc.with_traceback(without_handler_frame(tb))
        held = HeldSignals().hold()
        try:
            self._finish(*self._ending(exc_type, exc), held)
        finally:
            with _lock:
                _active = None
            # the defaults go back where ours are still in place: a handler set during the run stays
            saved, self._saved_handlers = self._saved_handlers, {}
            restore = {sig: h for sig, h in saved.items() if held.previous.get(sig) is HANDLERS[sig][1]}
            if saved:
                release_unraisable()
            held.release(restore)

    def _ending(
        self, exc_type: Any, exc: BaseException | None, *, setting_up: bool = False
    ) -> tuple[str, int | None, str | None]:
        """(status, exit status, error) of the run that ``exc`` (or the program's exit status) ends."""
        session = self.session
        exit_status = session._exit_status if session is not None else None
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            return "interrupted", exit_status, "KeyboardInterrupt"
        if exc_type is not None and issubclass(exc_type, Terminated):
            return "terminated", 128 + signal.SIGTERM, "SIGTERM"
        if exc_type is not None and issubclass(exc_type, SystemExit) and not setting_up:
            code = exc.code if exc is not None else None
            exit_status = code if isinstance(code, int) else (0 if code is None else 1)
            return ("finished" if exit_status == 0 else "failed"), exit_status, None
        if exc_type is not None:
            error = f"{exc_type.__name__}: {exc}"
            return "failed", exit_status, (f"trace() could not start: {error}" if setting_up else error)
        if exit_status is not None and exit_status != 0:
            error = session._exit_error if session is not None else None
            return _STATUS_OF_EXIT.get(exit_status, "failed"), exit_status, error
        return "finished", exit_status, None

    def _finish(self, status: str, exit_status: int | None, error: str | None, held: HeldSignals) -> None:
        """Stop everything started, newest first, then write the run's end and close it."""
        parts, self._parts = self._parts, []
        if self._running is not None:
            self._running.closing = (status, held)
            # newest first (tracer_parts.stop_order): leaving lazy mode runs what is pending, which
            # the tracers record; each stop runs even when another failed
            stop_all(parts, self._running)
        writer = self._writer
        if writer is not None:
            final = {
                "status": status,
                "exit_status": exit_status,
                "error": error,
                "end_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
                "duration": time.perf_counter() - self._start if self._start else 0.0,
            }
            held.waiting(writer.path)
            try:
                writer.close(final)
            except GiveUp:
                say(
                    f"tpu_debug: stopped waiting for the run to be written; {writer.path} keeps what was "
                    "committed before, and without its end it reads as 'killed'."
                )
            else:
                if writer.error is not None:
                    err = writer.error
                    # the store's own errors already name the file, what was kept and the fix
                    text = str(err) if isinstance(err, TpuDebugError) else (
                        f"recording to {writer.path} stopped early ({type(err).__name__}: {err}); "
                        "the run holds what was written before."
                    )
                    print(f"tpu_debug: {text}", file=sys.stderr)
            finally:
                held.waiting(None)
        if self.session is not None:
            self.session._detach()

    def _record_process(self) -> None:
        """In a multi-process run, this process's rank (the run's identity within its group)."""

        info, writer = process_info(), self._writer
        if info is not None:
            writer.put(ProcessEvent(writer.new_id(), self._recorder.clock(), None, threading.get_native_id(),
                                    None, **info))

    def mark_step(self) -> None:
        """End the current step (see :func:`step`); the tracers that work per step hear it
        from the step tracker."""
        steps = self._running.steps if self._running is not None else None
        if steps is not None:
            steps.mark()


def trace(**options: Any) -> Trace:
    """Record what the ``tpu`` runtime does, into a run directory.

    Use as ``with tpu_debug.trace() as session:`` (the session answers queries
    during and after the block) or as a decorator ``@tpu_debug.trace()`` (one
    run per call). Options are keyword-only, one per trace option of
    :mod:`tpu_debug.core.options` (listed below); one left out or ``None`` comes from
    its ``TPU_DEBUG_*`` environment variable, then its default.

    While it records in the main thread, SIGTERM unwinds the program as Ctrl-C
    does (it raises :class:`Terminated`, exit status 143) unless the program set
    its own SIGTERM handler, and the run ends with status ``"terminated"``
    (``"interrupted"`` for Ctrl-C). Signals arriving while the run is set up or
    closed are delivered once that is done; a second one during the close stops
    waiting for the run to be written. See docs/reliability.md.

    The first trace (or op) of a process prepares the runtime
    (``tpu_debug.runtime.start()``); a trace also checks every ``TPU_DEBUG_*``
    option variable first, so a bad one stops it before anything runs.

    Args:
{options}
    Returns:
        A :class:`Trace` context manager / decorator.

    Raises:
        ConfigError: an option or ``TPU_DEBUG_*`` variable has a bad value (a
            target spec naming no TPU, say).
        LibtpuMissingError: a target is asked for and libtpu is not installed.
        TraceActiveError: (on entry) another trace is recording.

    Example::

        with tpu_debug.trace(name="demo") as session:
            y = torch.randn(8, 8, device="tpu") @ torch.randn(8, 8, device="tpu")
        print(session.summary())
    """
    config = TraceConfig.from_env().override(**options)
    _options.check_env()  # the runtime's variables too: a bad one fails here, not mid-script
    if config.dry_run and config.target is None:
        raise ConfigError(
            "dry_run=True needs a TPU target to compile for: trace(dry_run=True, target='v6e'), "
            "tpu-debug run --dry-run --target v6e, or TPU_DEBUG_TARGET=v6e"
        )
    target = config.target_spec(source="target" if options.get("target") is not None else None)
    if target is not None:
        # before anything runs: a script traced with --target must not run first and fail after

        require_libtpu()
    start()
    return Trace(config, target=target)


trace.__doc__ = trace.__doc__.replace("{options}", _options.doc_entries("trace"))
trace.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None) for o in _options.options("trace")],
    return_annotation="Trace",
)


# -- step marks --------------------------------------------------------------------------


def step() -> None:
    """Mark the end of a training step in the active trace.

    Steps end automatically when ``optimizer.step()`` returns (for an optimizer
    of ``tpu`` parameters); once ``step()`` is called, only explicit marks
    count. A run with neither gets the iterations of the loop it ran as steps.
    Each step is recorded with what ran in it (``session.steps()``); the report
    shows the figures per step and tells warm-up steps from steady state. With
    ``trace(tensorboard=True)`` each step also becomes a ``StepTraceAnnotation``
    on the profile timeline and one point of the per-step scalars. Without an
    active trace it does nothing.
    With ``trace(tensorboard=True)`` each step becomes a ``StepTraceAnnotation``
    on the profile timeline and one point of the per-step scalars; with
    ``trace(target=...)``, one step of the target's step estimates. Steps end
    automatically when ``optimizer.step()`` returns; once ``step()`` is called,
    only explicit marks count. Without an active trace it does nothing.

    Example::

        with tpu_debug.trace(tensorboard=True):
            for batch in data:
                train_step(batch)
                tpu_debug.step()
    """
    active = _active
    if active is not None:
        active.mark_step()
