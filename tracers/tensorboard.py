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
  returning, or an explicit ``tpu_debug.step()``: see ``tracers/steps.py``).
  A run whose steps are only found when it ends (the iterations of its loop)
  gets their scalars, not their spans: the timeline is written by then.

Beside the profile, per-step scalars (compiles, recompiles, compile time,
transfer bytes, eager op count, max divergence) go to a TensorBoard event file
through ``torch.utils.tensorboard`` (which needs no TensorFlow).

Spans come from two sources: the runtime's probe calls (``on_*_begin`` then
``on_*``, which bracket the activity) and the events the recorder writes to the
run (:meth:`RunWriter.add_listener`), which add what only the tracers know (the
source line, recompile diffs, divergences). A capture is bounded by
``max_events`` spans: at the cap the profile is stopped and written, and the run
metadata (``tensorboard`` key) and the report say so; scalars go on to the end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_debug.tracers.events import (
    CollectivesEvent,
    CompileEvent,
    DivergenceEvent,
    Event,
    FallbackEvent,
    GraphBreakEvent,
    StepEvent,
    TransferEvent,
)

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "SCALAR_TAGS",
    "STEP_NAME",
    "TENSORBOARD_DIR",
    "TensorBoardExporter",
    "profile_files",
]

DEFAULT_MAX_EVENTS = 100_000
TENSORBOARD_DIR = "tensorboard"  # inside the run directory
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
}


def profile_files(logdir: Path | str) -> list[Path]:
    """The ``.xplane.pb`` files of the profiles under ``logdir``, oldest session first."""
    root = Path(logdir) / "plugins" / "profile"
    if not root.is_dir():
        return []
    return sorted(root.rglob("*.xplane.pb"))


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


class _StepStats:
    __slots__ = ("collective_bytes", "compile_seconds", "compiles", "eager_ops", "max_divergence", "recompiles",
                 "transfer_bytes")

    def __init__(self) -> None:
        self.eager_ops = 0
        self.compiles = 0
        self.recompiles = 0
        self.compile_seconds = 0.0
        self.transfer_bytes = 0
        self.max_divergence: float | None = None
        self.collective_bytes = 0

    def ran(self) -> bool:
        return bool(self.eager_ops or self.compiles)

    @classmethod
    def of(cls, step: StepEvent) -> _StepStats:
        """The figures a recorded step carries (for steps found after the fact)."""
        stats = cls()
        stats.eager_ops = step.eager_ops
        stats.compiles = step.compiles
        stats.recompiles = step.recompiles
        stats.compile_seconds = step.compile_seconds
        stats.transfer_bytes = step.transfer_bytes
        return stats

    def scalars(self) -> dict[str, float]:
        out = {
            "tpu_debug/eager_ops": float(self.eager_ops),
            "tpu_debug/compiles": float(self.compiles),
            "tpu_debug/recompiles": float(self.recompiles),
            "tpu_debug/compile_seconds": self.compile_seconds,
            "tpu_debug/transfer_bytes": float(self.transfer_bytes),
        }
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
        set_meta: ``(**items)`` updates the run metadata.

    Example:
        >>> exporter = TensorBoardExporter(run_dir / "tensorboard", max_events=10_000)
        >>> exporter.start(); ...; summary = exporter.stop()
    """

    def __init__(
        self,
        logdir: Path,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        clock: Callable[[], float] | None = None,
        record_error: Callable[[str, str], None] | None = None,
        set_meta: Callable[..., None] | None = None,
    ) -> None:
        self.logdir = Path(logdir)
        self.max_events = max(1, int(max_events))
        self._clock = clock or (lambda: 0.0)
        self._record_error = record_error
        self._set_meta = set_meta
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
        self._step = 0
        self._found_steps: list[StepEvent] = []  # steps recorded after the fact (a loop's)
        self._region: _Span | None = None
        self._stats = _StepStats()
        self._scalar_writer: Any = None
        self._lock = threading.Lock()

    # -- life cycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the JAX profile and the scalar writer."""
        if self._started:
            return
        self._started = True
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

    def stop(self) -> dict[str, Any]:
        """Close open spans, write the profile and the last scalars; returns the summary
        also stored in the run metadata (``tensorboard`` key)."""
        if self._stopped or not self._started:
            return self.summary()
        self._stopped = True
        self._close_all()
        self._close_region(final=True)
        self._stop_profile()
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

        try:
            jax.profiler.stop_trace()
        except Exception as exc:  # noqa: BLE001 - the run and its scalars are kept
            self._error("stop (profile)", exc)

    def summary(self) -> dict[str, Any]:
        """What was captured: directory, spans, steps, whether the cap was hit."""
        files = profile_files(self.logdir)
        return {
            "dir": str(self.logdir.resolve()),
            "profile": [str(p.relative_to(self.logdir)) for p in files],
            "spans": self.events,
            "max_events": self.max_events,
            "capped": self.capped_at is not None,
            "capped_after_seconds": self.capped_at,
            "dropped_spans": self.dropped,
            "steps": self._step or len(self._found_steps),
            "notes": list(self.notes),
        }

    def _publish(self, status: str) -> dict[str, Any]:
        summary = {"status": status, **self.summary()}
        if self._set_meta is not None:
            self._set_meta(tensorboard=summary)
        return summary

    # -- steps ----------------------------------------------------------------------

    def step(self) -> None:
        """End the current step (the run's StepEvents call this through :meth:`on_event`)."""
        self._end_step()

    def _end_step(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._close_region(final=False)
            self._step += 1
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

    def _close_region(self, *, final: bool) -> None:
        stats, self._stats = self._stats, _StepStats()
        region, self._region = self._region, None
        if final and self._step == 0 and self._found_steps:
            # steps found when the run ended: their scalars, one point each
            for step in self._found_steps:
                self._write_scalars(step.index, _StepStats.of(step))
            if region is not None:
                region.traceme.set_metadata(note=f"{len(self._found_steps)} steps found in the run's loop")
                region.traceme.__exit__(None, None, None)
            return
        if not final or (self._step > 0 and stats.ran()):
            # a marked step, or work after the last mark (an unfinished step)
            self._write_scalars(self._step, stats)
            meta: dict[str, Any] = {"_r": 1, "step_num": self._step}
        elif self._step == 0:
            # no marks at all: the scalars describe the whole run as one point
            self._write_scalars(0, stats)
            meta = {"note": "no step marks: use torch.optim or call tpu_debug.step()"}
        else:
            meta = {"note": "after the last step"}
        if region is not None:
            region.traceme.set_metadata(**meta)
            region.traceme.__exit__(None, None, None)

    def _write_scalars(self, step: int, stats: _StepStats) -> None:
        writer = self._scalar_writer
        if writer is None:
            return
        try:
            for tag, value in stats.scalars().items():
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

    def _open(self, kind: str, name: str, **meta: Any) -> None:
        if not self._admit():
            return
        stack = self._stack()
        if stack and any(span.kind == kind for span in stack):
            # the runtime does not nest an activity in one of its kind: that one raised
            self._close(kind, unfinished=1)
        tm = self._TraceMe(name, **meta) if meta else self._TraceMe(name)
        tm.__enter__()
        stack.append(_Span(kind, tm))

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
        if inputs is None:
            self._open("execute", self._label(mode, name))
        else:
            self._open("execute", self._label(mode, name), inputs=inputs)

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        if mode == "eager":
            self._stats.eager_ops += 1
        sent = self._collective_bytes.get((mode, name)) if self._collective_bytes else None
        if sent:
            self._stats.collective_bytes += sent
            self._close("execute", collective_bytes=sent)
            return
        self._close("execute")

    def on_compile_begin(self, mode: str, name: str) -> None:
        verb = "recompile" if (mode, str(name)) in self._compiled else "compile"
        self._open("compile", f"{verb} {self._label(mode, str(name))}")

    def on_compile(self, info: Any) -> None:
        name = str(info.name)
        self._inputs[info.key] = inputs = _safe(_inputs(a.recorded() for a in info.args))
        recompile = (info.mode, name) in self._compiled
        self._compiled.add((info.mode, name))
        if info.replayed:
            return
        self._stats.compiles += 1
        self._stats.recompiles += int(recompile)
        self._stats.compile_seconds += float(info.seconds)
        self._close("compile", seconds=_fmt(float(info.seconds)), inputs=inputs)

    def on_transfer_begin(self, direction: str, op: str) -> None:
        self._open("transfer", f"transfer {direction}", op=op)

    def on_transfer(self, info: Any) -> None:
        self._stats.transfer_bytes += int(info.nbytes)
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
                self._end_step()
            return
        line = str(event.location) if event.location is not None else None
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
            stats = self._stats
            if stats.max_divergence is None or event.max_abs > stats.max_divergence:
                stats.max_divergence = float(event.max_abs)
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

    # -- helpers ----------------------------------------------------------------------

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"TensorBoardExporter.{where}", f"{type(exc).__name__}: {exc}")
