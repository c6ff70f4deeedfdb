"""tpu_debug's own artifacts in PyTorch's structured trace (``TORCH_TRACE``), where tlparse shows them.

A program run under ``TORCH_TRACE=DIR`` already writes dynamo's account of each
compile (frames, guards, graphs) for tlparse. While a trace records, a
:class:`TorchTraceEmitter` adds what only tpu_debug knows, each as a structured
``"artifact"`` (``torch._logging.trace_structured``) under the dynamo compile id
of the graph it is about, so tlparse files it beside dynamo's own artifacts of
that compile:

==============================  ======  ==============================================
artifact                        format  what
==============================  ======  ==============================================
``tpu_debug_hlo_<kind>``        string  the XLA program a graph became (optimized HLO),
                                        ``<kind>``: forward, backward, inference,
                                        train_step or optimizer_step
``tpu_debug_recompile``         json    a recompile: the compile it replaces and its
                                        differences (:class:`~.events.KeyDiff` fields,
                                        and each rendered as the report renders it)
``tpu_debug_tpu_hlo_<kind>``    string  the same graph compiled for the TPU target
                                        (``--target``): the TPU's optimized HLO
==============================  ======  ==============================================

It hears a compile twice, on the thread that compiled: as the recorder's
:class:`~.events.CompileEvent` (a run-writer listener: the recompile's diffs) and
then as the runtime's ``CompileInfo`` (a probe subscribed after the recorder: the
program's text and dynamo's compile id). The TPU compiles finish on the target
compiler's worker; their text is read back from the run when the trace ends (so they
need the run's HLO recording, ``hlo=True``, the default). A graph's program may be compiled
when it first runs, after dynamo's compile returned: its artifacts are filed under that
compile's id and the attempt the log wrote last for it (dynamo restarts a compile as a
new attempt at a graph break; the last attempt is the one that made the graph).

Only graphs of compiled mode are written (eager ops and lazy graphs have no dynamo
compile id to file them under). The trace wires this only when ``TORCH_TRACE`` is
set (:func:`enabled`): otherwise nothing here runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from tpu_debug.core.records import CompileInfo
from tpu_debug.tracers.events import CompileEvent, KeyDiff, TargetCompileEvent
from tpu_debug.tracers.reading.recompile_analysis import describe, explain

__all__ = ["HLO_ARTIFACT", "RECOMPILE_ARTIFACT", "TPU_HLO_ARTIFACT", "TorchTraceEmitter", "enabled"]

HLO_ARTIFACT = "tpu_debug_hlo"
RECOMPILE_ARTIFACT = "tpu_debug_recompile"
TPU_HLO_ARTIFACT = "tpu_debug_tpu_hlo"

_TRACE_LOGGER = "torch.__trace"  # the logger trace_structured writes to


def enabled() -> bool:
    """True when the program writes PyTorch's structured trace (``TORCH_TRACE`` names a directory)."""
    return bool(os.environ.get("TORCH_TRACE", "").strip())


def _emit(name: str, encoding: str, payload: Callable[[], str], compile_id: str | None, attempt: int) -> None:
    """One artifact, filed under dynamo compile ``compile_id`` ("0/1"), ``attempt``."""
    import torch
    from torch._logging import trace_structured

    def metadata() -> dict[str, str]:
        return {"name": name, "encoding": encoding}

    guards = torch._guards
    current = guards.CompileContext.current_trace_id()
    if compile_id is None or (current is not None and str(current.compile_id) == compile_id):
        trace_structured("artifact", metadata_fn=metadata, payload_fn=payload)
        return
    # outside the compile (the runtime may compile a graph's program when it first runs it; the
    # TPU compiles are read back at the end): that compile's context, so tlparse files the
    # artifact with the compile's own
    context = guards.CompileContext(guards.CompileId.from_string(compile_id))
    context.attempt = attempt
    with guards.compile_context(context):
        trace_structured("artifact", metadata_fn=metadata, payload_fn=payload)


class _Attempts(logging.Handler):
    """Which attempt of each dynamo compile the log wrote last: dynamo restarts a compile
    (a graph break, say) as a new attempt, and the last one is the compile that made the graph."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.last: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        md = getattr(record, "metadata", None)
        if isinstance(md, dict) and "frame_id" in md and isinstance(md.get("attempt"), int):
            self.last[f"{md['frame_id']}/{md.get('frame_compile_id')}"] = md["attempt"]


def _diff(d: KeyDiff) -> dict[str, Any]:
    return {**dataclasses.asdict(d), "field": d.field, "text": describe(d)}


class TorchTraceEmitter:
    """Writes tpu_debug's artifacts of each compiled graph into the structured trace.

    :meth:`start` it, subscribe it as a probe after the recorder and ``on_event`` as a
    run-writer listener; when the recording ends, unsubscribe both and :meth:`close` it
    with the run's reader.

    Args:
        record_error: keeps a failure in the run, ``(where, message)``.

    Example::

        emitter = TorchTraceEmitter(recorder.record_error)
        emitter.start(); writer.add_listener(emitter.on_event); probes.subscribe(emitter)
        ...; probes.unsubscribe(emitter); writer.remove_listener(emitter.on_event)
        emitter.close(session.programs.text)
    """

    def __init__(self, record_error: Callable[[str, str], None] | None = None) -> None:
        self._record_error = record_error
        self._local = threading.local()  # the CompileEvent the recorder just wrote on this thread
        self._lock = threading.Lock()
        self._attempts = _Attempts()
        self._compile_ids: dict[int, str] = {}  # CompileEvent id -> dynamo compile id
        self._graphs: dict[str, tuple[str, int, str]] = {}  # program hash -> (compile id, attempt, kind)
        self._targets: list[TargetCompileEvent] = []

    def start(self) -> None:
        """Start following which attempt of each dynamo compile is the current one."""
        logging.getLogger(_TRACE_LOGGER).addHandler(self._attempts)

    def on_event(self, event: Any) -> None:
        """Run-writer listener: keeps what the recorder and the target tracer record of graphs."""
        try:
            if isinstance(event, CompileEvent) and event.mode == "compiled":
                self._local.event = event
            elif isinstance(event, TargetCompileEvent) and event.mode == "compiled" and event.tpu_program:
                with self._lock:
                    self._targets.append(event)
        except Exception as exc:  # noqa: BLE001 - a writer listener must not raise
            self.on_internal_error("on_event", exc)

    def on_compile(self, info: CompileInfo) -> None:
        """Probe: a graph was compiled; write its program and, for a recompile, why."""
        event, self._local.event = getattr(self._local, "event", None), None
        graph = info.graph
        if info.mode != "compiled" or info.replayed or graph is None:
            return
        compile_id = graph.origin.compile_id
        attempt = self._attempts.last.get(compile_id, 0) if compile_id is not None else 0
        if event is not None and event.name != str(info.name):
            event = None  # not this compile's (it was written by another probe's compile)
        hlo = info.hlo()
        label = graph.label or graph.kind
        _emit(f"{HLO_ARTIFACT}_{label}", "string", lambda: hlo, compile_id, attempt)
        if event is None or compile_id is None:
            return
        with self._lock:
            self._compile_ids[event.id] = compile_id
            if event.program is not None:
                self._graphs[event.program] = (compile_id, attempt, label)
            previous = self._compile_ids.get(event.previous) if event.previous is not None else None
        if event.diffs:
            payload = json.dumps(self._recompile(event, previous))
            _emit(RECOMPILE_ARTIFACT, "json", lambda: payload, compile_id, attempt)

    @staticmethod
    def _recompile(event: CompileEvent, previous: str | None) -> dict[str, Any]:
        identity = event.identity or event.name
        return {
            "identity": identity,
            "graph": event.name,
            "previous_compile_id": previous,
            "diffs": [_diff(d) for d in event.diffs],
            "explanation": explain(identity, event.diffs, location=event.location),
        }

    def close(self, read_program: Callable[[str], Any]) -> None:
        """Writes the TPU programs the target compiled (``read_program(hash)`` gives a program's
        texts, ``.hlo``; call it once the run holds everything recorded) and stops."""
        logging.getLogger(_TRACE_LOGGER).removeHandler(self._attempts)
        with self._lock:
            targets, self._targets = self._targets, []
            graphs = dict(self._graphs)
        for event in targets:
            known = graphs.get(event.program) if event.program is not None else None
            if known is None:
                continue  # a graph compiled before the trace, or HLO not recorded
            compile_id, attempt, kind = known
            try:
                text = read_program(event.tpu_program).hlo
            except Exception as exc:  # noqa: BLE001 - the other programs are still written
                self.on_internal_error("close", exc)
                continue
            _emit(f"{TPU_HLO_ARTIFACT}_{kind}", "string", lambda text=text: text, compile_id, attempt)

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"TorchTraceEmitter.{method}", f"{type(exc).__name__}: {exc}")
