"""The probe that turns the runtime's notifications into run-store events.

One object is subscribed per trace (``runtime.probes.subscribe``). Its hot
method is ``on_execute``, called for every eager op: it only bumps a counter
and a time total for the executable, unless per-execution events were asked
for. Compiles, transfers and fallbacks are rare and get a full event with the
user's source line; compiles also get their program's HLO (stored once per
content hash).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpu_debug.core.records import (
    CollectiveDone,
    CollectiveInfo,
    CompileInfo,
    DesyncInfo,
    FallbackInfo,
    MaterializeInfo,
    TransferInfo,
)
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.collective_journal import CollectiveJournal, call_record, done_record
from tpu_debug.tracers.events import (
    CollectiveCallEvent,
    CollectiveDesyncEvent,
    CollectiveDoneEvent,
    CompileEvent,
    FallbackEvent,
    InternalErrorEvent,
    KeyDiff,
    MaterializationEvent,
    OpEvent,
    SourceLocation,
    TransferEvent,
)
from tpu_debug.tracers.hlo import make_program, program_hash
from tpu_debug.tracers.recording.lazy_cuts import StepFrames, cut_site
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording.recompile_tracker import RecompileTracker
from tpu_debug.tracers.recording.run_writer import RunWriter, StatRow
from tpu_debug.tracers.reading.transfer_causes import IMPLICIT
from tpu_debug.tracers.recording.transfer_sites import classify_site, classify_upload

__all__ = ["IMPLICIT_TRANSFER_OPS", "Recorder"]

# transfers nobody asked for: a sync to read a value, a scalar operand, a CPU fallback
# (tracers/reading/transfer_causes.py tells them apart)
IMPLICIT_TRANSFER_OPS = IMPLICIT

# frames between the probe method and the runtime's call site: deliver() and the typed
# notification (probes.compiled, ...); all of them library frames user_location skips
_PROBE_DEPTH = 3
# lazy mode's sites whose lines are kept: the runtime keeps 100,000 places before it starts
# its tree again, so every site a graph can still reach is among the latest announced
_SITES_KEPT = 400_000


def _guarded_line(info: CompileInfo, diffs: Sequence[KeyDiff]) -> SourceLocation | None:
    """The user's line a compiled recompile's failed dynamo guard names (where the guarded
    value is read or changed inside the compiled function: ``self.calls += 1``), which is
    the line to change; None when the recompile has no such guard (then the call is)."""
    if info.mode != "compiled" or info.graph is None or not any(d.source == "guard" for d in diffs):
        return None
    failure = dynamo_events.guard_failure(info.graph.origin.compile_id)
    return failure.at if failure is not None else None


def _read_line(info: CompileInfo, diffs: Sequence[KeyDiff], lines: Sequence[SourceLocation | None]) -> SourceLocation | None:
    """For a lazy graph compiled again because one of its inputs took a new shape: the user's
    line of the first op that reads that input (``lines``: each op's), which is where the
    shape comes in; the line that cut the graph (an ``optimizer.step()``) is only where it
    ran. None for any other compile."""
    if info.mode != "lazy" or info.graph is None:
        return None
    for d in diffs:
        if d.aspect == "shape" and d.arg_index is not None:
            leaf = f"in{d.arg_index}"  # the graph's inputs as its ops name them (runtime/lazy.py)
            j = next((j for j, op in enumerate(info.graph.ops) if leaf in op.inputs), None)
            if j is not None and j < len(lines) and lines[j] is not None:
                return lines[j]
    return None


def _where(loc: Any) -> str | None:
    return None if loc is None else f"{loc.file}:{loc.line} in {loc.function}"


class _Executable:
    """One executable's row of counters in the run (``op_stats``)."""

    __slots__ = ("id", "mode", "name", "parts", "program", "signature", "written")

    def __init__(self, id: int, mode: str, name: str, signature: str, program: str | None) -> None:
        self.id = id
        self.mode = mode
        self.name = name
        self.signature = signature
        self.program = program
        self.written = 0  # executions stored so far
        self.parts: list[_Count] = []  # one per thread that ran it


class _Count:
    """One thread's executions of one executable. Only that thread writes it, so no
    increment is lost; the writer thread reads it (``snapshot``)."""

    __slots__ = ("count", "exe", "key", "seconds")

    def __init__(self, exe: _Executable, key: Any) -> None:
        self.exe = exe
        self.key = key
        self.count = 0
        self.seconds = 0.0


def _loc_tuple(loc: Any) -> tuple[str, int, str] | None:
    return (loc.file, loc.line, loc.function) if loc is not None else None


class Recorder:
    """Records what the runtime reports into a :class:`RunWriter`.

    Probes fire on whichever thread does device work (a DataLoader worker, say):
    each thread counts executions in counters of its own, which ``snapshot``
    (the writer thread) adds up, so the hot path takes no lock; compiles, which
    are rare, are recorded under a lock.

    Args:
        writer: where events go.
        hlo: record each compiled program's StableHLO and optimized HLO.
        op_events: record one event per op execution (otherwise executions are
            only counted and timed per executable).
    """

    def __init__(self, writer: RunWriter, *, hlo: bool = True, op_events: bool = False) -> None:
        self.writer = writer
        self.hlo = hlo
        self.op_events = op_events
        self._t0 = time.perf_counter()
        self._stats: dict[Any, _Executable] = {}
        self._keys: dict[Any, tuple[str, str | None]] = {}
        self._latest: dict[tuple[str, str], tuple[str, str | None]] = {}
        self._stat_ids = 0
        self._lock = threading.Lock()  # creating an executable's counters
        self._compile_lock = threading.Lock()  # one compile recorded at a time
        self._local = threading.local()  # .counts: this thread's {key: _Count}
        self.recompiles = RecompileTracker()  # first compile or recompile, and why
        # lazy mode: the user's line of each site announced (on_defer; a fused graph's
        # ops name their sites), the compile event of each fused program compiled in
        # this run, optimizer steps ended
        self._site_lines: dict[int, Any] = {}
        self._lazy_compiles: dict[Any, int] = {}
        self._lazy_step = 0
        self._step_frames = StepFrames()
        self._collective_journal: CollectiveJournal | None = None
        writer.set_stats_source(self.snapshot)

    def clock(self) -> float:
        """Seconds since the recorder started (the run's timestamps)."""
        return time.perf_counter() - self._t0

    # -- probe methods ------------------------------------------------------------------

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        # Found by the key object's identity first: the runtime passes the same key object
        # for every run of a cached executable, and a key (a tuple holding the op overload,
        # whose hash is Python code, and the argument specs) is not cheap to hash per op.
        # The count holds the first key it was found by, so that id is never reused.
        try:
            count = self._local.by_id[id(key)]
            if count.key is not key:
                raise KeyError
        except (AttributeError, KeyError):
            count = self._count_of(mode, name, key)
        count.count += 1
        count.seconds += seconds
        if self.op_events:
            self.writer.put(
                OpEvent(
                    self.writer.new_id(),
                    self.clock() - seconds,
                    mode,
                    threading.get_native_id(),
                    user_location(_PROBE_DEPTH),
                    name,
                    seconds,
                    count.exe.program,
                )
            )

    def on_compile(self, info: CompileInfo) -> None:
        ts = self.clock() - info.seconds
        location = user_location(_PROBE_DEPTH)
        with self._compile_lock:
            self._record_compile(info, ts, location)

    def _record_compile(self, info: CompileInfo, ts: float, location: SourceLocation | None) -> None:
        lazy = info.mode == "lazy" and not info.replayed
        ops = self._op_lines(info) if lazy else ()
        # a replayed compile only becomes history
        seen = self.recompiles.observe(info, op_locations=ops)
        location = _guarded_line(info, seen.diffs) or (_read_line(info, seen.diffs, ops) if lazy else None) or location
        args = tuple(a.recorded() for a in seen.args)
        signature = f"{info.name}({', '.join(a.render() for a in args)})"
        program = None
        if self.hlo:
            stablehlo, hlo = info.stablehlo(), info.hlo()
            program = program_hash(stablehlo, hlo)
            if not self.writer.has_program(program):
                nodes = info.graph.nodes if info.graph is not None else ()
                if lazy:  # a lazy graph's ops, each with the line that recorded it
                    nodes = [
                        {"name": n.name, "target": n.target,
                         "location": _loc_tuple(ops[i] if i < len(ops) else None)}
                        for i, n in enumerate(nodes)
                    ]
                self.writer.add_program(
                    make_program(info.mode, info.name, stablehlo, hlo, nodes, content_hash=program)
                )
        self._keys[info.key] = self._latest[(info.mode, info.name)] = (signature, program)
        exe = self._stats.get(info.key)
        if exe is not None:  # executed before its compile was seen (a recompile of the same key)
            exe.signature, exe.program = signature, program
        if info.replayed:
            return  # compiled before this trace began: known program, not a compile of this run
        event_id = self.writer.new_id()
        seen.bind(event_id)
        if info.mode == "lazy":
            self._lazy_compiles[info.key] = event_id
        # A read-back compiled nothing, so no reader counts it as a compile or a recompile; it is a
        # new program for this op all the same and keeps its diff against the closest earlier key,
        # so the advisor's shapes that keep changing do not depend on what an earlier run cached.
        self.writer.put(
            CompileEvent(
                event_id, ts, info.mode, threading.get_native_id(), location, info.name, signature, args,
                info.seconds, program, seen.previous_event, seen.diffs, seen.identity, info.from_cache,
                info.saved_seconds,
            )
        )

    def on_transfer(self, info: TransferInfo) -> None:
        # what the user did that moved data (.item(), print, if t:, ...), and where
        if info.direction == "h2d":
            up = classify_upload(info.op)
            op, implicit, location, context = up.cause, up.implicit, up.location, up.context
            made = (up.origin, up.follows, up.module, up.made_line)
        else:
            op, implicit, location, context = classify_site(info.op)
            made = (None, None, None, None)
        self.writer.put(
            TransferEvent(
                self.writer.new_id(), self.clock() - info.seconds, None, threading.get_native_id(), location,
                info, op, implicit, _where(context), *made,
            )
        )

    def on_defer(self, name: str, index: int, site: int) -> None:
        lines = self._site_lines
        if len(lines) >= _SITES_KEPT:
            # the oldest sites go: a graph's sites are among the runtime's latest
            for old in list(itertools.islice(lines, len(lines) // 2)):
                del lines[old]
        lines[site] = user_location(_PROBE_DEPTH)

    def _op_lines(self, info: CompileInfo) -> list[SourceLocation | None]:
        """The user's line of each op of a lazy graph (None: recorded while nobody listened)."""
        lines = self._site_lines
        ops = info.graph.ops if info.graph is not None else ()
        return [lines.get(op.site) if op.site is not None else None for op in ops]

    def on_materialize(self, info: MaterializeInfo) -> None:
        trigger, location = cut_site(info.trigger, _PROBE_DEPTH)
        known = self._keys.get(info.key) if info.key is not None else None
        self.writer.put(
            MaterializationEvent(
                self.writer.new_id(),
                self.clock() - info.seconds,
                "lazy",
                threading.get_native_id(),
                location,
                trigger,
                info.name,
                info.ops,
                info.outputs,
                info.inputs,
                info.compiled,
                info.seconds,
                self._lazy_step,
                known[1] if known is not None else None,
                self._lazy_compiles.get(info.key) if info.compiled else None,
                after_step=trigger != "optimizer_step" and self._step_frames.read_after_step(),
            )
        )
        if trigger == "optimizer_step":
            self._lazy_step += 1
            self._step_frames.step_ended()

    def on_fallback(self, info: FallbackInfo) -> None:
        # the arguments in their recorded form: a static value as its text
        recorded = dataclasses.replace(info, args=tuple(a.recorded() for a in info.args))
        self.writer.put(
            FallbackEvent(
                self.writer.new_id(), self.clock() - info.seconds, "eager", threading.get_native_id(),
                user_location(_PROBE_DEPTH), recorded,
            )
        )

    def on_collective(self, info: CollectiveInfo) -> None:
        event = CollectiveCallEvent(
            self.writer.new_id(), self.clock(), None, threading.get_native_id(), user_location(_PROBE_DEPTH), info,
        )
        self.writer.put(event)
        self._journal().write(call_record(event))

    def on_collective_done(self, info: CollectiveDone) -> None:
        # the entry's event holds the user's line
        event = CollectiveDoneEvent(self.writer.new_id(), self.clock(), None, threading.get_native_id(), None, info)
        self.writer.put(event)
        self._journal().write(done_record(event))

    def _journal(self) -> CollectiveJournal:
        """The run's journal of collective calls (see tracers/collective_journal.py)."""
        journal = self._collective_journal
        if journal is None:
            path = getattr(self.writer, "path", None)  # a writer of no file keeps no journal
            journal = self._collective_journal = CollectiveJournal(Path(path).parent if path is not None else None)
        return journal

    def on_collective_desync(self, info: DesyncInfo) -> None:
        self.writer.put(
            CollectiveDesyncEvent(
                self.writer.new_id(), self.clock(), None, threading.get_native_id(), user_location(_PROBE_DEPTH), info,
            )
        )

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.record_error(f"{type(self).__name__}.{method}", text)

    # -- helpers ------------------------------------------------------------------------

    def record_error(self, where: str, message: str) -> None:
        """Keep a tracer failure in the run (the report lists them)."""
        self.writer.put(
            InternalErrorEvent(
                self.writer.new_id(), self.clock(), None, threading.get_native_id(), None, where, message
            )
        )

    def _count_of(self, mode: str, name: str, key: Any) -> _Count:
        """This thread's count of ``key``'s executions, found by equality (an equal key in
        another object: a compiled graph's call builds its key per call)."""
        local = self._local
        counts = getattr(local, "counts", None)
        if counts is None:
            counts = local.counts = {}
            local.by_id = {}
        count = counts.get(key)
        if count is None:
            count = self._new_count(mode, name, key, counts)
            local.by_id[id(key)] = count
        return count

    def _new_count(self, mode: str, name: str, key: Any, counts: dict) -> _Count:
        with self._lock:
            exe = self._stats.get(key)
            if exe is None:
                # compiled mode passes on_execute a shorter key than on_compile (input
                # signature only): fall back to the latest compile of the same graph
                known = self._keys.get(key) or self._latest.get((mode, name))
                signature, program = known if known is not None else (f"{name}(...)", None)
                self._stat_ids += 1
                exe = _Executable(self._stat_ids, mode, name, signature, program)
                self._stats[key] = exe
            count = _Count(exe, key)
            exe.parts.append(count)
        counts[key] = count
        return count

    def snapshot(self) -> list[StatRow]:
        """The per-executable counters changed since the last call (the writer stores them).

        Runs on the writer thread while other threads count: a row may miss the
        executions of the moment, never an execution for good (the next snapshot,
        at the latest the final one, has it).
        """
        with self._lock:
            executables = list(self._stats.values())
        out: list[StatRow] = []
        for exe in executables:
            n, seconds = 0, 0.0
            for part in tuple(exe.parts):
                n += part.count
                seconds += part.seconds
            if n != exe.written:
                out.append((exe.id, exe.mode, exe.name, exe.signature, exe.program, n, seconds))
                exe.written = n
        return out
