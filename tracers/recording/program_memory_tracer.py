"""The program memory tracer: each compiled program's memory at its peak, buffer by buffer.

:class:`ProgramMemoryTracer` records one :class:`~tpu_debug.tracers.events.ProgramMemoryEvent`
per distinct program a run compiles: a graph's (compiled, lazy) as this machine's compiler
assigns it, compiled again with a dump on a worker thread, and, with a TPU target, every
program the target's compiler assigned or refused for HBM (the target tracer hands each
result over). The buffers are read by ``tracers/recording/program_buffers.py``.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from tpu_debug.runtime.local_buffers import local_buffer_assignment
from tpu_debug.core.records import CompileInfo
from tpu_debug.tracers.events import ProgramMemoryEvent, ProgramProtoEvent, SourceLocation
from tpu_debug.tracers.hlo import program_hash
from tpu_debug.tracers.location import user_location
from tpu_debug.core.buffers import BufferAssignment
from tpu_debug.tracers.recording.memory_snapshot import MemorySnapshot, program_snapshot
from tpu_debug.tracers.recording.program_buffers import (
    ProgramContext,
    StorageLines,
    analyse,
    context_of,
    value_frames,
)

__all__ = ["DEFAULT_WAIT", "ProgramMemoryTracer"]


# frames between on_compile and the runtime: deliver() and probes.compiled (library frames)
_PROBE_DEPTH = 3
#: seconds the end of a trace waits for this machine's analyses still running
DEFAULT_WAIT = 60.0


class ProgramMemoryTracer:
    """Records each compiled program's memory at its peak (:class:`~.events.ProgramMemoryEvent`).

    A probe: ``on_compile`` takes what the kinds and lines need (:func:`context_of`) and
    queues this machine's buffer assignment of a graph's program (compiled again with a dump,
    ``runtime.local_buffers``) on one worker thread; ``on_defer`` keeps each lazy site's phase and
    line. With a TPU target, :meth:`on_target` (given to the ``TargetTracer``) records what the
    target's compiler assigned, for every program it compiled or refused for HBM.

    Args:
        writer: the run writer (``put``, ``new_id``).
        clock: seconds since the run started.
        local: analyse the local compiler's assignment of graphs (not in a dry run, which
            compiles nothing locally).
        record_error: ``(where, message)`` keeps a tracer failure in the run.
        phase: the pass running now (``"forward"``, ``"backward"``, ``"optimizer"``), for
            lazy sites; None leaves them unknown.
        lines: where each storage was allocated (the memory tracker's ``line_of``), so a
            program's input is shown at the line that made it; None leaves that unknown.
        snapshot: a :class:`~.memory_snapshot.MemorySnapshot` given each program's own
            snapshot, or None.
    """

    def __init__(self, writer: Any, *, clock: Callable[[], float] | None = None, local: bool = True,
                 record_error: Callable[[str, str], None] | None = None,
                 phase: Callable[[], str] | None = None, lines: StorageLines | None = None,
                 snapshot: MemorySnapshot | None = None) -> None:
        self.writer = writer
        self._lines = lines
        self._snapshot = snapshot
        self.local = local
        self._clock = clock or (lambda: 0.0)
        self._record_error = record_error
        self._phase = phase
        self._sites: dict[int, tuple[str, SourceLocation | None]] = {}
        self._contexts: dict[Any, ProgramContext] = {}  # CompileInfo key -> context
        # target results that came before their program's on_compile: CompileInfo key -> arguments
        self._early: dict[Any, tuple[CompileInfo, Any, str | None, str | None]] = {}
        self._seen: set[tuple[str, str]] = set()  # (source, program hash or name) recorded
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: set[concurrent.futures.Future] = set()
        self._closed = False
        # program ids of the protos written for xprof: far from those of JAX's own capture
        self._program_ids = 1_000_000

    # -- probe methods ------------------------------------------------------------------

    def on_defer(self, name: str, index: int, site: int) -> None:
        phase = self._phase() if self._phase is not None else ""
        self._sites[site] = (phase, user_location(_PROBE_DEPTH))

    def on_compile(self, info: CompileInfo) -> None:
        if info.replayed:
            return
        location = user_location(_PROBE_DEPTH)
        graph = info.graph is not None
        context = context_of(info, self._sites, location, _program_hash(info) if graph else None, self._lines)
        with self._lock:
            if self._closed:
                return
            self._contexts[info.key] = context
            early = self._early.pop(info.key, None)
        if early is not None:
            self._on_worker(self._target, *early, context)
        if self.local and graph and info.lowered is not None and info.compiled is not None:
            self._submit(info.lowered, context, _compiler_bytes(info.compiled.memory_analysis()))

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    # -- this machine's compiler --------------------------------------------------------

    def _submit(self, lowered: Any, context: ProgramContext, compiler: int | None) -> None:
        key = ("local", context.program or context.name)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self._on_worker(self._local, lowered, context, compiler)

    def _on_worker(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the tracer's worker thread (``close`` waits for it)."""
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tpu_debug-buffers")
            future = self._pool.submit(fn, *args)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _local(self, lowered: Any, context: ProgramContext, compiler: int | None) -> None:
        try:
            assignment, hlo = local_buffer_assignment(lowered)
            if assignment is None or hlo is None:
                return
            self._put(analyse(assignment, hlo, context, source="local", compiler_bytes=compiler))
            self._add_snapshot(assignment, hlo, context, None)
        except Exception as exc:  # noqa: BLE001 - a tracer error never reaches the program
            self._error(f"local buffers of {context.name}", exc)

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)

    # -- the target's compiler ----------------------------------------------------------

    def on_target(self, info: CompileInfo, result: Any, program: str | None, tpu_program: str | None) -> None:
        """A target compile of ``info`` finished (the ``TargetTracer``'s result listener, on its
        worker; ``program`` and ``tpu_program`` the content hashes of the local and the target's
        HLO): record the target's assignment, of a graph, or of any program it refused."""
        buffers = getattr(result, "buffers", None)
        hlo = getattr(result, "hlo", None)
        if buffers is None or not hlo:
            return
        refused = result.error is not None and result.error.kind == "hbm_oom"
        if info.graph is None and not refused:
            return  # an eager op's temporaries are the op's own: the held tensors tell that run's memory
        with self._lock:
            context = self._contexts.get(info.key)
            if context is None and not info.replayed and not self._closed:
                # the target's worker can finish before this tracer's on_compile kept the
                # program's context (its kinds and lines): on_compile takes the result up
                self._early[info.key] = (info, result, program, tpu_program)
                return
        self._target(info, result, program, tpu_program, context)

    def _target(self, info: CompileInfo, result: Any, program: str | None, tpu_program: str | None,
                context: ProgramContext | None) -> None:
        """Record the target's assignment of ``info`` (``context`` None: without kinds and lines)."""
        refused = result.error is not None and result.error.kind == "hbm_oom"
        buffers, hlo = result.buffers, result.hlo
        with self._lock:
            key = ("target", tpu_program or str(info.name))
            if key in self._seen:
                return
            self._seen.add(key)
        if context is None:
            context = context_of(info, self._sites)
        memory = result.memory
        compiler = (memory.argument_bytes + memory.output_bytes - memory.alias_bytes + memory.temp_bytes
                    if memory is not None else None)
        if context.program is None and program is not None:
            context = dataclasses.replace(context, program=program)
        error = result.error
        try:
            self._put(analyse(buffers, hlo, context, source="target", target=result.target.name,
                              status="hbm_oom" if refused else "ok", compiler_bytes=compiler,
                              required_bytes=error.required_bytes if refused else None,
                              available_bytes=error.available_bytes if refused else None,
                              tpu_program=tpu_program))
            self._add_snapshot(buffers, hlo, context, result.target.name)
            if result.hlo_proto:
                self._put(ProgramProtoEvent(0, 0.0, context.mode, threading.get_native_id(), context.location,
                                            _viewer_name(context.name, result.target.name), self._next_id(), "target",
                                            base64.b64encode(result.hlo_proto).decode(), result.target.name))
        except Exception as exc:  # noqa: BLE001
            self._error(f"target buffers of {info.name}", exc)

    def _add_snapshot(self, assignment: BufferAssignment, hlo: str, context: ProgramContext,
                      target: str | None) -> None:
        if self._snapshot is not None:
            name = f"{context.name}.{target}" if target else context.name
            self._snapshot.add_program(name, program_snapshot(assignment, value_frames(assignment, hlo, context)))

    def _next_id(self) -> int:
        with self._lock:
            self._program_ids += 1
            return self._program_ids

    # -- the end ------------------------------------------------------------------------

    def close(self, wait: float = DEFAULT_WAIT) -> int:
        """Wait at most ``wait`` seconds for the local analyses still running; the count of
        those that did not finish (dropped)."""
        with self._lock:
            early, self._early = list(self._early.values()), {}
        for args in early:  # no on_compile came for these: recorded without the context
            self._target(*args, None)
        with self._lock:
            pending = set(self._pending)
        _, not_done = concurrent.futures.wait(pending, timeout=max(0.0, wait)) if pending else (set(), set())
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        for future in not_done:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        return len(not_done)

    def _put(self, event: ProgramMemoryEvent | ProgramProtoEvent) -> None:
        with self._lock:
            if self._closed:
                return
        self.writer.put(dataclasses.replace(event, id=self.writer.new_id(), ts=self._clock()))

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"ProgramMemoryTracer.{where}", f"{type(exc).__name__}: {exc}")


def _viewer_name(program: str, target: str) -> str:
    """How xprof lists a program: its name is a file name there (``g1/train_step`` -> ``g1.train_step.v5e``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "." for c in program)
    return f"{safe}.{target}"


def _compiler_bytes(stats: Any) -> int | None:
    """Arguments + outputs - aliased + temporaries of an executable's ``memory_analysis()``."""
    if stats is None:
        return None
    return (int(stats.argument_size_in_bytes) + int(stats.output_size_in_bytes) - int(stats.alias_size_in_bytes)
            + int(stats.temp_size_in_bytes))


def _program_hash(info: CompileInfo) -> str | None:
    """The content hash the recorder stores the local program under."""
    try:
        return program_hash(info.stablehlo(), info.hlo())
    except Exception:  # noqa: BLE001 - a program without texts (a dry run's) has no hash
        return None
