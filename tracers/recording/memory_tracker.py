"""The memory tracker: live device bytes per step, the peak and who held it, and whether it fits.

:class:`MemoryTracer` is the probe (``on_alloc``/``on_free``, see
``runtime/memory_ledger.py``): it charges each storage's bytes to the user line that
allocated it and the phase it ran in (forward, backward, optimizer), keeps live
bytes and the peak of each step, and at the end writes one
:class:`~.events.MemoryStepEvent` per step, a :class:`~.events.MemorySummaryEvent`
and, when a TPU target was given, the evidence of the fit as
:class:`~.events.MemoryFindingEvent` records: the need against one device with
fixes estimated from the same figures (:func:`plan_fixes`), and each program
the TPU compiler refused for want of HBM. Whether that is a finding is the
advisor's decision (``tracers/advisor/fit_rules.py``, through
``tracers/reading/memory_view.py``'s ``fit_verdicts``).
Steps end where the run's step source says (:meth:`MemoryTracer.on_step`, a
``StepTracker`` listener); what runs after the last step is recorded as one
more step, not counted among the run's steps.

What counts: the payloads `tpu` tensors hold (parameters, gradients, optimizer
state, activations kept for backward, inputs), each payload once, plus the
largest program's temporaries (its compiler's figure). With a TPU target, each
payload counts at its padded size on the target: the bytes the TPU compiler gives
an entry parameter of that shape and dtype (``runtime/target/padding.py``), so an
f32[N,10,10] under ``{0,2,1:T(8,128)}`` counts 1.6x its logical bytes; without one,
at its logical bytes. What does not count: XLA's own buffers outside tensors
(executables, the runtime's caches).

The peak's holders are a copy of the per-line totals taken when a new high is
followed by a free; within a step, copies are taken again only when the high
grew by 1/256 or more, so the holders are those of a moment within 0.4 % of the
peak (the peak's byte count itself is exact).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tpu_debug.runtime import memory_ledger
from tpu_debug.runtime.target.capacity import hbm_capacity
from tpu_debug.runtime.target.padding import padded_bytes
from tpu_debug.core.records import AllocInfo, CompileInfo, FreeInfo, LoweredNode
from tpu_debug.tracers.events import (
    MemoryFindingEvent,
    MemoryFix,
    MemoryHolder,
    MemoryStepEvent,
    MemorySummaryEvent,
    SourceLocation,
    StepEvent,
)
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.recording.memory_snapshot import MemorySnapshot, frames_here, node_frames
from tpu_debug.tracers.recording.program_buffers import node_facts
from tpu_debug.tracers.reading.memory_view import BEFORE_TRACE, ESTIMATE, PROGRAM_OOM, fit_verdicts

__all__ = [
    "MemoryTracer",
    "ProgramMemory",
    "current_phase",
    "holder_kind",
    "plan_fixes",
]

TOP_HOLDERS = 10
FINDING_HOLDERS = 3
_REFRESH = 1 / 256  # a step's peak copy is taken again once the peak grew by this fraction
# "forward" is everything outside the backward pass and the optimizer's step: the forward,
# the loss, building the model, loading data
_PHASES = ("forward", "backward", "optimizer", BEFORE_TRACE)

class _Site:
    """Bytes live now from one (line, phase)."""

    __slots__ = ("location", "phase", "call", "nbytes", "logical", "tensors", "largest", "shape", "dtype")

    def __init__(self, location: SourceLocation | None, phase: str, call: SourceLocation | None = None) -> None:
        self.location = location
        self.phase = phase
        self.call = call  # for a compiled graph's output (made at ``location``): the line that called it
        self.nbytes = 0
        self.logical = 0  # nbytes at the tensors' logical size (nbytes are padded on a target)
        self.tensors = 0
        self.largest = 0
        self.shape: tuple[int, ...] = ()
        self.dtype = ""

    def holder(self, nbytes: int, tensors: int, logical: int, kind: str = "") -> MemoryHolder:
        loc, call = self.location, self.call
        return MemoryHolder(loc.file if loc else "", loc.line if loc else 0, loc.function if loc else "",
                            self.phase, nbytes, tensors, self.shape, self.dtype, logical, kind,
                            call.file if call else "", call.line if call else 0)


@dataclasses.dataclass(slots=True)
class _Snapshot:
    """Live bytes at one moment: total, per site, per phase, float32."""

    ts: float
    live: int
    sites: list[tuple[_Site, int, int, int]]  # site, bytes, tensors, logical bytes
    phases: dict[str, int]
    float32: int
    float32_shapes: dict[tuple[int, ...], int] | None = None  # logical float32 bytes per shape (a target's)


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramMemory:
    """A program's memory as its compiler assigned it.

    ``source``: ``"target"`` (the TPU compiler) or ``"local"`` (this machine's).
    ``error`` holds an HBM out-of-memory's figures: ``required_bytes`` what the
    compiler counted, ``available_bytes`` one device's HBM.
    """

    name: str
    temp_bytes: int
    source: str
    oom: bool = False
    required_bytes: int = 0
    available_bytes: int = 0


class MemoryTracer:
    """Records device memory per step, the peak's holders, and the fit against a TPU target.

    A probe (``on_alloc``, ``on_free``, ``on_compile``) and a listener of the run's steps
    (:meth:`on_step`, given to ``StepTracker.add_listener``); without one (``dry_run()`` of
    a function), the whole run is one step.

    Args:
        writer: where events go (a ``RunWriter``), or None to keep them only
            (``summary`` and ``findings`` after :meth:`close`).
        clock: seconds since the run started.
        target: a ``runtime.target.Target`` to compare the need with, or None.
        dry_run: the run is a dry run (recorded in the summary).
        record_error: ``record_error(where, message)`` for the tracer's own failures.
        snapshot: a :class:`~.memory_snapshot.MemorySnapshot` told every charge and release,
            with the frames that allocated each storage, or None.
    """

    def __init__(self, writer: Any = None, *, clock: Callable[[], float] | None = None, target: Any = None,
                 dry_run: bool = False, record_error: Callable[[str, str], None] | None = None,
                 snapshot: MemorySnapshot | None = None) -> None:
        self.writer = writer
        self.snapshot = snapshot
        self.clock = clock or _clock()
        self.target = target
        self.dry_run = dry_run
        self._record_error = record_error
        # storage serial id -> [site, bytes charged (padded on a target), float32, logical bytes,
        # its shape (a float32 one, on a target)]
        self._storages: dict[int, list] = {}
        # logical float32 bytes live per shape, on a target: what bfloat16 would pad them to
        self._float32_shapes: dict[tuple[int, ...], int] = {}
        self._padding: dict[tuple, tuple[int, int] | None] = {}  # (shape, dtype) -> (padded, logical)
        self._sites: dict[tuple, _Site] = {}
        self._node_lines: dict[tuple, SourceLocation | None] = {}
        self._phases = dict.fromkeys(_PHASES, 0)
        self.live = 0
        self.float32 = 0
        self._hooks: list = []
        self._lock = threading.RLock()
        # the step now
        self.step_index = 0
        self._step_ts = 0.0
        self._step_peak = 0
        self._step_peak_ts = 0.0
        self._rising = False
        self._step_snapshot: _Snapshot | None = None
        # the run
        self.steps: list[MemoryStepEvent] = []
        self.peak = 0
        self.peak_step = 0
        self._peak_snapshot: _Snapshot | None = None
        self._peak_end_phases: dict[str, int] = {}
        self._peak_end_live = 0
        self._peak_end_sites: dict[int, int] = {}  # id of a site -> its bytes at the peak step's end
        self.programs: dict[str, ProgramMemory] = {}
        self._live_at_run: dict[str, int] = {}  # program -> the most held when it began to run
        self.trained = False  # a backward pass or an optimizer step allocated
        self.stopped: tuple[str, SourceLocation | None] | None = None
        self.dry_programs = 0
        self.summary: MemorySummaryEvent | None = None
        self.records: list[MemoryFindingEvent] = []  # the fit's evidence (see _evidence)
        self._closed = False
        self._finished = 0  # steps the step source ended (what follows the last is the run's tail)
        self._changed = False  # memory changed since the last step ended

    # -- set-up ------------------------------------------------------------------------

    def start(self) -> None:
        """Begin (steps end where the run's step source says: :meth:`on_step`)."""
        self._step_ts = self.clock()

    def on_step(self, step: StepEvent) -> None:
        """A step ended (a ``StepTracker`` listener): its memory record gets the step's index."""
        try:
            self.end_step(step.index)
        except Exception as exc:  # noqa: BLE001 - never break the program's step
            self._error("on_step", exc)

    # -- probe methods -----------------------------------------------------------------

    def on_alloc(self, info: AllocInfo) -> None:
        with self._lock:
            if info.new:
                if info.existing:
                    key: tuple = (None, BEFORE_TRACE)
                elif info.node is not None:  # a compiled graph's output: the model's line, then the call's
                    key = (self._node_line(info.node), self._phase(), user_location(3))
                else:
                    key = (user_location(3), self._phase())
                site = self._sites.get(key)
                if site is None:
                    site = self._sites[key] = _Site(*key)
                site.tensors += 1
                float32 = info.dtype == "float32"
                shape = tuple(info.shape) if float32 and self.target is not None else None
                record = [site, 0, float32, 0, shape]
                self._storages[info.storage] = record
            else:
                record = self._storages.get(info.storage)
                if record is None:
                    return
            n = info.nbytes
            if not n:
                return
            self._changed = True
            site = record[0]
            record[3] += n
            site.logical += n
            if record[4] is not None:
                self._float32_shapes[record[4]] = self._float32_shapes.get(record[4], 0) + n
            logical = n
            n = self._padded(info, n)
            record[1] += n
            site.nbytes += n
            if self.snapshot is not None:
                frames = frames_here(3) if info.new and not info.existing else []
                if info.node is not None:
                    frames = node_frames(info.node.stack_trace) + frames
                self.snapshot.alloc(info.storage, n, logical, frames)
            if n > site.largest:
                site.largest, site.shape, site.dtype = n, tuple(info.shape), info.dtype
            self.live += n
            self._phases[site.phase] += n
            if site.phase in ("backward", "optimizer"):
                self.trained = True
            if record[2]:
                self.float32 += n
            if self.live > self._step_peak:
                self._step_peak = self.live
                self._rising = True

    def on_free(self, info: FreeInfo) -> None:
        with self._lock:
            record = self._storages.get(info.storage)
            if record is None:
                return
            if self._rising:
                self._take_snapshot()
            self._changed = True
            site = record[0]
            # the padded share of what leaves: all of it when the storage is freed whole
            n = record[1] if info.nbytes >= record[3] else record[1] * info.nbytes // max(1, record[3])
            record[3] -= info.nbytes
            site.logical -= info.nbytes
            if record[4] is not None:
                left = self._float32_shapes.get(record[4], 0) - info.nbytes
                if left > 0:
                    self._float32_shapes[record[4]] = left
                else:
                    self._float32_shapes.pop(record[4], None)
            record[1] -= n
            site.nbytes -= n
            self.live -= n
            if self.snapshot is not None:
                self.snapshot.free(info.storage, n, info.nbytes)
            self._phases[site.phase] -= n
            if record[2]:
                self.float32 -= n
            if info.dead:
                site.tensors -= 1
                del self._storages[info.storage]

    def _padded(self, info: AllocInfo, n: int) -> int:
        """``n`` logical bytes of ``info``'s payload as the target lays them out.

        Padded here, when the bytes arrive, not when figures are summed up: the step
        peaks and the moment whose holders are kept are found by comparing live bytes
        at each allocation, so they must be the padded bytes already, or the padded
        peak's moment and holders could be those of another (the logical peak's). The
        cost is a dict read per allocation; a shape not seen before costs one lookup
        of the compiler's figure (a compile of about 0.1 s, once per machine: cached).
        """
        if self.target is None:
            return n
        key = (tuple(info.shape), info.dtype)
        sizes = self._padding.get(key, ())
        if sizes == ():
            sizes = self._padding[key] = _padded_size(self.target, *key)
        if sizes is None:  # no figure from the compiler: the logical bytes
            return n
        padded, logical = sizes
        return padded if n == logical else n * padded // logical

    def on_compile(self, info: CompileInfo) -> None:
        compiled = getattr(info, "compiled", None)
        if compiled is None:
            return
        stats = compiled.memory_analysis()
        temp = int(getattr(stats, "temp_size_in_bytes", 0) or 0)
        name = str(info.name)
        known = self.programs.get(name)
        if known is None or temp > known.temp_bytes:
            self.programs[name] = ProgramMemory(name, temp, "local")

    def on_execute_begin(self, mode: str, name: Any, key: Any) -> None:
        # a program's temporaries exist while it runs, on top of what is held then: the weights'
        # initialisation runs early and never meets the forward's peak
        name = str(name)
        if self.live > self._live_at_run.get(name, -1):
            self._live_at_run[name] = self.live

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    def _node_line(self, node: LoweredNode) -> SourceLocation | None:
        """The line inside the model that made a graph node (dynamo's stack trace of it)."""
        key = (node.name, node.stack_trace)
        found = self._node_lines.get(key, ())
        if found == ():
            found = self._node_lines[key] = node_facts(node, "").location
        return found

    def line_of(self, storage: int) -> tuple[SourceLocation | None, bool] | None:
        """(the user line that allocated storage ``storage``, whether it was allocated before the
        trace began), None for a storage not tracked."""
        with self._lock:
            record = self._storages.get(storage)
            if record is None:
                return None
            site = record[0]
            return site.location, site.phase == BEFORE_TRACE

    # -- what the dry run adds -----------------------------------------------------------

    def add_target_programs(self, programs: list) -> None:
        """The dry run's target compiles (``runtime.dry_mode.ProgramCompile``): their temporaries
        replace this machine's figure for the same program, and out-of-memory refusals are kept."""
        for p in programs:
            result = p.result
            if result is None:
                continue
            self.dry_programs += 1
            name = str(p.name)
            known = self.programs.get(name)
            if result.ok:
                temp = int(result.memory.temp_bytes)
                if known is None or known.source != "target" or temp > known.temp_bytes:
                    if not (known is not None and known.oom):
                        self.programs[name] = ProgramMemory(name, temp, "target")
            elif result.error.kind == "hbm_oom":
                e = result.error
                self.programs[name] = ProgramMemory(name, 0, "target", True, int(e.required_bytes or 0),
                                                    int(e.available_bytes or 0))

    def stop_at(self, what: str, location: SourceLocation | None) -> None:
        """The dry run stopped early: ``what`` needed a value, at ``location``."""
        self.stopped = (what, location)

    # -- steps -----------------------------------------------------------------------------

    def _phase(self) -> str:
        return current_phase(3)

    def _take_snapshot(self) -> None:
        self._rising = False
        snap = self._step_snapshot
        if snap is not None and self.live < snap.live * (1 + _REFRESH):
            return
        self._step_snapshot = _Snapshot(
            self.clock(), self.live,
            [(s, s.nbytes, s.tensors, s.logical) for s in self._sites.values() if s.nbytes > 0],
            dict(self._phases), self.float32,
            dict(self._float32_shapes) if self.target is not None else None,
        )

    def end_step(self, index: int | None = None) -> None:
        """End the current step (number ``index``, by default the one after the last):
        apply pending frees, record its live and peak bytes."""
        memory_ledger.drain()
        with self._lock:
            if index is not None:
                self.step_index = index
            self._finished = self.step_index + 1
            if self._rising or self._step_snapshot is None:
                self._rising = True
                self._take_snapshot()
            snap = self._step_snapshot
            holders: tuple[MemoryHolder, ...] = ()
            if self._step_peak > self.peak or self._peak_snapshot is None:
                self.peak, self.peak_step = self._step_peak, self.step_index
                self._peak_snapshot = snap
                self._peak_end_phases = dict(self._phases)
                self._peak_end_live = self.live
                self._peak_end_sites = {id(s): s.nbytes for s in self._sites.values()}
                holders = _top(snap.sites, TOP_HOLDERS, self._peak_end_sites, self.trained)
            event = MemoryStepEvent(self._new_id(), self._step_ts, None, threading.get_native_id(), None,
                                    self.step_index, self.live, self._step_peak, snap.ts, len(self._storages),
                                    holders)
            self.steps.append(event)
            self._put(event)
            self.step_index += 1
            self._step_ts = self.clock()
            self._step_peak = self.live
            self._step_snapshot = None
            self._rising = False
            self._changed = False

    # -- the end -------------------------------------------------------------------------

    def close(self) -> MemorySummaryEvent:
        """Unhook, end the last step, and write the summary (and the findings)."""
        if self._closed and self.summary is not None:
            return self.summary
        self._closed = True
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if not self.steps or self._changed:  # what ran after the last step mark is recorded too
            finished = self._finished
            self.end_step()
            self._finished = finished or 1  # a run without steps is one step
        self.summary = self._summarize()
        self._put(self.summary)
        for record in self._evidence():
            self.records.append(record)
            self._put(record)
        return self.summary

    @property
    def findings(self) -> list[MemoryFindingEvent]:
        """What does not fit, read from the evidence after :meth:`close` (see :func:`fit_verdicts`)."""
        return fit_verdicts(self.records)

    def _summarize(self) -> MemorySummaryEvent:
        snap = self._peak_snapshot
        peak = self.peak
        persistent = min(self._peak_end_live, peak)
        forward_at_peak = snap.phases.get("forward", 0) if snap is not None else 0
        activations = max(0, forward_at_peak - self._peak_end_phases.get("forward", 0))
        temps = [p for p in self.programs.values() if not p.oom]
        held = {p.name: self._live_at_run.get(p.name, peak) for p in temps}  # unknown: at the peak
        biggest = max(temps, key=lambda p: (held[p.name] + p.temp_bytes, p.temp_bytes), default=None)
        temp = biggest.temp_bytes if biggest is not None else 0
        temp_live = held[biggest.name] if biggest is not None else peak
        required = max(peak, temp_live + temp)
        target = self.target
        capacity = self._capacity()
        fits = None if capacity is None else required <= capacity and not self._ooms()
        what, where = self.stopped if self.stopped is not None else (None, None)
        return MemorySummaryEvent(
            self._new_id(), self.clock(), None, threading.get_native_id(), where,
            peak_bytes=peak, peak_step=self.peak_step, end_bytes=self.live, steps=self._finished,
            persistent_bytes=persistent, activation_bytes=activations,
            float32_bytes=snap.float32 if snap is not None else 0,
            temp_bytes=temp, required_bytes=required, dry_run=self.dry_run,
            programs=self.dry_programs, oom_programs=len(self._ooms()),
            temp_program=biggest.name if biggest is not None and temp else None,
            temp_source=biggest.source if biggest is not None and temp else None,
            target=target.name if target is not None else None, capacity_bytes=capacity, fits=fits,
            stopped=what, holders=_top(snap.sites, TOP_HOLDERS, self._peak_end_sites, self.trained)
            if snap is not None else (),
            temp_live_bytes=temp_live if biggest is not None and temp else None, trains=self.trained,
        )

    def _capacity(self) -> int | None:
        if self.target is None:
            return None
        # the compiler's own figure for one device when it gave one (an out-of-memory says it)
        told = [p.available_bytes for p in self.programs.values() if p.oom and p.available_bytes]
        if told:
            return min(told)

        return hbm_capacity(self.target)[0]

    def _ooms(self) -> list[ProgramMemory]:
        return [p for p in self.programs.values() if p.oom]

    def _evidence(self) -> list[MemoryFindingEvent]:
        """With a target: the need against one device with what each remedy would bring it to
        (``"estimate"``, whether it fits or not: the advisor decides), and each program the TPU
        compiler refused for want of HBM (``"program_oom"``)."""
        s = self.summary
        if s is None or s.capacity_bytes is None or self.target is None:
            return []
        holders = s.holders[:FINDING_HOLDERS]
        out = [MemoryFindingEvent(self._new_id(), self.clock(), None, threading.get_native_id(), None,
                                  ESTIMATE, s.target, s.required_bytes, s.capacity_bytes, None, holders,
                                  plan_fixes(s, self.target, float32_as_bf16=self._float32_as_bf16()))]
        for p in self._ooms():
            out.append(MemoryFindingEvent(self._new_id(), self.clock(), None, threading.get_native_id(), None,
                                          PROGRAM_OOM, s.target, p.required_bytes or s.required_bytes,
                                          p.available_bytes or s.capacity_bytes, p.name))
        return out

    def _float32_as_bf16(self) -> int | None:
        """The float32 tensors held at the peak, in bytes as bfloat16 on the target: the bytes the
        TPU compiler gives a bfloat16 array of each shape (its tiles pad some shapes more than
        float32's: a [n, 1] column takes as many bytes in either); None without a target."""
        snap = self._peak_snapshot
        if self.target is None or snap is None or snap.float32_shapes is None:
            return None
        total = 0
        for shape, logical in snap.float32_shapes.items():
            half = logical // 2
            sizes = _padded_size(self.target, shape, "bfloat16")
            total += half if sizes is None or not sizes[1] else half * sizes[0] // sizes[1]
        return total

    # -- helpers -----------------------------------------------------------------------

    def _new_id(self) -> int:
        return self.writer.new_id() if self.writer is not None else 0

    def _put(self, event: Any) -> None:
        if self.writer is not None:
            self.writer.put(event)

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"MemoryTracer.{where}", f"{type(exc).__name__}: {exc}")


_OPTIM_DIR = os.sep + os.path.join("torch", "optim") + os.sep


def _in_optimizer(frame: Any, limit: int = 64) -> bool:
    """Whether ``frame`` runs inside a torch optimizer's code (its step, its state's set-up)."""
    while frame is not None and limit > 0:
        if _OPTIM_DIR in frame.f_code.co_filename:
            return True
        frame = frame.f_back
        limit -= 1
    return False


def current_phase(depth: int = 1) -> str:
    """The pass running now: ``"optimizer"`` (inside a torch optimizer's code, from the frame
    ``depth`` above the caller outwards), ``"backward"`` (autograd is running a node) or
    ``"forward"`` (everything else: the forward, the loss, building the model)."""
    # the optimizer's phase is read from the stack, not from optimizer step hooks: a
    # pre-step hook, even hidden from dynamo, splits a compiled opt.step's graph
    if _in_optimizer(sys._getframe(depth)):
        return "optimizer"
    return "backward" if torch._C._current_autograd_node() is not None else "forward"


def _clock() -> Callable[[], float]:
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def _padded_size(target: Any, shape: tuple[int, ...], dtype: str) -> tuple[int, int] | None:
    """``(padded, logical)`` bytes of one ``dtype[shape]`` array on ``target``, or None."""
    try:
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    except TypeError:
        return None
    logical = math.prod(shape) * itemsize
    padded = padded_bytes(target, shape, dtype) if logical else None
    return None if padded is None else (padded, logical)


def holder_kind(phase: str, kept: bool, trained: bool) -> str:
    """What the tensors a line held at the peak are, from the pass that made them and whether
    they were still held at the end of the step (``kept``): kept from the forward (or from
    before the trace), parameters and inputs; kept from the backward, gradients; kept from the
    optimizer, its state; gone by the step's end, what the forward kept for the backward (in
    a run that trained) or temporaries. A line's tensors are one holder: the kind is that of
    most of its bytes (a backward line making both gradients and larger temporaries is
    temporaries)."""
    if kept:
        return {"backward": "gradient", "optimizer": "optimizer_state"}.get(phase, "parameter")
    return "activation" if phase == "forward" and trained else "temporary"


def _top(sites: list[tuple[_Site, int, int, int]], n: int, end: dict[int, int] | None = None,
         trained: bool = False) -> tuple[MemoryHolder, ...]:
    """The ``n`` largest holders; with ``end`` (each site's bytes when the step ended), their kinds."""
    ranked = sorted(sites, key=lambda s: -s[1])[:n]
    return tuple(
        site.holder(nbytes, tensors, logical,
                    holder_kind(site.phase, 2 * end.get(id(site), 0) >= nbytes, trained) if end is not None else "")
        for site, nbytes, tensors, logical in ranked)


# -- fixes ----------------------------------------------------------------------------------


def plan_fixes(summary: MemorySummaryEvent, target: Any, *,
               float32_as_bf16: int | None = None) -> tuple[MemoryFix, ...]:
    """What would make the run fit one device of ``target``, each with the need estimated after it.

    The estimates move the summary's parts, never measure: float32 tensors in
    bfloat16 take ``float32_as_bf16`` bytes (the float32 tensors at the peak as the
    target pads bfloat16 arrays of their shapes; half their bytes when not given),
    the temporaries shrinking in the same proportion; activation checkpointing drops
    the forward's tensors kept for backward (a lower bound: it keeps each
    checkpointed block's input); a smaller batch scales what is not persistent
    (activations and temporaries); more chips divide the whole (parameters,
    gradients and optimizer state sharded, FSDP-style, the batch split), using the
    generation's slice sizes.
    """
    capacity = summary.capacity_bytes or 0
    peak, temp, required = summary.peak_bytes, summary.temp_bytes, summary.required_bytes
    trains = summary.trains
    fixes = []
    float32 = summary.float32_bytes
    if float32:
        share = float32 / peak if peak else 0.0
        after = float32 / 2 if float32_as_bf16 is None else min(float32, float32_as_bf16)
        ratio = after / float32
        # the temporaries shrink in proportion too, where they add to the need
        est = int(required - (float32 - after) - (temp * share * (1 - ratio) if required > peak else 0))
        fixes.append(MemoryFix("bfloat16", est, round(ratio, 3), est <= capacity, trains=trains))
    if summary.activation_bytes and trains is not False:
        # without a backward pass nothing is kept for it: checkpointing has nothing to drop
        est = required - summary.activation_bytes
        fixes.append(MemoryFix("checkpointing", est, 0.0, est <= capacity, trains=trains))
    persistent = summary.persistent_bytes
    scaled = required - persistent
    if scaled > 0:
        if persistent < capacity:
            factor = min(1.0, (capacity - persistent) / scaled)
            fixes.append(MemoryFix("batch", int(persistent + scaled * factor), round(factor, 3), True, trains=trains))
        else:
            fixes.append(MemoryFix("batch", persistent, 0.0, False, trains=trains))
    if target is not None:
        gen = target.generation
        for count in sorted(gen.slices):  # an accelerator-type suffix counts chips or TensorCores
            n = count // 2 if gen.slice_unit == "cores" else count
            if n > 1 and required / n <= capacity:
                fixes.append(MemoryFix("chips", math.ceil(required / n), float(n), True, f"{gen.name}-{count}",
                                       trains=trains))
                break
    return tuple(sorted(fixes, key=lambda f: (not f.fits, f.estimate_bytes)))


