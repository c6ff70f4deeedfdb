"""Collectives and per-device memory of programs spread over several devices.

Recording: :class:`CollectivesTracer` is a probe. For every program the runtime
compiles over more than one device (a compiled graph or eager op whose inputs
are sharded over a mesh) it reads the collectives XLA inserted from the
optimized HLO (``core/collectives.py``), ties each to the FX node and user
line that caused it, takes the memory one device needs from XLA's buffer
assignment, and records a :class:`~tpu_debug.tracers.events.CollectivesEvent`.
With a TPU ``target`` (``"v5e:2x4"``) each such program is also compiled by XLA's
TPU compiler for that topology, off the program's thread, and recorded the same
way with ``target`` set: the collectives and memory of the real TPU layout.

Reading (the report, the TUI; no torch or jax): :func:`program_collectives`
(each program's latest record), :func:`collective_totals` and
:func:`compare_ranks`, which finds the first place where the ranks of a
multi-process run compiled different programs or collective sequences.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from tpu_debug.core.collectives import Collective, module_devices, parse_collectives
from tpu_debug.runtime import probes
from tpu_debug.runtime.probes import CompileInfo
from tpu_debug.runtime.target.errors import TargetSpecError
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.tracers.events import (
    CollectivesEvent,
    CollectivesTargetEvent,
    ShardingRematEvent,
    SourceLocation,
)
from tpu_debug.tracers.hlo import fx_nodes_from, program_hash
from tpu_debug.tracers.location import is_library_file, user_location

# The report and the TUI import this module to read runs back: what loads jax or torch (the target compiler, XLA's log reader)
# is imported where a recording first uses it.

__all__ = [
    "CollectivesTracer",
    "CollectiveTotals",
    "RankDifference",
    "program_collectives",
    "program_calls",
    "collective_totals",
    "compare_ranks",
    "sharded",
]

# frames between the probe method and the runtime's call site (see recorder._PROBE_DEPTH)
_PROBE_DEPTH = 3
# how long closing a trace waits for target compiles still running
TARGET_WAIT_SECONDS = 120.0


def sharded(info: Any) -> bool:
    """Whether a compiled program's inputs lie on a mesh (the runtime names their sharding)."""
    return any(k == "sharding" for a in info.args for k, _ in (a.layout or ()))


def _node_lines(info: Any) -> dict[str, tuple[str, int, str]]:
    graph = getattr(info, "graph", None)
    if graph is None:
        return {}
    return {
        n.name: (n.location.file, n.location.line, n.location.function)
        for n in fx_nodes_from(graph.nodes)
        if n.location is not None
    }


def _user_file(file: str) -> bool:
    return not file.startswith("<") and not is_library_file(file)


def _memory(stats: Any) -> dict[str, int | None]:
    if stats is None:
        return {k: None for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "code_bytes")}
    get = (lambda name: getattr(stats, name, None))
    if hasattr(stats, "argument_size_in_bytes"):  # XLA's CompiledMemoryStats
        return {
            "argument_bytes": int(get("argument_size_in_bytes")),
            "output_bytes": int(get("output_size_in_bytes")),
            "alias_bytes": int(get("alias_size_in_bytes")),
            "temp_bytes": int(get("temp_size_in_bytes")),
            "code_bytes": int(get("generated_code_size_in_bytes")),
        }
    return {  # runtime.target's MemoryStats
        "argument_bytes": stats.argument_bytes,
        "output_bytes": stats.output_bytes,
        "alias_bytes": stats.alias_bytes,
        "temp_bytes": stats.temp_bytes,
        "code_bytes": stats.generated_code_bytes,
    }


class CollectivesTracer:
    """Records the collectives and per-device memory of every program over several devices.

    Args:
        writer: the run's :class:`~tpu_debug.tracers.store.RunWriter`.
        clock: the run's clock (seconds since it started).
        record_error: where a failure of this tracer goes (the program goes on).
        hlo: HLO is recorded, so events may name their program by content hash.
        target: a TPU target (parsed when the trace starts): also compile each program for it.
    """

    def __init__(
        self,
        writer: Any,
        *,
        clock: Callable[[], float],
        record_error: Callable[[str, str], None],
        hlo: bool = True,
        target: Target | None = None,
    ) -> None:
        self.writer = writer
        self.clock = clock
        self.record_error = record_error
        self.hlo = hlo
        self.target = target
        self._seen: set[tuple[Any, str]] = set()
        self._lock = threading.Lock()
        self._pending: list[Future] = []
        self._compiler: Any = None
        self._watcher: _ReplayWatcher | None = None
        if target is not None:
            from tpu_debug.runtime.target.executor import TargetCompiler

            self._compiler = TargetCompiler()
        from tpu_debug.runtime.distributed import xla_log

        xla_log.add_reader()  # XLA's warnings about shardings, caught around each compile, come here
        self._reading = True

    # -- probe methods --------------------------------------------------------------------

    def on_compile(self, info: CompileInfo) -> None:
        from tpu_debug.runtime.distributed import xla_log

        remats = xla_log.take()  # XLA's warnings of this compile, caught around it by the runtime
        if not sharded(info):
            return
        if info.replayed:  # compiled before the trace: recorded if it runs during the trace
            self._watch_replayed(info)
            return
        self._record(info, remats)

    def _record(self, info: Any, remats: tuple = ()) -> None:
        hlo = info.hlo()
        devices = module_devices(hlo)
        if devices <= 1:
            return
        program = program_hash(info.stablehlo(), hlo) if self.hlo else None
        with self._lock:
            seen = (program or info.key, "")
            if seen in self._seen:
                return
            self._seen.add(seen)
        location = user_location(_PROBE_DEPTH)
        node_lines = _node_lines(info)
        for remat in remats:
            self._put_remat(info, program, remat, location, node_lines)
        collectives = parse_collectives(hlo, user_file=_user_file, node_lines=node_lines)
        if info.mode == "eager" and not collectives:
            return  # an eager op that runs shard by shard (x * 2): nothing to tell
        memory = None
        try:
            memory = info.compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - a backend without memory stats: the collectives still count
            memory = None
        self._put(info, location, program, devices, "", collectives, _memory(memory), info.seconds, None)
        if self._compiler is not None and info.lowered is not None:
            future = self._compiler.submit_lowered(info.lowered, self.target)
            with self._lock:
                self._pending.append(future)
            future.add_done_callback(lambda f: self._target_done(f, info, location, node_lines))

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self.record_error(f"CollectivesTracer.{method}", f"{type(exc).__name__}: {exc}")

    def _watch_replayed(self, info: Any) -> None:
        """Record ``info`` when its executable first runs. The watcher listens to executions
        only while such programs wait, so a trace without them pays nothing per op."""
        with self._lock:
            if self._watcher is None:
                self._watcher = _ReplayWatcher(self)
                probes.subscribe(self._watcher)
            self._watcher.waiting[info.key] = info

    def _replayed_ran(self, info: Any) -> None:
        self._record(info)
        with self._lock:
            if self._watcher is not None and not self._watcher.waiting:
                self._stop_watching()

    def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            probes.unsubscribe(watcher)

    # -- helpers --------------------------------------------------------------------------

    def _put(self, info: Any, location: SourceLocation | None, program: str | None, devices: int, target: str,
             collectives: tuple[Collective, ...], memory: dict, seconds: float, error: str | None) -> None:
        self.writer.put(
            CollectivesEvent(
                self.writer.new_id(),
                self.clock(),
                info.mode,
                threading.get_native_id(),
                location,
                str(info.name),
                program,
                devices,
                target,
                collectives,
                seconds=float(seconds),
                error=error,
                **memory,
            )
        )

    def _put_remat(self, info: Any, program: str | None, remat: Any, location: SourceLocation | None,
                   node_lines: dict) -> None:
        first = remat.node.split(",", 1)[0]
        if first in node_lines:  # the user's line of the FX node whose value was resharded
            file, line, function = node_lines[first]
            location = SourceLocation(file, line, function)
        self.writer.put(ShardingRematEvent(
            self.writer.new_id(), self.clock(), info.mode, threading.get_native_id(), location, str(info.name),
            program, remat.from_sharding, remat.to_sharding, remat.instruction, remat.shape, remat.opcode,
            remat.aten_op, remat.node, remat.text,
        ))

    def _target_done(self, future: Future, info: Any, location: Any, node_lines: dict) -> None:
        # pending until its record is written: close() waits for the record, not the compile
        # (a future is done before its callbacks run)
        try:
            self._write_target(future, info, location, node_lines)
        finally:
            with self._lock:
                if future in self._pending:
                    self._pending.remove(future)

    def _write_target(self, future: Future, info: Any, location: Any, node_lines: dict) -> None:
        try:
            try:
                result = future.result()
            except TargetSpecError as exc:  # a target with fewer chips than the program's devices
                self._put(info, location, None, 0, self.target.name, (), _memory(None), 0.0, str(exc))
                return
            if result.ok:
                collectives = parse_collectives(result.hlo or "", user_file=_user_file, node_lines=node_lines)
                devices = module_devices(result.hlo or "") or 1
                error = None
            else:
                collectives, devices = (), 0
                error = f"{result.error.kind}: {result.error.message}"
            self._put(info, location, None, devices, self.target.name, collectives, _memory(result.memory),
                      result.seconds, error)
        except Exception as exc:  # noqa: BLE001 - this runs on the compiler's thread: recorded, never raised
            self.record_error("CollectivesTracer.target", f"{type(exc).__name__}: {exc}")

    def close(self, timeout: float = TARGET_WAIT_SECONDS) -> int:
        """Wait up to ``timeout`` seconds for target compiles still running; returns how many did not finish."""
        with self._lock:
            self._stop_watching()
            reading, self._reading = self._reading, False
        if reading:
            from tpu_debug.runtime.distributed import xla_log

            xla_log.remove_reader()
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                pending[0].result(timeout=left)
            except Exception:  # noqa: BLE001 - the done callback records what went wrong
                pass
        with self._lock:
            unfinished = len(self._pending)
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)
            self.writer.put(CollectivesTargetEvent(
                self.writer.new_id(), self.clock(), None, threading.get_native_id(), None, self.target.name, unfinished,
            ))
        return unfinished


class _ReplayWatcher:
    """Hears executions while programs compiled before the trace wait for their first run."""

    def __init__(self, tracer: CollectivesTracer) -> None:
        self.tracer = tracer
        self.waiting: dict[Any, Any] = {}

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        info = self.waiting.pop(key, None)
        if info is not None:
            self.tracer._replayed_ran(info)

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self.tracer.on_internal_error(f"replay.{method}", exc)


# ---------------------------------------------------------------------------------------
# Reading a run (the report and the TUI)
# ---------------------------------------------------------------------------------------


def program_collectives(session: Any, *, target: str | None = "") -> list[CollectivesEvent]:
    """The latest collectives record of each program (``target``: ``""`` for the run's own
    devices, a target name, or None for all), most bytes sent first."""
    latest: dict[tuple[str, str, str | None], CollectivesEvent] = {}
    for e in session.events("collectives"):
        if target is None or e.target == target:
            latest[(e.name, e.target, e.program)] = e
    return sorted(latest.values(), key=lambda e: (-e.collective_bytes, e.name))


def program_calls(session: Any, events: Sequence[CollectivesEvent]) -> dict[int, int]:
    """How many times each program of ``events`` ran (by event id): from its program's
    execution count, or its op or graph's when HLO was not recorded."""
    by_hash = {p.hash: p.count for p in session.programs()} if any(e.program for e in events) else {}
    by_name: dict[str, int] = {}
    if any(not e.program for e in events):
        for o in session.ops():
            by_name[o.name] = by_name.get(o.name, 0) + o.executed().count
    return {e.id: (by_hash.get(e.program, 0) if e.program else by_name.get(e.name, 0)) for e in events}


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveTotals:
    """The collectives of a run's programs, summed over programs (each counted once)."""

    programs: int
    collectives: int
    wire_bytes: int
    by_opcode: dict[str, tuple[int, int]]  # opcode -> (count, wire bytes)
    peak_memory: int | None  # the largest per-device memory of one program
    devices: int


def collective_totals(events: Sequence[CollectivesEvent]) -> CollectiveTotals:
    by_opcode: dict[str, tuple[int, int]] = {}
    for e in events:
        for c in e.collectives:
            n, b = by_opcode.get(c.opcode, (0, 0))
            by_opcode[c.opcode] = (n + 1, b + c.wire_bytes)
    memories = [e.memory_bytes for e in events if e.memory_bytes is not None]
    return CollectiveTotals(
        len(events),
        sum(len(e.collectives) for e in events),
        sum(e.collective_bytes for e in events),
        by_opcode,
        max(memories) if memories else None,
        max((e.devices for e in events), default=0),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RankDifference:
    """Where the ranks of a multi-process run first disagree.

    ``index`` is the position in each rank's sequence of multi-device programs
    (compile order), ``what`` names the aspect (``"program"``: a different program
    at that position, ``"collectives"``: the same program with other collectives,
    ``"count"``: a rank compiled fewer programs), ``per_rank`` each rank's side as
    text, with the line that made it.
    """

    index: int
    what: str
    per_rank: tuple[tuple[int, str], ...]

    def render(self) -> str:
        sides = "; ".join(f"rank {r}: {text}" for r, text in self.per_rank)
        return f"program #{self.index + 1} differs ({self.what}): {sides}"


def _signature(e: CollectivesEvent) -> tuple:
    return tuple((c.opcode, c.shape, c.replica_groups) for c in e.collectives)


def _side(e: CollectivesEvent | None) -> str:
    if e is None:
        return "compiled nothing more"
    where = f" at {e.location}" if e.location is not None else ""
    if not e.collectives:
        return f"{e.name}{where}, no collectives"
    first = e.collectives[0]
    extra = f" (+{len(e.collectives) - 1} more)" if len(e.collectives) > 1 else ""
    return f"{e.name}{where}: {first.describe()} from {first.op or first.scope or '?'} at {first.location}{extra}"


def compare_ranks(per_rank: Sequence[tuple[int, Sequence[CollectivesEvent]]]) -> RankDifference | None:
    """The first program (in compile order) the ranks disagree on, or None.

    Args:
        per_rank: (rank, its collectives events on the run's own devices, oldest first).
    """
    seqs = [(rank, [e for e in events if not e.target]) for rank, events in per_rank]
    if len(seqs) < 2:
        return None
    longest = max(len(s) for _, s in seqs)
    for i in range(longest):
        here = [(rank, s[i] if i < len(s) else None) for rank, s in seqs]
        if any(e is None for _, e in here):
            return RankDifference(i, "count", tuple((r, _side(e)) for r, e in here))
        keys = {(e.program, _signature(e)) for _, e in here if e is not None}
        if len(keys) == 1:
            continue
        sigs = {_signature(e) for _, e in here if e is not None}
        what = "collectives" if len(sigs) > 1 else "program"
        return RankDifference(i, what, tuple((r, _side(e)) for r, e in here))
    return None
