"""The target tracer: every program the runtime compiles, compiled again for a real TPU target.

With ``trace(target="v5e")`` a :class:`TargetTracer` hears every compile of the
runtime (an eager op's executable or a compiled graph, ``CompileInfo.lowered``)
and hands the lowering to XLA's TPU compiler on the target compiler's worker
thread (``runtime.target.compile_lowered_for_target_async``): the user's thread
only queues it. A lowering that holds a custom call only the CPU has (LAPACK's,
for ``torch.linalg``) is refused by the TPU compiler; its function is then
lowered again for the TPU (``compile_for_target_async`` on ``CompileInfo.jitted``), as is
one holding a Pallas kernel interpreted for CPU (``torch.tpu.pallas.jax_op``).

What comes back is recorded beside the local program, one
:class:`~tpu_debug.tracers.events.TargetCompileEvent` per distinct program: the
TPU's optimized HLO (stored once per content hash, in the programs table with
mode ``"target"``), per-device memory, the compiler's cost analysis, the
program on the target's roofline, the arrays its TPU tiles pad most, and the
compiler's refusal when it refuses (an HBM out-of-memory with its figures).
The tracer also counts which programs each training step ran (it listens to
the run's ``StepEvent``: the step tracker says where steps end), so
that when the trace ends it can estimate each step's time on the target and
its MFU (:class:`~tpu_debug.tracers.events.TargetStepEvent`). At the end it
waits a bounded time for compiles still running, and counts those that did not
finish (:class:`~tpu_debug.tracers.events.TargetSummaryEvent`).

In a dry run (``runtime/dry_mode.py``) the runtime sends every program to the
target's compiler itself; the tracer then compiles nothing and records the
dry run's own compile of each lowering (``reuse``), at the dry run's effort level.

What the recorded events show the user should change is read back by
``tracers/reading/target_findings.py``.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from tpu_debug.core.hlo_text import Computation as _Computation
from tpu_debug.core.hlo_text import Instruction as _Instruction
from tpu_debug.core.hlo_text import Module as _Module
from tpu_debug.core.hlo_text import matmul_flops as _matmul_flops
from tpu_debug.core.hlo_text import parse_module as _parse_module
from tpu_debug.core.records import CompileInfo
from tpu_debug.runtime import xla_options
from tpu_debug.runtime.pallas import INTERPRETED_KERNEL
from tpu_debug.runtime.target import (
    GENERATIONS,
    compile_for_target_async,
    compile_lowered_for_target_async,
    hbm_capacity,
    libtpu_version,
    parse_target,
    require_libtpu,
    roofline,
)
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.runtime.target.layout import padded_elements, padding_report
from tpu_debug.tracers.events import (
    InternalErrorEvent,
    PaddedBuffer,
    SourceLocation,
    StepEvent,
    TargetCompileEvent,
    TargetStepEvent,
    TargetSummaryEvent,
)
from tpu_debug.tracers.hlo import fx_nodes_from, make_program, map_nodes, parse_instructions, program_hash
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.reading.target_findings import TARGET_MODE
from tpu_debug.tracers.recording.recompile_tracker import identity_of

__all__ = ["DEFAULT_WAIT", "TargetTracer"]

#: seconds the end of a trace waits for target compiles still running or queued
DEFAULT_WAIT = 60.0
#: arrays kept per program, the most padded first
WORST_KEPT = 5

# frames between on_compile and the runtime: deliver() and probes.compiled (library frames)
_PROBE_DEPTH = 3


def _wasted_flops(
    ins: _Instruction,
    module: _Module,
    padded_elements: Callable[[tuple[int, ...], Any], int | None],
    seen: set[str] | None = None,
) -> float:
    """Products computed on padding by the matrix multiplies and convolutions of ``ins``
    (itself, or inside the computations it calls): each one's flops times its padded over
    logical output elements, minus its flops. The matrix unit computes whole output tiles."""
    seen = set() if seen is None else seen
    total = 0.0
    for name in ins.called:
        body = module.computation(name)
        if name in seen or body is None:
            continue
        seen.add(name)
        for inner in body.instructions:
            total += _wasted_flops_of(inner, body, module, padded_elements, seen)
    return total


def _wasted_flops_of(ins: _Instruction, body: _Computation, module: _Module, padded_elements, seen) -> float:
    if ins.opcode in ("dot", "convolution"):
        flops = _matmul_flops(ins, body)
        out = ins.shape.array
        if flops is None or out is None or out.layout is None:
            return 0.0
        padded = padded_elements(out.dims, out.layout)
        logical = out.elements
        if not padded or not logical or padded <= logical:
            return 0.0
        return flops * (padded / logical - 1.0)
    if ins.opcode in ("fusion", "call", "async-start", "custom-call"):
        return _wasted_flops(ins, module, padded_elements, seen)
    return 0.0


def _pad_dims(shape: tuple[int, ...], layout: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The logical dimensions the first tile pads, with the multiple each must be to pad nothing.

    The tile applies to the most-minor physical dimensions (``minor_to_major`` read
    backwards gives the physical order, major first); further tiles (``(2,1)`` for
    bfloat16) split the first one into words and pad nothing more."""
    if not layout.tiles or len(layout.minor_to_major) != len(shape):
        return (), ()
    tile = layout.tiles[0]
    physical = list(reversed(layout.minor_to_major))
    dims, multiples = [], []
    for i, t in enumerate(tile):
        position = len(physical) - len(tile) + i
        if position < 0 or t is None or t <= 1:
            continue
        d = physical[position]
        if shape[d] % t:
            dims.append(d)
            multiples.append(int(t))
    return tuple(dims), tuple(multiples)


# ---------------------------------------------------------------------------------
# The tracer
# ---------------------------------------------------------------------------------


class _Result:
    """What step estimates need of one program's target compile."""

    __slots__ = ("bytes_accessed", "estimated_seconds", "flops", "memory_bytes")

    def __init__(self, event: TargetCompileEvent) -> None:
        self.estimated_seconds = event.estimated_seconds
        self.flops = event.flops or 0.0
        self.bytes_accessed = event.bytes_accessed or 0.0
        self.memory_bytes = event.memory_bytes


class _Done:
    """What is kept of a ``CompileInfo`` once its target compile is recorded: its name."""

    __slots__ = ("mode", "name")
    lowered = jitted = None

    def __init__(self, info: CompileInfo) -> None:
        self.name, self.mode = info.name, info.mode


class _Program:
    """One executable the runtime compiled (by key), and its target compile."""

    __slots__ = ("info", "level", "location", "result", "submitted")

    def __init__(self, info: CompileInfo, location: SourceLocation | None, level: str | None = None) -> None:
        self.info = info
        self.location = location
        # XLA's effort level of its target compile, as asked for when the runtime compiled it
        self.level = level
        self.submitted = False
        self.result: _Result | None = None


class TargetTracer:
    """Compiles every program the runtime compiles for a TPU target and records what it gives.

    A probe (subscribe it with ``replay=True``): ``on_compile`` queues the target
    compile of each new program, ``on_execute`` counts the programs each step
    runs, and :meth:`on_step` (a ``StepTracker`` listener) ends a step. Programs compiled before the trace are compiled for the target when
    they first run in it. Results are recorded from the compiler's worker thread.

    Args:
        writer: the run writer (``put``, ``add_program``, ``has_program``, ``new_id``).
        target: the ``runtime.target.Target`` (parsed when the trace starts).
        clock: seconds since the run started.
        record_error: ``(where, message)`` keeps a tracer failure in the run.
        hlo: also store the TPU's optimized HLO (and refer to the local program).
        reuse: ``reuse(lowered) -> Future[TargetCompile] | None``: the target compile
            someone else started for a lowering (a dry run's, ``runtime.dry_mode.target_future``).
            When given, the tracer compiles nothing itself: a program with no such
            compile is not recorded.
        optimization_level: XLA's effort level of the compiles (``"O0"``...; None: the
            compiler's default), recorded with each; with ``reuse``, the level they ran at.

    Raises:
        TargetSpecError: ``target`` names no TPU.
        LibtpuMissingError: libtpu is not installed.

    Example::

        tracer = TargetTracer(writer, parse_target("v5e"), clock=recorder.clock)
        probes.subscribe(tracer, replay=True); step_tracker.add_listener(tracer.on_step)
        ...; probes.unsubscribe(tracer); tracer.close(wait=60.0)
    """

    def __init__(
        self,
        writer: Any,
        target: Target,
        *,
        clock: Callable[[], float] | None = None,
        record_error: Callable[[str, str], None] | None = None,
        hlo: bool = True,
        reuse: Callable[[Any], concurrent.futures.Future | None] | None = None,
        optimization_level: str | None = None,
    ) -> None:
        self.target = target
        require_libtpu()
        self.writer = writer
        self.hlo = hlo
        self._reuse = reuse
        self.optimization_level = optimization_level
        self._clock = clock or (lambda: 0.0)
        self._record_error = record_error
        self._lock = threading.Lock()
        self._programs: dict[Any, _Program] = {}
        self._by_text: dict[str, _Result] = {}  # StableHLO hash -> the program's recorded result
        self._pending: set[concurrent.futures.Future] = set()
        # notified when a compile leaves _pending: a future is done before its callback has
        # analysed and recorded the result, so close() waits for this, not for the futures
        self._left = threading.Condition(self._lock)
        self._closed = False
        self._counts: dict[Any, int] = {}  # executions per key in the current step
        self._steps: list[tuple[int, dict[Any, int]]] = []  # (StepEvent index, executions per key)
        self._patterns: dict[frozenset, dict[Any, int]] = {}
        self.stats = {"programs": 0, "compiled": 0, "cached": 0, "refused": 0, "failed": 0}
        self.compile_seconds = 0.0
        self._listeners: list[Callable[[Any, Any, str | None, str | None], None]] = []

    def add_listener(self, listener: Callable[[Any, Any, str | None, str | None], None]) -> None:
        """Call ``listener(info, result, program, tpu_program)`` with each target compile recorded
        (on the compiler's worker thread): the runtime's ``CompileInfo``, the ``TargetCompile``,
        and the content hashes of the local and the target's HLO (None when not stored)."""
        self._listeners.append(listener)

    # -- life cycle ---------------------------------------------------------------------

    def close(
        self,
        wait: float = DEFAULT_WAIT,
        *,
        interrupted: Callable[[], bool] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """End the last step, wait at most ``wait`` seconds for target compiles still
        running or queued, and record the step estimates and the summary.

        Compiles that did not finish in time are counted and dropped (a compile the
        worker is running finishes in the background; its result is not recorded).

        Args:
            wait: seconds to wait at most.
            interrupted: polled while waiting; True stops the wait (a Ctrl-C held
                while the trace closes).
            say: tells the user, once, that the end waits for compiles (a line).
        """
        with self._lock:
            counts, self._counts = self._counts, {}
        tail = counts if (counts or not self._steps) else None
        self._submit_executed(counts)
        start = time.perf_counter()
        deadline = start + max(0.0, float(wait))
        told = say is None
        while True:  # a refused compile may queue its re-lowering: wait for those too
            with self._lock:
                pending = len(self._pending)
            remaining = deadline - time.perf_counter()
            if not pending or remaining <= 0 or (interrupted is not None and interrupted()):
                break
            if not told and time.perf_counter() - start > 1.0:
                told = True
                say(f"tpu_debug: waiting up to {remaining:.0f} s for {pending} TPU target compile(s) "
                    "still running (Ctrl-C skips them)")
            with self._lock:
                if len(self._pending) == pending:
                    self._left.wait(timeout=min(remaining, 0.25))
        with self._lock:
            self._closed = True
            unfinished = set(self._pending)
            self._pending.clear()
        for future in unfinished:
            future.cancel()
        waited = time.perf_counter() - start
        self._record_steps(tail)
        self._record_summary(len(unfinished), waited, float(wait))

    def on_evict(self, mode: str, name: str, key: Any) -> None:
        # the runtime dropped the executable: running it again compiles it again (a new
        # on_compile), so a program not yet sent to the target compiler is let go with it
        with self._lock:
            program = self._programs.get(key)
            if program is not None and not program.submitted:
                del self._programs[key]

    # -- steps --------------------------------------------------------------------------

    def on_step(self, step: StepEvent) -> None:
        """A step ended (a ``StepTracker`` listener, with its ``StepEvent``): its estimate
        is recorded under the step's index."""
        try:
            self._end_step(step.index)
        except Exception as exc:  # noqa: BLE001 - never break the program's step
            self._error("on_step", exc)

    def _end_step(self, index: int) -> None:
        with self._lock:
            if self._closed:
                return
            counts, self._counts = self._counts, {}
        # steps of a training loop run the same programs: one dict per distinct pattern
        pattern = frozenset(counts.items())
        self._steps.append((index, self._patterns.setdefault(pattern, counts)))
        self._submit_executed(counts)

    # -- probe methods (the runtime calls these) ---------------------------------------

    def on_compile(self, info: CompileInfo) -> None:
        location = None if info.replayed else user_location(_PROBE_DEPTH)
        # the level the local compile was asked for (TorchTPU's TORCH_TPU_INTERNAL_XLA_OPTIONS, a
        # custom_compiler_options block) is the level a TPU would compile the program at: read on
        # the compiling thread, where a block's level is set
        level = self.optimization_level if self._reuse is not None else (
            self.optimization_level or xla_options.optimization_level())
        program = _Program(info, location, level)
        with self._lock:
            if self._closed:
                return
            self._programs[info.key] = program
        if not info.replayed:  # one compiled before the trace is compiled for the target if it runs
            self._submit(program)

    def on_execute(self, mode: str, name: str, key: Any, seconds: float) -> None:
        with self._lock:
            counts = self._counts
            counts[key] = counts.get(key, 0) + 1

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    # -- target compiles (queued on the user's thread, finished on the worker) ----------

    def _submit_executed(self, counts: dict[Any, int]) -> None:
        for key in counts:
            program = self._programs.get(key)
            if program is not None and not program.submitted:
                self._submit(program)

    def _submit(self, program: _Program) -> None:
        program.submitted = True
        info = program.info
        if info.lowered is None:
            return
        if self._reuse is not None:
            future = self._reuse(info.lowered)
            if future is None:
                return
        else:
            future = compile_lowered_for_target_async(info.lowered, self.target, optimization_level=program.level)
        self._track(future, program, relowered=False)

    def _track(self, future: concurrent.futures.Future, program: _Program, *, relowered: bool) -> None:
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(lambda f: self._finished(f, program, relowered))

    def _finished(self, future: concurrent.futures.Future, program: _Program, relowered: bool) -> None:
        """On the compiler's worker thread: analyse and record one target compile."""
        done = True
        try:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is not None:
                self._failed(program, exc)
                return
            result = future.result()
            if not relowered and program.info.jitted is not None and (
                (result.error is not None and result.error.kind == "compile_error"
                 and "custom_call" in program.info.stablehlo())
                or _holds_interpreted_kernel(program.info.stablehlo())
            ):
                done = not self._relower(program)
                return
            self._record(program, result, relowered)
        except Exception as exc:  # noqa: BLE001 - a tracer error never reaches the program
            self._failed(program, exc)
        finally:
            if done:
                # the runtime's executable (and its lowering) is no longer kept alive by this tracer
                program.info = _Done(program.info)
            with self._lock:
                self._pending.discard(future)
                self._left.notify_all()

    def _relower(self, program: _Program) -> bool:
        """Queue the TPU lowering and compile of ``program``'s function; False when the trace ended."""

        info = program.info
        args, kwargs = info.lowered.in_avals
        # the runtime lowers with 64-bit types on; so must the TPU lowering
        future = compile_for_target_async(info.jitted, args, self.target, abstract_kwargs=kwargs, x64=True,
                                          optimization_level=program.level)
        with self._lock:
            if self._closed:
                future.cancel()
                return False
        self._track(future, program, relowered=True)
        return True

    def _failed(self, program: _Program, exc: BaseException) -> None:
        with self._lock:
            if self._closed:
                return
            self.stats["failed"] += 1
        self._error(f"compile {program.info.name}", exc)

    def _record(self, program: _Program, result: Any, relowered: bool) -> None:
        info = program.info
        stablehlo = info.stablehlo()
        text_hash = program_hash(stablehlo, "")
        with self._lock:
            known = self._by_text.get(text_hash)
            if known is not None:  # the same program under another key (an evicted op compiled again)
                program.result = known
                return
        event = self._event(program, result, relowered, stablehlo)
        with self._lock:
            if self._closed:
                return
            program.result = self._by_text[text_hash] = _Result(event)
            self.stats["programs"] += 1
            self.stats["compiled" if result.ok else "refused"] += 1
            if result.cached:
                self.stats["cached"] += 1
            else:
                self.compile_seconds += float(result.seconds)
        self.writer.put(event)  # outside the lock: put may wait for a writer that fell behind
        for listener in self._listeners:
            try:
                listener(info, result, event.program, event.tpu_program)
            except Exception as exc:  # noqa: BLE001 - a listener's failure is a tracer error
                self._error(f"listener of {info.name}", exc)

    def _event(self, program: _Program, result: Any, relowered: bool, stablehlo: str) -> TargetCompileEvent:
        """The recorded form of a target compile (runs on the worker: parsing TPU HLO costs)."""
        info = program.info
        args = tuple(a.recorded() for a in info.args)
        signature = f"{info.name}({', '.join(a.render() for a in args)})"
        local = tpu = None
        if self.hlo:
            local = program_hash(stablehlo, info.hlo())
            if not self.writer.has_program(local):
                local = None  # recorded by the recorder, or not at all: never a dangling hash
            if result.hlo:
                tpu = program_hash(f"{TARGET_MODE} {self.target.topology}", result.hlo)
                if not self.writer.has_program(tpu):
                    self.writer.add_program(
                        make_program(TARGET_MODE, f"{info.name}@{self.target.name}", "", result.hlo,
                                     content_hash=tpu)
                    )
        fields: dict[str, Any] = {}
        memory, cost = result.memory, result.cost
        if memory is not None:
            fields.update(argument_bytes=memory.argument_bytes, output_bytes=memory.output_bytes,
                          alias_bytes=memory.alias_bytes, temp_bytes=memory.temp_bytes,
                          code_bytes=memory.generated_code_bytes)
        if cost is not None:
            line = roofline(result)
            fields.update(flops=cost.flops, transcendentals=cost.transcendentals,
                          bytes_accessed=cost.bytes_accessed, xla_seconds=cost.optimal_seconds,
                          intensity=line.intensity if math.isfinite(line.intensity) else None,
                          bound=line.bound, estimated_seconds=line.seconds)
        if result.hlo:
            logical, padded, worst = self._padding(program, result.hlo)
            fields.update(padding_logical_bytes=logical, padding_padded_bytes=padded, worst=worst)
        error = result.error
        if error is not None:
            fields.update(error_code=error.code, error_message=error.message, required_bytes=error.required_bytes,
                          available_bytes=error.available_bytes, error_what=error.what,
                          error_code_printed=error.code_printed, error_instruction=error.instruction,
                          error_source_file=error.source_file, error_source_line=error.source_line,
                          error_source_function=error.source_function)
            if error.instruction and result.hlo:
                op, where = self._made_where(program, result.hlo, error.instruction)
                fields.update(error_op=op, error_file=where.file if where else None,
                              error_line=where.line if where else None,
                              error_function=where.function if where else None)
            if error.required_bytes is not None:
                larger = _larger_targets(error.required_bytes)
                fields.update(larger_targets=tuple(name for name, _, _ in larger),
                              larger_hbm_bytes=tuple(usable for _, usable, _ in larger),
                              larger_spec_bytes=tuple(spec for _, _, spec in larger))
        status = "ok" if error is None else error.kind
        seconds = float(result.seconds)
        ts = self._clock() - (0.0 if result.cached else seconds)
        return TargetCompileEvent(
            self.writer.new_id(), ts, info.mode, threading.get_native_id(), program.location,
            str(info.name), self.target.name, signature, args, seconds, status,
            identity=_identity(info), program=local, tpu_program=tpu, cached=bool(result.cached),
            relowered=relowered, optimization_level=program.level, **fields,
        )

    def _made_where(self, program: _Program, hlo: str, name: str) -> tuple[str | None, SourceLocation | None]:
        """The op (graph node) and PyTorch line that made HLO instruction ``name`` of the TPU
        program (its metadata's scope read back to the graph's node), else the line that
        compiled the program."""
        info = program.info
        entry_body = _parse_module(hlo).entry or _Computation("", True, ())
        op_names = {i.name: i for i in parse_instructions(hlo) if i.computation == entry_body.name}
        described = _described(name, op_names, entry_body)
        nodes = fx_nodes_from(info.graph.nodes) if info.graph is not None else ()
        node_by_name = {n.name: n for n in nodes}
        if nodes and described is not None:
            pairs = map_nodes([described], node_by_name)
            if pairs:
                node = node_by_name[pairs[0][0]]
                return (f"{node.name}|{node.target}" if node.target else node.name), node.location or program.location
        return (described.op_name if described is not None else None), program.location

    def _padding(self, program: _Program, hlo: str) -> tuple[int, int, tuple[PaddedBuffer, ...]]:
        """The entry computation's arrays in HBM: logical and padded bytes, the worst few
        with the op and line that made them and the matmul products spent on padding."""
        info = program.info
        report = padding_report(hlo)
        ranked = report.worst(WORST_KEPT)
        if not ranked:
            return report.logical_bytes, report.padded_bytes, ()
        module = _parse_module(hlo)
        entry_body = module.entry or _Computation("", True, ())
        op_names = {i.name: i for i in parse_instructions(hlo) if i.computation == entry_body.name}
        nodes = fx_nodes_from(info.graph.nodes) if info.graph is not None else ()
        node_by_name = {n.name: n for n in nodes}
        out = []
        for buf in ranked:
            op, where = str(info.name), program.location
            described = _described(buf.name, op_names, entry_body)
            if nodes and described is not None and buf.opcode != "parameter":
                pairs = map_nodes([described], node_by_name)
                if pairs:
                    node = node_by_name[pairs[0][0]]
                    op = f"{node.name}|{node.target}" if node.target else node.name
                    where = node.location or where
            ins = entry_body.get(buf.name)
            wasted = 0.0
            if ins is not None and buf.output_index is None:
                wasted = _wasted_flops_of(ins, entry_body, module, padded_elements, set())
            dims, multiples = _pad_dims(buf.shape, buf.layout)
            out.append(PaddedBuffer(
                buf.name, buf.opcode, buf.dtype, tuple(buf.shape), str(buf.layout), int(buf.logical_bytes),
                int(buf.padded_bytes), dims, multiples, op, float(wasted),
                where.file if where else None, where.line if where else None, where.function if where else None,
            ))
        return report.logical_bytes, report.padded_bytes, tuple(out)

    # -- what the trace records at its end ----------------------------------------------

    def _record_steps(self, tail: dict[Any, int] | None) -> None:
        peak = self.target.peak_bf16_flops_per_device
        steps = [(index, counts, False) for index, counts in self._steps]
        if tail is not None:
            # work after the last step end is a step that did not finish, numbered as the next
            # one would have been; in a run that ended no step it is the whole run, step 0
            steps.append((self._steps[-1][0] + 1 if self._steps else 0, tail, bool(self._steps)))
        if len(steps) > 1:
            # a step that ran no program here (an optimizer on CPU tensors) has nothing to estimate
            steps = [s for s in steps if s[1]]
        estimates: dict[int, tuple] = {}
        for number, counts, unfinished in steps:
            pattern = id(counts)
            if pattern not in estimates:
                estimates[pattern] = self._estimate(counts)
            executions, estimated, seconds, flops, nbytes, memory = estimates[pattern]
            mfu = flops / (seconds * peak) if seconds > 0 else None
            self.writer.put(TargetStepEvent(
                self.writer.new_id(), self._clock(), None, threading.get_native_id(), None,
                self.target.name, number, executions, estimated, seconds, flops, nbytes, mfu, memory,
                unfinished, whole_run=not self._steps,
            ))

    def _estimate(self, counts: dict[Any, int]) -> tuple[int, int, float, float, float, int | None]:
        executions = estimated = 0
        seconds = flops = nbytes = 0.0
        memory: int | None = None
        for key, n in counts.items():
            executions += n
            program = self._programs.get(key)
            result = program.result if program is not None else None
            if result is None or result.estimated_seconds is None:
                continue
            estimated += n
            seconds += n * result.estimated_seconds
            flops += n * result.flops
            nbytes += n * result.bytes_accessed
            if result.memory_bytes is not None and (memory is None or result.memory_bytes > memory):
                memory = result.memory_bytes
        return executions, estimated, seconds, flops, nbytes, memory

    def _record_summary(self, unfinished: int, waited: float, limit: float) -> None:
        t = self.target
        stats = self.stats
        self.writer.put(TargetSummaryEvent(
            self.writer.new_id(), self._clock(), None, threading.get_native_id(), None,
            t.name, t.topology, t.chips, hbm_capacity(t)[0], t.peak_bf16_flops_per_device,
            t.hbm_bandwidth_per_device, libtpu_version(), stats["programs"], stats["compiled"],
            stats["cached"], stats["refused"], stats["failed"], unfinished, self.compile_seconds, waited, limit,
        ))

    def _error(self, where: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if self._record_error is not None:
            self._record_error(f"TargetTracer.{where}", text)
        else:
            self.writer.put(InternalErrorEvent(
                self.writer.new_id(), self._clock(), None, threading.get_native_id(), None,
                f"TargetTracer.{where}", text,
            ))


# instructions that move or rename another instruction's value: its op is the producer's
_MOVES = frozenset({"copy", "copy-start", "copy-done", "bitcast", "get-tuple-element", "reshape", "transpose"})


def _described(name: str, described: dict[str, Any], entry: _Computation) -> Any:
    """The instruction whose metadata names the op that made ``name``: itself, or for a copy
    the compiler added (no metadata), the instruction it copies."""
    for _ in range(8):
        found = described.get(name)
        if found is not None and found.op_name:
            return found
        ins = entry.get(name)
        if ins is None or ins.opcode not in _MOVES or not ins.operands:
            return found
        name = ins.operands[0]
    return None


def _larger_targets(required: int) -> list[tuple[str, int, int]]:
    """``(generation, usable, spec)`` for each generation one device of which offers ``required``
    bytes: usable as its compiler counts it (what a program must fit in, below the spec sheet's),
    the spec sheet's where libtpu cannot be asked."""
    out = []
    for name in GENERATIONS:
        target = parse_target(name)
        usable, _source = hbm_capacity(target)
        if usable >= required:
            out.append((name, int(usable), int(target.spec_hbm_bytes_per_device)))
    return out


def _identity(info: CompileInfo) -> str:
    return identity_of(info)[1]



def _holds_interpreted_kernel(stablehlo: str) -> bool:
    """A Pallas kernel of ``torch.tpu.pallas.jax_op`` runs interpreted in a CPU lowering; lowered
    again for the TPU, the program holds the kernel itself (runtime/pallas.py)."""
    return INTERPRETED_KERNEL in stablehlo
