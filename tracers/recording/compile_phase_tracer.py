"""The compile phase tracer: dynamo's own timing of each compile, as spans of the run.

Dynamo times the parts of a compile with ``dynamo_timed`` and logs the begin and end of
each as a ``chromium_event`` record of its structured trace (what tlparse draws and
``torch._dynamo.utils.compile_times()`` adds up). This tracer hears them through
:mod:`.dynamo_events` on the compiling thread, pairs each begin with its end, and records
the spans a compile's time is split by (:class:`~tpu_debug.tracers.events.CompilePhaseEvent`):
dynamo's whole compile of a frame and AOTAutograd's deferred backward compile (the units),
bytecode tracing, guards, AOTAutograd's metadata pass and joint graph, and the partition the
runtime times under :data:`~tpu_debug.core.records.PARTITION_SPAN`. The rest of dynamo's
spans are inside these and left to them. Both ends are read on this process's
``perf_counter``, the clock of every other event of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tpu_debug.core.records import PARTITION_SPAN
from tpu_debug.tracers.events import CompilePhaseEvent, SourceLocation
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.recording.dynamo_events import DynamoSpan

__all__ = ["PHASE_OF", "UNIT_OF", "CompilePhaseTracer"]

#: dynamo's spans that are a whole compile: the unit a compile's wall time is read from
UNIT_OF = {"entire_frame_compile": "frame", "entire_backward_compile": "backward"}
#: dynamo's spans that are one phase of a compile
PHASE_OF = {
    "bytecode_tracing": "dynamo_trace",
    "build_guards": "dynamo_guards",
    "aot_collect_metadata": "aot_graph",
    "aot_trace_joint_graph": "aot_graph",
    PARTITION_SPAN: "aot_partition",
}
# frames between the span's handler and the user's call that started the compile are all
# library frames (logging, dynamo), which user_location skips
_DEPTH = 1


class CompilePhaseTracer:
    """Records dynamo's compile spans into a run (a :mod:`.dynamo_events` listener).

    Args:
        writer: the run's writer.
        clock: seconds since the run started (the recorder's clock).
        record_error: keeps a tracer failure in the run, ``(where, message)``.
    """

    def __init__(self, writer: Any, clock: Callable[[], float], record_error: Callable[[str, str], None]) -> None:
        self.writer = writer
        self.clock = clock
        self.record_error = record_error
        self._open: dict[tuple[int, str], list[float]] = {}

    def start(self) -> None:
        dynamo_events.subscribe(self)

    def stop(self) -> None:
        dynamo_events.unsubscribe(self)

    def on_dynamo_span(self, span: DynamoSpan) -> None:
        unit, phase = UNIT_OF.get(span.name), PHASE_OF.get(span.name)
        if unit is None and phase is None:
            return
        thread = threading.get_native_id()
        key = (thread, span.name)
        if span.phase == "B":
            self._open.setdefault(key, []).append(span.at)
            return
        begun = self._open.get(key)
        if not begun:
            return  # began before the trace
        start = begun.pop()
        location: SourceLocation | None = user_location(_DEPTH) if unit is not None else None
        frame = _frame_of(span.compile_id)
        known = dynamo_events.frame_function(frame) if frame is not None else None
        self.writer.put(
            CompilePhaseEvent(
                self.writer.new_id(), self.clock() - (time.perf_counter() - start), "compiled", thread, location,
                phase or "other", span.at - start, span.name, unit, span.compile_id,
                known[0] if known is not None else None,
            )
        )

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self.record_error(f"CompilePhaseTracer.{method}", f"{type(exc).__name__}: {exc}")


def _frame_of(compile_id: str | None) -> int | None:
    """Dynamo's frame id of a compile id (``"3/1"`` -> 3; ``"!0/3/1"``, compiled autograd's)."""
    if not compile_id:
        return None
    head = compile_id.rsplit("/", 1)[0].rsplit("/", 1)[-1]
    return int(head) if head.isdigit() else None
