"""TensorBoard export: the run as a JAX profile with tpu_debug's findings on its timeline.

With ``trace(tensorboard=True)`` a :class:`TensorBoardExporter` captures a
``jax.profiler`` trace of the run into ``<run>/tensorboard/`` (the layout the
TensorBoard profile plugin, xprof, reads: ``plugins/profile/<session>/<host>.xplane.pb``)
and marks on the same host timeline as XLA's own activity, as
``TraceAnnotation``-style spans whose metadata xprof shows in its trace viewer:

- each op execution: ``aten::<op>`` (eager) or ``graph <id>`` (compiled), with
  its inputs (shapes, dtypes, static arguments) as metadata;
- each compile: ``compile aten::<op>`` or ``recompile aten::<op>``, with the
  signature, compile time, source line and the recompile reason (the key diffs
  of the recorded :class:`~tpu_debug.tracers.events.CompileEvent`, when a
  tracer filled them);
- each transfer: ``transfer h2d`` / ``transfer d2h`` with bytes, shape, dtype,
  what caused it and the source line;
- each divergence over tolerance, CPU fallback and graph break, as a short
  marker at the moment it was recorded;
- each program over several devices, as a marker with its collectives, the
  bytes each device sends per run and its memory per device; each run of it
  carries those bytes (``collective_bytes``) in its span's metadata;
- steps, as ``StepTraceAnnotation``s (``step <n>``): a step ends where the
  run's :class:`~tpu_debug.tracers.events.StepEvent` says (``optimizer.step()``
  returning, or an explicit ``tpu_debug.step()``: the step tracker cuts them).
  A run whose steps are only found when it ends (the iterations of its loop)
  gets their scalars, not their spans: the timeline is written by then.

Each compile's measured phases (``tracers/reading/compile_time.py``) are drawn on a plane of
their own, ``/device:CUSTOM:tpu_debug compile phases``, added to the profile when the capture
ends (the times are the run's, which TraceMe spans cannot be given afterwards): a line
``compiles`` holds each compile (dynamo's compile of a frame, AOTAutograd's backward, each
program the runtime compiled: ``graph g1/forward (compiled)``), a line ``TPU target compiles``
each TPU target compile, a line ``phases`` what was measured
inside them (dynamo's tracing and guards, AOTAutograd's joint graph and partition, the
lowering, XLA's compile, the read-back from the compile cache).

With a TPU target (``trace(target="v5e")``, the target tracer), each program's
target compile is marked when its result is recorded (``tpu target aten::<op>``:
HBM, flops, bytes, FLOP/B, bound, estimated time, padding, or the compiler's
refusal), the op and graph spans of programs with a result carry its estimate
(``tpu_est``, ``tpu_bound``, ``tpu_memory``), and a counter track ``TPU memory
(<target>)`` follows the HBM each running program needs on the target. The
trace viewer draws it as a counter; it is added to the profile when the
capture ends (a plane with xprof's counter line, ``_counters_``).

Beside the profile, per-step scalars (the step's time split into parts,
``tpu_debug/step_time/<part>``, compiles, recompiles, compile time,
transfer bytes, eager op count, max divergence; with a target, its estimated
step time, MFU and peak program memory) go to a TensorBoard event file
through ``torch.utils.tensorboard`` (which needs no TensorFlow). Every scalar's
step is the :class:`~tpu_debug.tracers.events.StepEvent` index of its step, and
the counts are the step record's own (the run's ``StepTracker`` counts them, for
the report and the TUI too); the exporter adds only what it measures itself
(divergence, collective bytes), per step. What ran after the last step end is
written one step later (``StepTracker.unfinished``); a run without step marks is
one point, step 0.

Spans come from two sources: the runtime's probe calls (``on_*_begin`` then
``on_*``, which bracket the activity) and the events the recorder writes to the
run (:meth:`RunWriter.add_listener`), which add what only the tracers know (the
source line, recompile diffs, divergences). A capture is bounded by
``max_events`` spans: at the cap the profile is stopped and written, and the run
metadata (``tensorboard`` key) and the report say so; scalars go on to the end.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_debug.core.records import CompileInfo, TransferInfo
from tpu_debug.tracers.events import (
    CollectivesEvent,
    CompileEvent,
    CompilePhaseEvent,
    DivergenceEvent,
    Event,
    FallbackEvent,
    GraphBreakEvent,
    ProgramProtoEvent,
    StepEvent,
    TargetCompileEvent,
    TargetStepEvent,
    TensorBoardSummaryEvent,
    TransferEvent,
)
from tpu_debug.tracers.reading.step_time import PART_TEXT, split_step
from tpu_debug.tracers.recording.step_tracker import StepTracker, current_tracker
from tpu_debug.tracers.xplane import (
    RankSpan,
    counter_plane,
    profile_files,
    profile_start,
    span_plane,
    write_programs,
)

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "SCALAR_TAGS",
    "STEP_NAME",
    "TARGET_PLANE",
    "TARGET_SCALAR_TAGS",
    "TensorBoardExporter",
]

DEFAULT_MAX_EVENTS = 100_000
STEP_NAME = "step"
# the scalars written per step (tag -> what it counts)
SCALAR_TAGS = {
    "tpu_debug/eager_ops": "eager op executions",
    "tpu_debug/compiles": "compiles (eager ops and graphs)",
    "tpu_debug/recompiles": "compiles of an op or graph compiled before with another key",
    "tpu_debug/compile_seconds": "time spent compiling",
    "tpu_debug/transfer_bytes": "bytes moved between host and device",
    "tpu_debug/max_divergence": "largest absolute error against CPU (only steps that compared)",
    "tpu_debug/collective_bytes": "bytes each device sent in collectives, ring estimate (only steps that ran "
    "programs over several devices)",
    # the step's wall time in parts that add up to it (tracers/reading/step_time.py), one tag per part
    **{f"tpu_debug/step_time/{part}": f"seconds of the step {text}" for part, text in PART_TEXT.items()},
}
# with a TPU target, per step that ran programs (written when the trace ends)
TARGET_SCALAR_TAGS = {
    "tpu_debug/target_step_seconds": "the step's estimated time on the TPU target (a model estimate)",
    "tpu_debug/target_mfu": "the step's estimated MFU on the TPU target (a model estimate)",
    "tpu_debug/target_peak_memory_bytes": "HBM the step's largest program needs on the TPU target",
}
# the counter track of the target's memory, in a plane of its own (xprof reads a line named
# "_counters_" as counters; "/device:CUSTOM:" planes are shown beside the host's)
TARGET_PLANE = "/device:CUSTOM:tpu_debug TPU target"
# the compiles and their measured phases, in a plane of their own
PHASES_PLANE = "/device:CUSTOM:tpu_debug compile phases"
# how a phase is named on the timeline
_PHASE_SPANS = {
    "dynamo_trace": "dynamo trace", "dynamo_guards": "dynamo guards", "aot_graph": "AOTAutograd joint graph",
    "aot_partition": "AOTAutograd partition", "lowering": "lowering to XLA", "xla_compile": "XLA compile",
    "cache_read": "compile cache read-back",
}


def _traceme() -> Any:
    # jax.profiler.TraceAnnotation is this class; the private import gives set_metadata,
    # which adds what is only known when the activity ends (bytes, recompile reason)
    from jax._src.lib import _profiler

    return _profiler.TraceMe


class _Span:
    __slots__ = ("kind", "meta", "traceme")

    def __init__(self, kind: str, traceme: Any) -> None:
        self.kind = kind
        self.traceme = traceme
        self.meta: dict[str, Any] = {}


# the scalars read from the step record (tag -> StepEvent field)
_STEP_FIELDS = {
    "tpu_debug/eager_ops": "eager_ops",
    "tpu_debug/compiles": "compiles",
    "tpu_debug/recompiles": "recompiles",
    "tpu_debug/compile_seconds": "compile_seconds",
    "tpu_debug/transfer_bytes": "transfer_bytes",
}


class _Measured:
    """What the exporter itself measures in the current step (the step record has the rest)."""

    __slots__ = ("collective_bytes", "max_divergence")

    def __init__(self) -> None:
        self.max_divergence: float | None = None
        self.collective_bytes = 0

    def scalars(self, step: StepEvent | None) -> dict[str, float]:
        """The step's scalars: ``step``'s counts (none without a record) and these."""
        out = {tag: float(getattr(step, field)) for tag, field in _STEP_FIELDS.items()} if step else {}
        split = split_step(step) if step is not None else None
        if split is not None:
            out.update({f"tpu_debug/step_time/{part}": seconds for part, seconds in split.as_dict().items()})
        if self.max_divergence is not None:
            out["tpu_debug/max_divergence"] = self.max_divergence
        if self.collective_bytes:
            out["tpu_debug/collective_bytes"] = float(self.collective_bytes)
        return out


def _over_tolerance(event: DivergenceEvent) -> bool:
    return bool(event.first or event.mismatched > 0 or event.nan_origin)


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _safe(value: Any) -> Any:
    """A metadata value xprof reads back whole: it cuts values at ``#`` and at commas
    outside brackets, parentheses and quotes."""
    if not isinstance(value, str):
        return value
    value = value.replace("#", "%23")
    depth = 0
    quote = ""
    for ch in value:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth <= 0:
            return f"({value})"
    return value


def _inputs(args: Any) -> str:
    return "(" + ", ".join(a.render() for a in args) + ")"


class TensorBoardExporter:
    """Puts a run's events on a JAX profile timeline and writes per-step scalars.

    A probe (subscribe it with ``runtime.probes.subscribe``) and a listener of
    the run writer; :class:`~tpu_debug.Trace` wires it when ``tensorboard=True``.

    Args:
        logdir: the run's ``tensorboard/`` directory (created).
        max_events: spans to emit before the capture stops (at least 1).
        clock: seconds since the run started (for saying when a cap was hit).
        record_error: ``(where, message)`` keeps an exporter failure in the run.
        writer: the run writer (``new_id()``, ``put(event)``) that records the
            export's :class:`TensorBoardSummaryEvent`; None records none.
        target: the TPU target the trace compiles for (its estimates join the
            timeline and a memory counter track is written), or None.
        steps: the run's ``StepTracker``, whose unfinished step (what ran after the
            last step end) is written when the capture ends; None: the active trace's
            (``current_tracker()`` when :meth:`start` runs). The steps that end reach
            the exporter as the run's recorded step events (:meth:`on_event`).

    Example::

        exporter = TensorBoardExporter(run_dir / "tensorboard", max_events=10_000)
        exporter.start(); ...; summary = exporter.stop()
    """

    def __init__(
        self,
        logdir: Path,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        clock: Callable[[], float] | None = None,
        record_error: Callable[[str, str], None] | None = None,
        writer: Any = None,
        target: str | None = None,
        steps: StepTracker | None = None,
    ) -> None:
        self.logdir = Path(logdir)
        self._tracker = steps
        self.target = target
        # with a target: each program's key by (mode, name, inputs), what its spans carry,
        # its target memory, and (time, key) of each execution span, for the counter track
        self._key_of: dict[tuple[str, str, str], Any] = {}
        self._target_meta: dict[Any, dict[str, Any]] = {}
        self._target_memory: dict[Any, int] = {}
        self._samples: list[tuple[int, Any]] = []
        self._written: Path | None = None  # the profile file this exporter's capture wrote
        self.max_events = max(1, int(max_events))
        self._clock = clock or (lambda: 0.0)
        self._record_error = record_error
        self._writer = writer
        self._TraceMe = _traceme()
        self._local = threading.local()
        self._stacks: list[list[_Span]] = []
        self._stacks_lock = threading.Lock()
        self._capturing = False
        self._owns_profile = False
        self._started = False
        self._stopped = False
        self.events = 0
        self.dropped = 0
        self.capped_at: float | None = None
        self.notes: list[str] = []
        # per executable key: its inputs' shapes and static args, from its compile
        # (compiles from before the trace are replayed at subscription)
        self._inputs: dict[Any, str] = {}
        self._labels: dict[tuple[str, str], str] = {}
        # (mode, op or graph) -> bytes each device sends in collectives per run (CollectivesEvent)
        self._collective_bytes: dict[tuple[str, str], int] = {}
        self._compiled: set[tuple[str, str]] = set()
        self._marked = 0  # steps the program ended (optimizer.step(), tpu_debug.step())
        self._found_steps: list[StepEvent] = []  # steps recorded after the fact (a loop's)
        self._region: _Span | None = None
        self._measured = _Measured()
        self._scalar_writer: Any = None
        self._lock = threading.Lock()
        self._protos: list[ProgramProtoEvent] = []  # target programs, for xprof's memory viewer
        # compiles and their phases (run clock), and the run clock's reading at a wall-clock time
        self._compile_spans: list[RankSpan] = []
        self._wall_at: tuple[float, int] | None = None

    # -- life cycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the JAX profile and the scalar writer."""
        if self._started:
            return
        self._started = True
        self._wall_at = (self._clock(), time.time_ns())
        if self._tracker is None:
            self._tracker = current_tracker()
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._start_profile()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._scalar_writer = SummaryWriter(log_dir=str(self.logdir), flush_secs=5)
        except Exception as exc:  # noqa: BLE001 - no scalars, the profile still works
            self._error("start (scalars)", exc)
        self._open_region()
        self._publish("capturing" if self._capturing else "not capturing")

    def _start_profile(self) -> None:
        import jax

        options = jax.profiler.ProfileOptions()
        # Python function tracing would add an event per Python call: the spans carry the
        # user's line already, and a capture must stay bounded
        options.python_tracer_level = 0
        try:
            jax.profiler.start_trace(str(self.logdir), profiler_options=options)
        except RuntimeError as exc:
            if "already" not in str(exc).lower():
                self._error("start (profile)", exc)
                self.notes.append(f"the JAX profiler did not start ({exc}); only scalars were written")
                return
            # someone else's jax.profiler trace is running: annotate it, do not steal it
            self.notes.append(
                "a JAX profile started outside tpu_debug was already running: the spans went "
                "into that profile, not into this run's tensorboard/ directory"
            )
            self._capturing = self._TraceMe.is_enabled()
            return
        self._owns_profile = True
        self._capturing = True

    def stop(self) -> TensorBoardSummaryEvent:
        """Close open spans, write the profile and the last scalars; returns the summary
        also recorded in the run."""
        if self._stopped or not self._started:
            return self.summary("finished" if self._stopped else "not started")
        self._stopped = True
        self._close_all()
        self._close_last_region()
        self._stop_profile()
        if self.target is not None:
            try:
                self._write_target_counters()
            except Exception as exc:  # noqa: BLE001 - the profile and the run are kept
                self._error("stop (target counters)", exc)
        try:
            self._write_compile_phases()
        except Exception as exc:  # noqa: BLE001 - the profile and the run are kept
            self._error("stop (compile phases)", exc)
        if self._protos:
            try:
                session = self._written.parent if self._written is not None else None
                write_programs(self.logdir, self._protos, session=session)
            except Exception as exc:  # noqa: BLE001
                self._error("stop (programs for the memory viewer)", exc)
        if self._scalar_writer is not None:
            try:
                self._scalar_writer.close()
            except Exception as exc:  # noqa: BLE001
                self._error("stop (scalars)", exc)
        status = "capped" if self.capped_at is not None else "finished"
        return self._publish(status)

    def _stop_profile(self) -> None:
        self._capturing = False
        if not self._owns_profile:
            return
        self._owns_profile = False
        import jax

        before = set(profile_files(self.logdir))
        try:
            jax.profiler.stop_trace()
        except Exception as exc:  # noqa: BLE001 - the run and its scalars are kept
            self._error("stop (profile)", exc)
            return
        written = [p for p in profile_files(self.logdir) if p not in before]
        self._written = written[-1] if written else None

    def summary(self, status: str = "") -> TensorBoardSummaryEvent:
        """What was captured: directory, spans, steps, whether the cap was hit."""
        files = profile_files(self.logdir)
        writer = self._writer
        return TensorBoardSummaryEvent(
            writer.new_id() if writer is not None else 0, self._clock(), None, threading.get_native_id(), None,
            status=status,
            dir=str(self.logdir.resolve()),
            profile=tuple(str(p.relative_to(self.logdir)) for p in files),
            spans=self.events,
            max_events=self.max_events,
            capped=self.capped_at is not None,
            capped_after_seconds=self.capped_at,
            dropped_spans=self.dropped,
            steps=self._marked or len(self._found_steps),
            notes=tuple(self.notes),
        )

    def _publish(self, status: str) -> TensorBoardSummaryEvent:
        summary = self.summary(status)
        if self._writer is not None:
            self._writer.put(summary)
        return summary

    # -- steps ----------------------------------------------------------------------

    def _end_step(self, step: StepEvent) -> None:
        """The program ended a step (its recorded ``StepEvent``)."""
        with self._lock:
            if self._stopped:
                return
            self._marked += 1
            measured, self._measured = self._measured, _Measured()
            self._write_scalars(step.index, measured.scalars(step))
            self._exit_region({"_r": 1, "step_num": step.index})
            self._open_region()

    def _open_region(self) -> None:
        # a step is known to be one only when it ends: the region opens as a plain span
        # and gets its step number (the StepTraceAnnotation metadata) when it is closed
        if self._capturing:
            tm = self._TraceMe(STEP_NAME)
            tm.__enter__()
            self._region = _Span("step", tm)
        else:
            self._region = None

    def _exit_region(self, meta: dict[str, Any]) -> None:
        region, self._region = self._region, None
        if region is not None:
            region.traceme.set_metadata(**meta)
            region.traceme.__exit__(None, None, None)

    def _close_last_region(self) -> None:
        """Write what follows the last step end: the steps found in the run's loop, the
        unfinished step, or (no step at all) the whole run as step 0."""
        measured, self._measured = self._measured, _Measured()
        if not self._marked and self._found_steps:
            # steps found when the run ended: their scalars, one point each
            for step in self._found_steps:
                self._write_scalars(step.index, _Measured().scalars(step))
            self._exit_region({"note": f"{len(self._found_steps)} steps found in the run's loop"})
            return
        tail = self._tracker.unfinished() if self._tracker is not None else None
        if not self._marked:
            self._write_scalars(0, measured.scalars(tail))
            self._exit_region({"note": "no step marks: use torch.optim or call tpu_debug.step()"})
        elif tail is not None:
            self._write_scalars(tail.index, measured.scalars(tail))
            self._exit_region({"_r": 1, "step_num": tail.index})
        else:
            self._exit_region({"note": "after the last step"})

    def _write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        writer = self._scalar_writer
        if writer is None:
            return
        try:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, global_step=step)
        except Exception as exc:  # noqa: BLE001
            self._error("scalars", exc)

    # -- spans ----------------------------------------------------------------------

    def _stack(self) -> list[_Span]:
        stack = getattr(self._local, "spans", None)
        if stack is None:
            stack = self._local.spans = []
            with self._stacks_lock:
                self._stacks.append(stack)
        return stack

    def _admit(self) -> bool:
        if not self._capturing:
            if self.capped_at is not None:
                self.dropped += 1
            return False
        if self.events >= self.max_events:
            self._cap()
            self.dropped += 1
            return False
        self.events += 1
        return True

    def _open(self, kind: str, name: str, **meta: Any) -> bool:
        if not self._admit():
            return False
        stack = self._stack()
        if stack and any(span.kind == kind for span in stack):
            # the runtime does not nest an activity in one of its kind: that one raised
            self._close(kind, unfinished=1)
        tm = self._TraceMe(name, **meta) if meta else self._TraceMe(name)
        tm.__enter__()
        stack.append(_Span(kind, tm))
        return True

    def _find(self, kind: str) -> _Span | None:
        stack = getattr(self._local, "spans", None)
        if stack:
            for span in reversed(stack):
                if span.kind == kind:
                    return span
        return None

    def _close(self, kind: str, **meta: Any) -> bool:
        stack = getattr(self._local, "spans", None)
        if not stack:
            return False
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].kind == kind:
                break
        else:
            return False
        # spans above it lost their end (their activity raised): close them here
        while len(stack) > i:
            span = stack.pop()
            if len(stack) == i:
                span.meta.update(meta)
            self._exit(span)
        return True

    def _exit(self, span: _Span) -> None:
        if span.meta:
            span.traceme.set_metadata(**{k: _safe(v) for k, v in span.meta.items() if v is not None})
        span.traceme.__exit__(None, None, None)

    def _mark(self, name: str, **meta: Any) -> None:
        if not self._admit():
            return
        tm = self._TraceMe(name, **{k: _safe(v) for k, v in meta.items() if v is not None})
        tm.__enter__()
        tm.__exit__(None, None, None)

    def _close_all(self) -> None:
        with self._stacks_lock:
            stacks = list(self._stacks)
        for stack in stacks:
            while stack:
                self._exit(stack.pop())

    def _cap(self) -> None:
        if self.capped_at is not None:
            return
        self.capped_at = self._clock()
        self.notes.append(
            f"capture stopped after {self.max_events} spans, {self.capped_at:.2f} s into the run; "
            "the profile covers the run up to there, the scalars cover all of it. Raise "
            "tensorboard_max_events (TPU_DEBUG_TENSORBOARD_MAX_EVENTS) to capture more."
        )
        self._close_all()
        if self._region is not None:
            region, self._region = self._region, None
            region.traceme.set_metadata(note="capture stopped here (max events)")
            region.traceme.__exit__(None, None, None)
        self._stop_profile()
        self._publish("capped")

    def _label(self, mode: str, name: str) -> str:
        label = self._labels.get((mode, name))
        if label is None:
            label = self._labels[(mode, name)] = f"aten::{name}" if mode == "eager" else f"graph {name}"
        return label

    # -- probe methods (the runtime calls these) ---------------------------------------

    def on_execute_begin(self, mode: str, name: str, key: Any) -> None:
        inputs = self._inputs.get(key)
        if self.target is not None:
            self._execute_with_target(mode, name, key, inputs)
        elif inputs is None:
            self._open("execute", self._label(mode, name))
        else:
            self._open("execute", self._label(mode, name), inputs=inputs)

    def _execute_with_target(self, mode: str, name: str, key: Any, inputs: str | None) -> None:
        meta = dict(self._target_meta.get(key, ()))
        if inputs is not None:
            meta["inputs"] = inputs
        if self._open("execute", self._label(mode, name), **meta):
            self._samples.append((time.time_ns(), key))

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        sent = self._collective_bytes.get((mode, name)) if self._collective_bytes else None
        if sent:
            self._measured.collective_bytes += sent
            self._close("execute", collective_bytes=sent)
            return
        self._close("execute")

    def on_compile_begin(self, mode: str, name: str) -> None:
        verb = "recompile" if (mode, str(name)) in self._compiled else "compile"
        self._open("compile", f"{verb} {self._label(mode, str(name))}")

    def on_compile(self, info: CompileInfo) -> None:
        name = str(info.name)
        self._inputs[info.key] = inputs = _safe(_inputs(a.recorded() for a in info.args))
        if self.target is not None:
            self._key_of[(info.mode, name, inputs)] = info.key
        self._compiled.add((info.mode, name))
        if info.replayed:
            return
        self._close("compile", seconds=_fmt(float(info.seconds)), inputs=inputs)

    def on_transfer_begin(self, direction: str, op: str) -> None:
        self._open("transfer", f"transfer {direction}", op=op)

    def on_transfer(self, info: TransferInfo) -> None:
        self._close(
            "transfer",
            bytes=int(info.nbytes),
            shape=f"{info.dtype}[{','.join(map(str, info.shape))}]",
            seconds=_fmt(float(info.seconds)),
        )

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    # -- run writer listener (the recorded events) ---------------------------------------

    def on_event(self, event: Event) -> None:
        """Add what the tracers recorded to the open span of the same activity, or
        mark the event on the timeline."""
        try:
            self._on_event(event)
        except Exception as exc:  # noqa: BLE001 - the recording thread must go on
            self._error(f"on_event({event.kind})", exc)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            if event.detected == "loop":
                self._found_steps.append(event)
            else:
                self._end_step(event)
            return
        line = str(event.location) if event.location is not None else None
        self._compile_phase_spans(event, line)
        if isinstance(event, CompileEvent):
            meta = {"signature": event.signature, "line": line}
            if event.diffs:
                meta["recompile"] = "; ".join(d.render() for d in event.diffs)
            span = self._find("compile")
            if span is not None:
                span.meta.update(meta)
            elif self._capturing:  # (when not capturing, its begin was counted as dropped)
                self._mark(f"compile {self._label(event.mode or 'eager', event.name)}", **meta)
        elif isinstance(event, TransferEvent):
            meta = {"line": line, "implicit": int(event.implicit), "op": event.op}
            span = self._find("transfer")
            if span is not None:
                span.meta.update(meta)
            elif self._capturing:
                self._mark(f"transfer {event.direction}", bytes=event.nbytes, **meta)
        elif isinstance(event, DivergenceEvent):
            measured = self._measured
            if measured.max_divergence is None or event.max_abs > measured.max_divergence:
                measured.max_divergence = float(event.max_abs)
            if _over_tolerance(event):
                graph = getattr(event, "graph", None)
                where = f"graph {graph} node {event.name}" if graph else f"aten::{event.name}"
                self._mark(
                    f"divergence {where} ({event.measure})",
                    measure=event.measure,
                    phase=getattr(event, "phase", None),
                    target=getattr(event, "target", None) or None,
                    ratio=_fmt(getattr(event, "ratio", 0.0)) if getattr(event, "ratio", 0.0) else None,
                    max_abs=_fmt(event.max_abs),
                    max_rel=_fmt(event.max_rel),
                    ulp=_fmt(event.ulp) if event.ulp is not None else None,
                    tolerance=_fmt(event.tolerance),
                    mismatched=event.mismatched,
                    nan_origin=int(event.nan_origin),
                    first=int(event.first),
                    line=line,
                )
        elif isinstance(event, CollectivesEvent):
            label = self._label(event.mode or "compiled", event.name)
            if not event.target:
                self._collective_bytes[(event.mode or "compiled", event.name)] = event.collective_bytes
            where = f" on {event.target}" if event.target else ""
            self._mark(
                f"collectives {label}{where}",
                devices=event.devices,
                collectives=len(event.collectives),
                sent_bytes=event.collective_bytes,
                memory_per_device=event.memory_bytes,
                ops="; ".join(f"{c.describe()} at {c.location}" for c in event.collectives[:8]) or None,
                error=event.error,
                line=line,
            )
        elif isinstance(event, FallbackEvent):
            self._mark(
                f"cpu fallback aten::{event.name}",
                inputs=_inputs(event.args),
                seconds=_fmt(event.seconds),
                line=line,
            )
        elif isinstance(event, GraphBreakEvent):
            self._mark(f"graph break {event.name}", reason=event.reason, line=line)
        elif event.kind == "guard_failure":  # dynamo compiles a function again
            self._mark(f"guard failure {event.name}", guards="; ".join(event.guards), line=line)
        elif event.kind == "recompile_limit":
            self._mark(f"recompile limit {event.name}", reason=event.reason, limit=event.limit, line=line)
        elif isinstance(event, TargetCompileEvent):
            self._on_target_compile(event, line)
        elif isinstance(event, ProgramProtoEvent):
            self._protos.append(event)
        elif isinstance(event, TargetStepEvent):
            self._target_scalars(event)

    # -- compile phases -------------------------------------------------------------------

    def _compile_phase_spans(self, event: Event, line: str | None) -> None:
        """Keep the compile spans ``event`` measured (run clock), for the phases plane."""
        if self.capped_at is not None and event.ts > self.capped_at:
            return  # a capped profile covers the run up to the cap, this plane too
        spans = self._compile_spans
        args = (("line", line),) if line else ()
        if isinstance(event, CompileEvent):
            end = event.ts + event.seconds
            wall = max(event.wall_seconds or event.seconds, event.seconds)
            label = self._label(event.mode or "eager", event.name)
            what = "read back" if event.from_cache else "compiled"
            spans.append(RankSpan(end - wall, wall, "compiles", f"{label} ({what})",
                                  (*args, ("signature", event.signature), ("seconds", _fmt(wall)))))
            lowered = event.ts + event.lower_seconds
            if event.lower_seconds > 0:
                spans.append(RankSpan(event.ts, event.lower_seconds, "phases", _PHASE_SPANS["lowering"], args))
            for phase, seconds in (("xla_compile", event.xla_seconds), ("cache_read", event.read_seconds)):
                if seconds > 0:
                    spans.append(RankSpan(lowered, seconds, "phases", _PHASE_SPANS[phase], args))
        elif isinstance(event, CompilePhaseEvent):
            if event.unit is not None:
                unit = "dynamo compile" if event.unit == "frame" else "AOTAutograd backward compile"
                name = f"{unit} {event.function or event.compile_id or ''}".strip()
                spans.append(RankSpan(event.ts, event.seconds, "compiles", name,
                                      (*args, ("compile_id", event.compile_id or ""))))
            elif event.phase in _PHASE_SPANS:
                spans.append(RankSpan(event.ts, event.seconds, "phases", _PHASE_SPANS[event.phase],
                                      (("compile_id", event.compile_id or ""),)))
        elif isinstance(event, TargetCompileEvent) and not event.cached:
            spans.append(RankSpan(event.ts, event.seconds, "TPU target compiles",
                                  f"tpu target compile {self._label(event.mode or 'eager', event.name)}",
                                  (*args, ("target", event.target))))

    def _write_compile_phases(self) -> None:
        """Append the compile phases plane to the profile this capture wrote."""
        path = self._written
        if path is None or not self._compile_spans or self._wall_at is None:
            return
        data = path.read_bytes()
        start, plane_ids = profile_start(data)
        if start is None:
            self.notes.append("the profile holds no start time: the compile phases were not added")
            return
        clock0, wall0 = self._wall_at
        # the run clock as wall-clock seconds, measured from the profile's start
        spans = [dataclasses.replace(s, start=(wall0 - start) / 1e9 + (s.start - clock0))
                 for s in sorted(self._compile_spans, key=lambda s: (s.lane, s.start, -s.seconds))]
        with open(path, "ab") as f:  # a serialized message's repeated field grows by appending
            f.write(span_plane(max(plane_ids, default=0) + 1, PHASES_PLANE, spans, 0.0))

    # -- TPU target ---------------------------------------------------------------------

    def _on_target_compile(self, event: TargetCompileEvent, line: str | None) -> None:
        """Mark the result, and keep the estimate for the program's next spans."""
        mode = event.mode or "eager"
        key = self._key_of.get((mode, event.name, _safe(_inputs(event.args))))
        memory = event.memory_bytes
        if key is not None and event.ok:
            self._target_meta[key] = {
                "tpu_est": f"{_fmt(event.estimated_seconds * 1e6)} us" if event.estimated_seconds else None,
                "tpu_bound": event.bound,
                "tpu_memory": memory,
            }
            self._target_meta[key] = {k: v for k, v in self._target_meta[key].items() if v is not None}
            if memory is not None:
                self._target_memory[key] = memory
        padding = None
        if event.padding_padded_bytes:
            padding = f"{event.padding_wasted_bytes} of {event.padding_padded_bytes} bytes"
        self._mark(
            f"tpu target {self._label(mode, event.name)}",
            target=event.target,
            status=event.status,
            signature=event.signature,
            memory_bytes=memory,
            flops=_fmt(event.flops) if event.flops is not None else None,
            bytes_accessed=_fmt(event.bytes_accessed) if event.bytes_accessed is not None else None,
            intensity=_fmt(event.intensity) if event.intensity is not None else None,
            bound=event.bound,
            estimated_us=_fmt(event.estimated_seconds * 1e6) if event.estimated_seconds is not None else None,
            padding=padding,
            required_bytes=event.required_bytes,
            available_bytes=event.available_bytes,
            error=event.error_message,
            compile_seconds=_fmt(event.seconds),
            cached=int(event.cached),
            line=line,
        )

    def _target_scalars(self, event: TargetStepEvent) -> None:
        writer = self._scalar_writer
        if writer is None or not event.executions:
            return
        if event.whole_run and self._found_steps:
            # the measured scalars are the iterations of the run's loop, found when it ended
            # (the target tracer hears only marked steps): the whole run's estimate is none of them
            return
        values = {"tpu_debug/target_step_seconds": event.estimated_seconds}
        if event.mfu is not None:
            values["tpu_debug/target_mfu"] = event.mfu
        if event.peak_memory_bytes is not None:
            values["tpu_debug/target_peak_memory_bytes"] = float(event.peak_memory_bytes)
        try:
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=event.step)
        except Exception as exc:  # noqa: BLE001
            self._error("scalars (target)", exc)

    def _write_target_counters(self) -> None:
        """Append the memory counter track to the profile this capture wrote: one sample
        each time the running program's target memory changes."""
        path = self._written
        if path is None or not self._samples or not self._target_memory:
            return
        data = path.read_bytes()
        start, plane_ids = profile_start(data)
        if start is None:
            self.notes.append("the profile holds no start time: the target memory track was not added")
            return
        samples: list[tuple[int, float]] = []
        last = None
        for ns, key in self._samples:
            value = self._target_memory.get(key)
            if value is None or value == last:
                continue
            samples.append(((ns - start) * 1000, float(value)))
            last = value
        if samples:
            plane = counter_plane(max(plane_ids, default=0) + 1, TARGET_PLANE, f"TPU memory ({self.target})",
                                   "bytes", samples)
            with open(path, "ab") as f:  # a serialized message's repeated field grows by appending
                f.write(plane)

    # -- helpers ----------------------------------------------------------------------

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"TensorBoardExporter.{where}", f"{type(exc).__name__}: {exc}")


# -- the profile's protobuf (XSpace), read and extended without its generated classes --------
# XSpace { repeated XPlane planes = 1 }; XPlane { id = 1, name = 2, lines = 3,
