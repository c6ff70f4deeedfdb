"""The collectives tracer: collectives and per-device memory of programs spread over several devices.

:class:`CollectivesTracer` is a probe. For every program the runtime
compiles over more than one device (a compiled graph or eager op whose inputs
are sharded over a mesh) it reads the collectives XLA inserted from the
optimized HLO (``core/collectives.py``), ties each to the FX node and user
line that caused it, takes the memory one device needs from XLA's buffer
assignment, and records a :class:`~tpu_debug.tracers.events.CollectivesEvent`.
With a TPU ``target`` (``"v5e:2x4"``) each such program is also compiled by XLA's
TPU compiler for that topology, off the program's thread, and recorded the same
way with ``target`` set: the collectives and memory of the real TPU layout.

The records are read back by ``tracers/reading/program_collectives.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tpu_debug.core.collectives import Collective, module_devices, parse_collectives
from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed import xla_log
from tpu_debug.core.records import CompileInfo
from tpu_debug.runtime.target.errors import TargetSpecError
from tpu_debug.runtime.target.executor import TargetCompiler
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.tracers.events import (
    CollectivesEvent,
    CollectivesTargetEvent,
    ShardingRematEvent,
    SourceLocation,
)
from tpu_debug.tracers.hlo import fx_nodes_from, program_hash
from tpu_debug.tracers.location import is_library_file, user_location

__all__ = ["CollectivesTracer", "sharded"]

# frames between the probe method and the runtime's call site (see recorder._PROBE_DEPTH)
_PROBE_DEPTH = 3
# how long closing a trace waits for target compiles still running
TARGET_WAIT_SECONDS = 120.0


def sharded(info: CompileInfo) -> bool:
    """Whether a compiled program's inputs lie on a mesh (the runtime names their sharding)."""
    return any(k == "sharding" for a in info.args for k, _ in (a.layout or ()))


def _node_lines(info: CompileInfo) -> dict[str, tuple[str, int, str]]:
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
        writer: the run's :class:`~tpu_debug.tracers.recording.run_writer.RunWriter`.
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
            self._compiler = TargetCompiler()
        xla_log.add_reader()  # XLA's warnings about shardings, caught around each compile, come here
        self._reading = True

    # -- probe methods --------------------------------------------------------------------

    def on_compile(self, info: CompileInfo) -> None:
        remats = xla_log.take()  # XLA's warnings of this compile, caught around it by the runtime
        if not sharded(info):
            return
        if info.replayed:  # compiled before the trace: recorded if it runs during the trace
            self._watch_replayed(info)
            return
        self._record(info, remats)

    def _record(self, info: CompileInfo, remats: tuple = ()) -> None:
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

    def _watch_replayed(self, info: CompileInfo) -> None:
        """Record ``info`` when its executable first runs. The watcher listens to executions
        only while such programs wait, so a trace without them pays nothing per op."""
        with self._lock:
            if self._watcher is None:
                self._watcher = _ReplayWatcher(self)
                probes.subscribe(self._watcher)
            self._watcher.waiting[info.key] = info

    def _replayed_ran(self, info: CompileInfo) -> None:
        self._record(info)
        with self._lock:
            if self._watcher is not None and not self._watcher.waiting:
                self._stop_watching()

    def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            probes.unsubscribe(watcher)

    # -- helpers --------------------------------------------------------------------------

    def _put(self, info: CompileInfo, location: SourceLocation | None, program: str | None, devices: int, target: str,
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

    def _put_remat(self, info: CompileInfo, program: str | None, remat: Any, location: SourceLocation | None,
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

    def _target_done(self, future: Future, info: CompileInfo, location: SourceLocation | None, node_lines: dict) -> None:
        # pending until its record is written: close() waits for the record, not the compile
        # (a future is done before its callbacks run)
        try:
            self._write_target(future, info, location, node_lines)
        finally:
            with self._lock:
                if future in self._pending:
                    self._pending.remove(future)

    def _write_target(self, future: Future, info: CompileInfo, location: SourceLocation | None, node_lines: dict) -> None:
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


