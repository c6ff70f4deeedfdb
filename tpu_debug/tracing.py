"""``tpu_debug.trace()``: record everything the runtime does inside a block (or a function)."""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import platform as _platform
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any

from tpu_debug._version import __version__
from tpu_debug.config import TraceConfig
from tpu_debug.errors import TraceActiveError
from tpu_debug.runs import new_run_dir
from tpu_debug.session import Session
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recorder import Recorder
from tpu_debug.tracers.store import DB_NAME, RunWriter

__all__ = ["trace", "Trace", "active_trace", "step"]

_lock = threading.Lock()
_active: Trace | None = None


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


@contextlib.contextmanager
def _sigint_deferred():
    """Hold off Ctrl-C while the run is flushed, then deliver it (a second Ctrl-C
    during the final flush must not cut the run short)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not settable here (embedded interpreters)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            # deliver it here, not via raise_signal: a signal handled later could land in a
            # gc callback, where Python would swallow the KeyboardInterrupt
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


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

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.session: Session | None = None
        self.origin = None
        self._recorder: Recorder | None = None
        self._writer: RunWriter | None = None
        self._start = 0.0
        self._tensorboard: Any = None  # a TensorBoardExporter with tensorboard=True (issue 9)
        self._divergence: Any = None  # a DivergenceTracer with divergence=True (issue 8)
        self._saved_numerics: str | None = None
        self._guards: Any = None  # dynamo events, recompile and transfer guards (issue 5)

    def _recreate_cm(self) -> Trace:
        # as a decorator, each call is its own run
        return Trace(self.config)

    def __enter__(self) -> Session:
        global _active
        origin = user_location(2)
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
        try:
            self.origin = origin
            from tpu_debug.runtime import probes

            name = self.config.name or _default_name(origin)
            run_dir = new_run_dir(self.config.logdir, name)
            self._writer = RunWriter(run_dir / DB_NAME, run_metadata(name, self.config))
            self._recorder = Recorder(self._writer, hlo=self.config.hlo, op_events=self.config.op_events)
            self.session = Session(run_dir / DB_NAME, writer=self._writer)
            self._start = time.perf_counter()
            probes.subscribe(self._recorder, replay=True)
            if self.config.tensorboard:
                self._start_tensorboard(run_dir)
            self._start_divergence()
            from tpu_debug.guards import TraceGuards  # issue 5

            self._guards = TraceGuards(self.config, self._writer, self._recorder)
            self._guards.start()
        except BaseException:
            with _lock:
                _active = None
            raise
        return self.session

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        global _active
        try:
            from tpu_debug.runtime import probes

            if self._guards is not None:  # issue 5
                self._guards.stop()
                self._guards = None
            self._stop_divergence()
            if self._tensorboard is not None:
                self._stop_tensorboard()
            if self._recorder is not None:
                probes.unsubscribe(self._recorder)
            session = self.session
            exit_status = session._exit_status if session is not None else None
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                status, error = "interrupted", "KeyboardInterrupt"
            elif exc_type is not None and issubclass(exc_type, SystemExit):
                code = exc.code if exc is not None else None
                exit_status = code if isinstance(code, int) else (0 if code is None else 1)
                status, error = ("finished" if exit_status == 0 else "failed"), None
            elif exc_type is not None:
                status, error = "failed", f"{exc_type.__name__}: {exc}"
            elif exit_status is not None and exit_status != 0:
                status = "interrupted" if exit_status == 130 else "failed"
                error = session._exit_error if session is not None else None
            else:
                status, error = "finished", None
            if self._writer is not None:
                final = {
                    "status": status,
                    "exit_status": exit_status,
                    "error": error,
                    "end_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
                    "duration": time.perf_counter() - self._start,
                }
                with _sigint_deferred():
                    self._writer.close(final)
                if self._writer.error is not None:
                    err = self._writer.error
                    print(
                        f"tpu_debug: recording to {self._writer.path} stopped early "
                        f"({type(err).__name__}: {err}); the run holds what was written before.",
                        file=sys.stderr,
                    )
            if session is not None:
                session._detach()
        finally:
            with _lock:
                _active = None

    # -- TensorBoard export (issue 9) ------------------------------------------------------

    def _start_tensorboard(self, run_dir: Path) -> None:
        from tpu_debug.runtime import probes
        from tpu_debug.tracers.tensorboard import TENSORBOARD_DIR, TensorBoardExporter

        recorder, writer = self._recorder, self._writer
        try:
            exporter = TensorBoardExporter(
                run_dir / TENSORBOARD_DIR,
                max_events=self.config.tensorboard_max_events,
                clock=recorder.clock,
                record_error=recorder.record_error,
                set_meta=writer.set_meta,
            )
            exporter.start()
        except Exception as exc:  # noqa: BLE001 - the run goes on without TensorBoard
            recorder.record_error("TensorBoardExporter.start", f"{type(exc).__name__}: {exc}")
            writer.set_meta(tensorboard={"status": "failed", "notes": [f"{type(exc).__name__}: {exc}"]})
            return
        self._tensorboard = exporter
        writer.add_listener(exporter.on_event)
        probes.subscribe(exporter, replay=True)

    def _stop_tensorboard(self) -> None:
        from tpu_debug.runtime import probes

        exporter, self._tensorboard = self._tensorboard, None
        probes.unsubscribe(exporter)
        if self._writer is not None:
            self._writer.remove_listener(exporter.on_event)
        try:
            exporter.stop()
        except Exception as exc:  # noqa: BLE001 - the run itself must still be closed
            self._recorder.record_error("TensorBoardExporter.stop", f"{type(exc).__name__}: {exc}")

    # -- divergence against CPU and TPU numerics (issue 8) ------------------------------

    def _start_divergence(self) -> None:
        from tpu_debug.runtime import probes
        from tpu_debug.runtime.config import config as runtime_config

        if self.config.divergence:
            from tpu_debug.tracers.divergence import DivergenceTracer, parse_tolerances

            tracer = DivergenceTracer(
                self._writer,
                clock=self._recorder.clock,
                tolerances=parse_tolerances(self.config.tolerances),
                sample=self.config.divergence_sample,
                record_error=self._recorder.record_error,
            )
            probes.subscribe(tracer)
            self._divergence = tracer
        if self.config.numerics is not None:
            self._saved_numerics = runtime_config.numerics
            runtime_config.numerics = self.config.numerics

    def _stop_divergence(self) -> None:
        from tpu_debug.runtime import probes
        from tpu_debug.runtime.config import config as runtime_config

        tracer, self._divergence = self._divergence, None
        if tracer is not None:
            probes.unsubscribe(tracer)
            try:
                tracer.close()
            except Exception as exc:  # noqa: BLE001 - the run itself must still be closed
                self._recorder.record_error("DivergenceTracer.close", f"{type(exc).__name__}: {exc}")
        if self._saved_numerics is not None:
            runtime_config.numerics, self._saved_numerics = self._saved_numerics, None

    def mark_step(self) -> None:
        """End the current step on the TensorBoard timeline (see :func:`step`)."""
        if self._tensorboard is not None:
            self._tensorboard.step()


def trace(
    *,
    logdir: str | os.PathLike | None = None,
    name: str | None = None,
    hlo: bool | None = None,
    op_events: bool | None = None,
    tensorboard: bool | None = None,
    tensorboard_max_events: int | None = None,
    divergence: bool | None = None,
    numerics: str | None = None,
    tolerances: str | Mapping[str, Any] | None = None,
    divergence_sample: int | None = None,
    storm_threshold: int | None = None,
    fail_on_recompile: bool | None = None,
    transfer_guard: str | None = None,
    transfer_guard_implicit: str | None = None,
) -> Trace:
    """Record what the ``tpu`` runtime does, into a run directory.

    Use as ``with tpu_debug.trace() as session:`` (the session answers queries
    during and after the block) or as a decorator ``@tpu_debug.trace()`` (one
    run per call). Options left as ``None`` come from ``TPU_DEBUG_*``
    environment variables, then defaults (see :class:`TraceConfig`).

    Args:
        logdir: where runs go (default ``./tpu_debug_runs``; ``TPU_DEBUG_LOGDIR``).
        name: run name (default: the calling script's name; ``TPU_DEBUG_NAME``).
        hlo: record StableHLO and optimized HLO of every compiled program
            (default True; ``TPU_DEBUG_HLO``).
        op_events: one event per eager op execution instead of per-executable
            totals (default False; ``TPU_DEBUG_OP_EVENTS``).
        tensorboard: capture a JAX profile of the run with tpu_debug's events on
            its timeline, plus per-step scalars, into ``<run>/tensorboard/``
            (default False; ``TPU_DEBUG_TENSORBOARD``). Open it with
            ``tpu-debug tensorboard``.
        tensorboard_max_events: stop the profile capture after this many spans
            (default 100000; ``TPU_DEBUG_TENSORBOARD_MAX_EVENTS``).
        divergence: also run every op on CPU (eager) and interpret every
            compiled graph on CPU, and record where results first leave
            tolerance (default False; ``TPU_DEBUG_DIVERGENCE``). See
            ``session.first_divergence()`` and the report's "Divergence".
        numerics: ``"tpu"``: float32 matmuls and convolutions run in bfloat16
            passes as on a TPU at the precision in effect
            (``torch.tpu.precision``); ``"cpu"``: in float32. Default: leave
            the runtime's setting (``TPU_DEBUG_NUMERICS``).
        tolerances: divergence tolerances per dtype, ``{"float32": (rtol, atol)}``,
            ``"float32=1e-4:1e-6"`` or ``"off"`` (default: ``torch.testing``'s;
            ``TPU_DEBUG_TOLERANCES``).
        divergence_sample: compare every N-th node of a compiled graph
            (default 1: all; ``TPU_DEBUG_DIVERGENCE_SAMPLE``).
        storm_threshold: flag an op or graph recompiled more than this many
            times as a recompile storm, naming what keeps changing (default 5;
            ``TPU_DEBUG_STORM_THRESHOLD``).
        fail_on_recompile: raise ``RecompileError`` on the first recompile, with
            the diff in the message (default False; ``TPU_DEBUG_FAIL_ON_RECOMPILE``).
        transfer_guard: ``"allow"``, ``"log"`` or ``"disallow"`` host<->device
            transfers; disallow raises ``TransferGuardError`` naming the line
            (default "allow"; ``TPU_DEBUG_TRANSFER_GUARD``).
        transfer_guard_implicit: the same for implicit transfers only
            (``.item()``, ``print``, ``if t:``, CPU fallbacks; default "allow";
            ``TPU_DEBUG_TRANSFER_GUARD_IMPLICIT``).

    Returns:
        A :class:`Trace` context manager / decorator.

    Raises:
        ConfigError: an option or ``TPU_DEBUG_*`` variable has a bad value.
        TraceActiveError: (on entry) another trace is recording.

    Example:
        >>> with tpu_debug.trace(name="demo") as session:
        ...     y = torch.randn(8, 8, device="tpu") @ torch.randn(8, 8, device="tpu")
        >>> print(session.summary())
    """
    config = TraceConfig.from_env().override(logdir=logdir, name=name, hlo=hlo, op_events=op_events)
    config = config.override(tensorboard=tensorboard, tensorboard_max_events=tensorboard_max_events)
    config = config.override(  # issue 8
        divergence=divergence, numerics=numerics, tolerances=tolerances, divergence_sample=divergence_sample
    )
    config = config.override(  # issue 5
        storm_threshold=storm_threshold,
        fail_on_recompile=fail_on_recompile,
        transfer_guard=transfer_guard,
        transfer_guard_implicit=transfer_guard_implicit,
    )
    return Trace(config)


# -- step marks (issue 9) ----------------------------------------------------------------


def step() -> None:
    """Mark the end of a training step in the active trace.

    With ``trace(tensorboard=True)`` each step becomes a ``StepTraceAnnotation``
    on the profile timeline and one point of the per-step scalars. Steps end
    automatically when ``optimizer.step()`` returns; once ``step()`` is called,
    only explicit marks count. Without an active trace it does nothing.

    Example:
        >>> with tpu_debug.trace(tensorboard=True):
        ...     for batch in data:
        ...         train_step(batch)
        ...         tpu_debug.step()
    """
    active = _active
    if active is not None:
        active.mark_step()
