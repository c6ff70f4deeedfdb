"""The parts a trace starts and stops (the tracers, and the runtime settings a trace changes),
each declared once with when it applies and its order as data.

A trace starts the parts that apply in :func:`start_order` and stops them in :func:`stop_order`:
the reverse, but for a part that must outlive another one's stop (``stop_after``: it records
what the other does as it stops). Adding a tracer is one :class:`TracerPart` in :data:`PARTS`
and its two functions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tpu_debug.dry_runner import value_reader
from tpu_debug.guards import TraceGuards
from tpu_debug.runtime import probes
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.dry_mode import TARGET_LEVEL, dry_mode, target_future
from tpu_debug.runtime.lazy import set_mode
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.session import Session
from tpu_debug.trace_config import TraceConfig
from tpu_debug.tracers.events import DryRunSummaryEvent, TensorBoardSummaryEvent
from tpu_debug.tracers.recording import torch_trace
from tpu_debug.tracers.recording.collectives_tracer import CollectivesTracer
from tpu_debug.tracers.recording.divergence import DivergenceTracer, parse_tolerances
from tpu_debug.tracers.recording.invalid_value_tracer import InvalidValueTracer
from tpu_debug.tracers.recording.memory_snapshot import MemorySnapshot
from tpu_debug.tracers.recording.memory_tracker import MemoryTracer, current_phase
from tpu_debug.tracers.recording.program_memory_tracer import ProgramMemoryTracer
from tpu_debug.tracers.recording.recorder import Recorder
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.recording.step_tracker import StepTracker
from tpu_debug.tracers.recording.target_tracer import TargetTracer
from tpu_debug.tracers.recording.tensorboard_exporter import TensorBoardExporter
from tpu_debug.tracers.xplane import TENSORBOARD_DIR

__all__ = ["PARTS", "Running", "TracerPart", "start_order", "stop_all", "stop_order"]


@dataclasses.dataclass(slots=True)
class Running:
    """What the parts of one recording share: the run and, per started part, what its stop needs."""

    config: TraceConfig
    target: Target | None
    writer: RunWriter
    recorder: Recorder
    session: Session
    say: Callable[[str], None]  # a line to the user, safe inside a signal handler
    # (status, held signals) while the trace stops its parts
    closing: tuple[str, Any] = ("finished", None)
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)  # part name -> what it started

    @property
    def steps(self) -> Any:
        """The run's StepTracker (the one step source), once the ``steps`` part started."""
        return self.kept.get("steps")

    def listen_to_steps(self, listener: Callable[[Any], None]) -> None:
        # per-step tracers end their steps on the step tracker's events
        if self.steps is not None:
            self.steps.add_listener(listener)


def _always(_run: Running) -> bool:
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class TracerPart:
    """One part of a recording, as a trace starts and stops it.

    Args:
        name: what the other parts call it in ``after`` and ``stop_after``.
        start: sets it up; keeps in ``run.kept[name]`` what its stop undoes as soon as
            there is something to undo (a start that fails half-way is still stopped).
        stop: undoes it; runs even when another part's stop failed.
        label: how a failing stop is named among the run's tracer errors.
        applies: whether this run has it (its option is on, say).
        after: parts started before it (it uses what they set up).
        stop_after: parts stopped before it although started before it too: what they do
            as they stop reaches it.
    """

    name: str
    start: Callable[[Running], None]
    stop: Callable[[Running], None]
    label: str
    applies: Callable[[Running], bool] = _always
    after: tuple[str, ...] = ()
    stop_after: tuple[str, ...] = ()


def _ordered(parts: Sequence[TracerPart], before: Callable[[TracerPart], tuple[str, ...]]) -> list[TracerPart]:
    """``parts`` in their given order, moved only as far as each must be to come after the parts
    ``before(part)`` names (a stable topological order; names of parts not in ``parts`` are
    ignored: they do not apply to this run).

    Raises:
        ValueError: the names form a loop.
    """
    names = {p.name for p in parts}
    waiting = {p.name: {n for n in before(p) if n in names} for p in parts}
    out: list[TracerPart] = []
    left = list(parts)
    while left:
        ready = next((p for p in left if not waiting[p.name]), None)
        if ready is None:
            raise ValueError(f"tracer parts ordered in a loop: {', '.join(p.name for p in left)}")
        left.remove(ready)
        out.append(ready)
        for deps in waiting.values():
            deps.discard(ready.name)
    return out


def start_order(parts: Sequence[TracerPart]) -> list[TracerPart]:
    """The order a trace starts ``parts`` in: as declared, each after its ``after``."""
    return _ordered(parts, lambda p: p.after)


def stop_order(parts: Sequence[TracerPart]) -> list[TracerPart]:
    """The order a trace stops ``parts`` in: the reverse of :func:`start_order`, each after its
    ``stop_after``."""
    return _ordered(start_order(parts)[::-1], lambda p: p.stop_after)


def stop_all(parts: Sequence[TracerPart], run: Running) -> None:
    """Stop ``parts`` in :func:`stop_order`. A stop that raises is recorded as a tracer error
    and the rest still stop; an interrupt (a BaseException) lets the rest stop, then goes on."""
    interrupted: BaseException | None = None
    for part in stop_order(parts):
        try:
            part.stop(run)
        except Exception as exc:  # noqa: BLE001 - the rest must still be stopped and the run closed
            run.recorder.record_error(part.label, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # noqa: BLE001 - raised once every part is stopped
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


# -- the recorder: every probe report becomes an event --------------------------------------


def _start_recorder(run: Running) -> None:

    run.kept["recorder"] = run.recorder
    probes.subscribe(run.recorder, replay=True)


def _stop_recorder(run: Running) -> None:

    if run.kept.pop("recorder", None) is not None:
        probes.unsubscribe(run.recorder)


# -- steps ------------------------------------------------------------------------------


def _release(name: str) -> Callable[[Running], None]:
    """The stop of a part that is one probe listener: unsubscribe it, then close it."""

    def stop(run: Running) -> None:
        listener = run.kept.pop(name, None)
        if listener is not None:
            probes.unsubscribe(listener)
            listener.close()

    return stop


def _start_steps(run: Running) -> None:

    writer, recorder = run.writer, run.recorder
    tracker = StepTracker(writer.put, writer.new_id, recorder.clock, record_error=recorder.record_error)
    run.kept["steps"] = tracker
    tracker.start()
    probes.subscribe(tracker, replay=True)


# -- TensorBoard export -----------------------------------------------------------------


def _start_tensorboard(run: Running) -> None:

    recorder, writer = run.recorder, run.writer
    try:
        exporter = TensorBoardExporter(
            run.session.run_dir / TENSORBOARD_DIR,
            max_events=run.config.tensorboard_max_events,
            clock=recorder.clock,
            record_error=recorder.record_error,
            writer=writer,
            target=getattr(run.target, "name", None),
        )
        exporter.start()
    except Exception as exc:  # noqa: BLE001 - the run goes on without TensorBoard
        recorder.record_error("TensorBoardExporter.start", f"{type(exc).__name__}: {exc}")
        writer.put(TensorBoardSummaryEvent(
            writer.new_id(), recorder.clock(), None, threading.get_native_id(), None,
            status="failed", notes=(f"{type(exc).__name__}: {exc}",),
        ))
        return
    run.kept["tensorboard"] = exporter  # from here on, stopping it undoes what follows too
    writer.add_listener(exporter.on_event)
    probes.subscribe(exporter, replay=True)


def _stop_tensorboard(run: Running) -> None:

    exporter = run.kept.pop("tensorboard", None)
    if exporter is None:
        return
    probes.unsubscribe(exporter)
    run.writer.remove_listener(exporter.on_event)
    try:
        exporter.stop()
    except Exception as exc:  # noqa: BLE001 - the run itself must still be closed
        run.recorder.record_error("TensorBoardExporter.stop", f"{type(exc).__name__}: {exc}")


# -- TPU target ----------------------------------------------------------------------


def _start_target(run: Running) -> None:

    reuse = level = None
    if run.config.dry_run:
        # a dry run compiles every program for the target itself (runtime/dry_mode.py): the
        # tracer records those compiles instead of making its own
        reuse, level = target_future, TARGET_LEVEL
    tracer = TargetTracer(run.writer, run.target, clock=run.recorder.clock,
                          record_error=run.recorder.record_error, hlo=run.config.hlo, reuse=reuse,
                          optimization_level=level)
    run.kept["target"] = tracer
    # programs compiled before the trace are compiled for the target when they run in it
    probes.subscribe(tracer, replay=True)
    run.listen_to_steps(tracer.on_step)


def _stop_target(run: Running) -> None:

    tracer = run.kept.pop("target", None)
    if tracer is None:
        return
    probes.unsubscribe(tracer)
    if run.steps is not None:
        run.steps.remove_listener(tracer.on_step)
    status, held = run.closing
    # a program stopped by Ctrl-C or SIGTERM does not wait for compiles; a signal held while
    # the trace closes stops the wait too
    wait = 0.0 if status in ("interrupted", "terminated") else run.config.target_wait
    tracer.close(wait=wait, interrupted=(lambda: bool(held.received)) if held is not None else None,
                 say=run.say)


# -- PyTorch's structured trace (TORCH_TRACE, read by tlparse) ------------------------------


def _torch_trace_on(_run: Running) -> bool:

    return torch_trace.enabled()


def _start_torch_trace(run: Running) -> None:

    emitter = torch_trace.TorchTraceEmitter(run.recorder.record_error)
    run.kept["torch_trace"] = emitter
    emitter.start()
    run.writer.add_listener(emitter.on_event)
    probes.subscribe(emitter)  # after the recorder: it hears each compile's event first


def _stop_torch_trace(run: Running) -> None:

    emitter = run.kept.pop("torch_trace", None)
    if emitter is None:
        return
    probes.unsubscribe(emitter)
    run.writer.remove_listener(emitter.on_event)
    emitter.close(run.session.programs.text)  # the live session flushes the writer first


# -- collectives of programs over several devices -----------------------------------------


def _start_collectives(run: Running) -> None:

    # with a TPU target (trace(target=...)), each such program is also compiled for it
    tracer = CollectivesTracer(run.writer, clock=run.recorder.clock, record_error=run.recorder.record_error,
                               hlo=run.config.hlo, target=run.target)
    run.kept["collectives"] = tracer
    probes.subscribe(tracer, replay=True)


# -- argument values a TPU computes with silently (an index out of range) --------------------


def _start_invalid_values(run: Running) -> None:

    tracer = InvalidValueTracer(run.writer, clock=run.recorder.clock, record_error=run.recorder.record_error)
    run.kept["invalid_values"] = tracer
    # replayed compiles name the backward graphs compiled before the trace
    probes.subscribe(tracer, replay=True)


# -- divergence against CPU and TPU numerics ---------------------------------------------


@dataclasses.dataclass(slots=True)
class _Divergence:
    tracer: Any = None  # a DivergenceTracer with divergence=True
    saved_numerics: str | None = None  # the runtime's numerics before trace(numerics=...)


def _start_divergence(run: Running) -> None:

    kept = run.kept["divergence"] = _Divergence()
    if run.config.divergence:
        tracer = DivergenceTracer(
            run.writer,
            clock=run.recorder.clock,
            tolerances=parse_tolerances(run.config.tolerances),
            sample=run.config.divergence_sample,
            record_error=run.recorder.record_error,
        )
        kept.tracer = tracer
        probes.subscribe(tracer)
    if run.config.numerics is not None:
        kept.saved_numerics = runtime_config.numerics
        runtime_config.numerics = run.config.numerics


def _stop_divergence(run: Running) -> None:

    kept = run.kept.pop("divergence", None) or _Divergence()
    if kept.tracer is not None:
        probes.unsubscribe(kept.tracer)
        try:
            kept.tracer.close()
        except Exception as exc:  # noqa: BLE001 - the run itself must still be closed
            run.recorder.record_error("DivergenceTracer.close", f"{type(exc).__name__}: {exc}")
    if kept.saved_numerics is not None:
        runtime_config.numerics = kept.saved_numerics


# -- the runtime's settings a trace changes --------------------------------------------------


def _set_eager_mode(run: Running) -> None:
    run.kept["eager_mode"] = runtime_config.eager_mode  # the runtime's mode before trace(eager_mode=...)
    set_mode(run.config.eager_mode)


def _restore_eager_mode(run: Running) -> None:
    saved = run.kept.pop("eager_mode", None)
    if saved is not None:
        set_mode(saved)


def _set_compile_cache(run: Running) -> None:

    run.kept["compile_cache"] = runtime_config.compile_cache  # the setting before trace(compile_cache=...)
    runtime_config.compile_cache = run.config.compile_cache


def _restore_compile_cache(run: Running) -> None:
    saved = run.kept.pop("compile_cache", None)
    if saved is not None:

        runtime_config.compile_cache = saved


# -- device memory and dry runs ----------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Memory:
    tracer: Any  # the MemoryTracer
    dry: Any = None  # the runtime's dry mode (its context manager) with dry_run=True
    mode: Any = None  # what entering it gave
    seen: dict[str, Any] = dataclasses.field(default_factory=dict)  # where the dry run read a value


def _start_memory(run: Running) -> None:

    config = run.config
    snapshot = None
    if config.memory_snapshot is not None:
        snapshot = run.kept["memory_snapshot"] = MemorySnapshot(config.memory_snapshot, clock=run.recorder.clock)
    tracer = MemoryTracer(run.writer, clock=run.recorder.clock, target=run.target, dry_run=config.dry_run,
                          record_error=run.recorder.record_error, snapshot=snapshot)
    tracer.start()
    kept = run.kept["memory"] = _Memory(tracer)
    probes.subscribe(tracer)
    run.listen_to_steps(tracer.on_step)
    if config.dry_run:
        describe, kept.seen = value_reader()
        dry = dry_mode(run.target, describe=describe)
        kept.mode = dry.__enter__()
        kept.dry = dry


def _stop_memory(run: Running) -> None:

    kept = run.kept.pop("memory", None)
    if kept is None:
        return
    tracer = kept.tracer
    try:
        if kept.dry is not None:
            kept.dry.__exit__(None, None, None)
            _end_dry_run(run, kept)
        if run.steps is not None:
            run.steps.remove_listener(tracer.on_step)
        tracer.close()
    finally:
        probes.unsubscribe(tracer)


def _end_dry_run(run: Running, kept: _Memory) -> None:
    """The dry run's programs still compiling for the target, where it stopped, its summary."""
    mode = kept.mode
    programs = mode.collect()  # the target compiles still running
    kept.tracer.add_target_programs(programs)
    if mode.stop is not None:
        kept.tracer.stop_at(mode.stop.what, kept.seen.get("location"))
    writer = run.writer
    writer.put(DryRunSummaryEvent(
        writer.new_id(), run.recorder.clock(), None, threading.get_native_id(), None,
        target=str(mode.target) if mode.target else None, programs=len(programs), notes=tuple(mode.notes),
    ))


# -- each compiled program's memory at its peak, buffer by buffer -------------------------------


def _start_program_memory(run: Running) -> None:

    # with a target, the target's compiler's assignments (the target tracer hands them over);
    # without one, this machine's (a dry run compiles nothing here)
    local = run.target is None and not run.config.dry_run
    memory = run.kept.get("memory")  # where each storage was allocated, when memory is tracked
    tracer = ProgramMemoryTracer(run.writer, clock=run.recorder.clock, local=local,
                                 record_error=run.recorder.record_error, phase=lambda: current_phase(2),
                                 lines=memory.tracer.line_of if memory is not None else None,
                                 snapshot=run.kept.get("memory_snapshot"))
    run.kept["program_memory"] = tracer
    probes.subscribe(tracer)
    target = run.kept.get("target")
    if target is not None:
        target.add_listener(tracer.on_target)


def _stop_program_memory(run: Running) -> None:
    tracer = run.kept.pop("program_memory", None)
    if tracer is None:
        return
    probes.unsubscribe(tracer)
    status, _held = run.closing
    tracer.close(wait=0.0 if status in ("interrupted", "terminated") else run.config.target_wait)
    snapshot = run.kept.pop("memory_snapshot", None)
    if snapshot is not None:
        try:
            snapshot.write()
        except OSError as exc:  # a snapshot that cannot be written is the run's error, not the program's
            run.recorder.record_error("MemorySnapshot.write", f"{type(exc).__name__}: {exc}")


# -- guards: dynamo events, recompile and transfer guards ------------------------------------


def _start_guards(run: Running) -> None:

    guards = TraceGuards(run.config, run.writer, run.recorder)
    run.kept["guards"] = guards
    guards.start()


def _stop_guards(run: Running) -> None:
    guards = run.kept.pop("guards", None)
    if guards is not None:
        guards.stop()


#: Every part of a recording, in the order a trace starts them.
PARTS: tuple[TracerPart, ...] = (
    TracerPart("recorder", _start_recorder, _stop_recorder, "Recorder.unsubscribe"),
    TracerPart("steps", _start_steps, _release("steps"), "StepTracker.close", after=("recorder",)),
    TracerPart("tensorboard", _start_tensorboard, _stop_tensorboard, "TensorBoardExporter.stop",
               applies=lambda run: bool(run.config.tensorboard),
               # a run without step marks gets its loop's steps as the step tracker stops, and the
               # exporter writes their scalars; the target's step estimates reach the timeline too,
               # and its programs, for xprof's memory viewer
               stop_after=("steps", "target", "program_memory")),
    TracerPart("target", _start_target, _stop_target, "TargetTracer.close",
               applies=lambda run: run.target is not None, after=("steps",),
               # the loop's steps the step tracker finds as it stops get their TPU estimates
               stop_after=("steps",)),
    TracerPart("torch_trace", _start_torch_trace, _stop_torch_trace, "TorchTraceEmitter.close",
               applies=_torch_trace_on, after=("recorder",),
               # the TPU programs the target compiled go into the structured trace too
               stop_after=("target",)),
    TracerPart("collectives", _start_collectives, _release("collectives"), "CollectivesTracer.close"),
    TracerPart("invalid_values", _start_invalid_values, _release("invalid_values"), "InvalidValueTracer.close",
               after=("recorder",),
               # what is pending when the eager mode is restored runs, and its checks are read
               stop_after=("eager_mode",)),
    TracerPart("divergence", _start_divergence, _stop_divergence, "DivergenceTracer.close",
               applies=lambda run: bool(run.config.divergence) or run.config.numerics is not None),
    TracerPart("eager_mode", _set_eager_mode, _restore_eager_mode, "restoring the eager mode",
               applies=lambda run: run.config.eager_mode is not None),
    TracerPart("memory", _start_memory, _stop_memory, "MemoryTracer.close",
               applies=lambda run: bool(run.config.memory or run.config.dry_run or run.config.memory_snapshot),
               # the dry mode comes after the eager mode: leaving lazy mode then runs what was
               # pending before the trace for real
               after=("steps", "eager_mode"),
               # restoring the eager mode runs what is pending, in the dry mode and recorded
               stop_after=("eager_mode",)),
    TracerPart("program_memory", _start_program_memory, _stop_program_memory, "ProgramMemoryTracer.close",
               applies=lambda run: bool(run.config.memory or run.config.dry_run or run.config.memory_snapshot)
               or run.target is not None,
               after=("target", "memory"),
               # the target's last compiles, and what leaving the eager or dry mode compiles, reach it
               stop_after=("target", "eager_mode", "memory")),
    TracerPart("guards", _start_guards, _stop_guards, "TraceGuards.stop", after=("steps",),
               stop_after=("eager_mode",)),  # what is pending compiles under the recompile guard
    TracerPart("compile_cache", _set_compile_cache, _restore_compile_cache, "restoring the compile cache setting",
               applies=lambda run: run.config.compile_cache is not None,
               # what is pending when the eager mode is restored compiles with the run's setting
               stop_after=("eager_mode",)),
)
