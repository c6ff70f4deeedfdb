"""PyTorch's memory snapshot for the `tpu` device: the pickle ``torch.cuda.memory._snapshot()`` writes.

PyTorch users look at device memory in PyTorch's own viewer: a snapshot (``segments`` of
``blocks``, and ``device_traces``: the allocations and frees that led there, each with the
Python frames that made it) opened at pytorch.org/memory_viz or rendered by ``python -m
torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``stats``). :class:`MemorySnapshot`
writes that format for a traced run:

- the run's file: the payloads `tpu` tensors hold (``runtime/memory_ledger.py``, as the memory
  tracker charges them: padded to the target's tiles under ``--target``), one segment per
  buffer (the runtime allocates each buffer itself; no caching allocator packs them), each
  block's frames the Python stack that allocated it, innermost first (a compiled graph's
  output: the lines of the graph node that made it, inside the model, then the call);
- one file per compiled program beside it (``<name>.<program>.pickle``): the program's buffer
  assignment as the compiler made it (``core/buffers.py``), one segment per allocation (each
  entry parameter, output and constant, and the heap of the temporaries with every value at
  its offset), the trace following program order (a point of the program is a microsecond of
  ``time_us``), each block's frames the PyTorch line that made the value.

Each snapshot is the state at its peak, as PyTorch's out-of-memory observer would dump it:
its trace runs up to that moment, and its blocks are what is held then, so ``_memory_viz
stats`` reports the peak the report shows (the run's tensor peak; a program's total, with
the heap's fragmentation as free bytes). A block's ``size`` is its bytes in the device's
layout and ``requested_size`` its logical bytes, so the viewer draws a TPU layout's padding
where a CUDA snapshot draws the allocator's rounding.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import re
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tpu_debug.core.buffers import BufferAssignment
from tpu_debug.tracers.location import is_own_file

__all__ = ["MAX_ENTRIES", "MemorySnapshot", "Frame", "frames_here", "node_frames", "program_snapshot"]

#: trace entries a run's snapshot keeps (the most recent before the peak), as
#: ``_record_memory_history(max_entries=...)`` bounds CUDA's
MAX_ENTRIES = 200_000
# a run's buffers get addresses from here, each its own segment
_BASE = 0x7F00_0000_0000
_ALIGN = 512
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')
_STACK_DEPTH = 32

Frame = dict[str, Any]  # {"filename": ..., "line": ..., "name": ...}


def frames_here(depth: int = 2, limit: int = _STACK_DEPTH) -> list[Frame]:
    """The Python frames above the caller's ``depth``-th frame, innermost first, leaving out
    tpu_debug's own (the frames a snapshot shows for an allocation)."""
    out: list[Frame] = []
    frame = sys._getframe(depth)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not is_own_file(code.co_filename):
            out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out


def node_frames(stack_trace: str | None) -> list[Frame]:
    """The frames of an FX node's stack trace (dynamo's record of the code that made it),
    innermost first."""
    if not stack_trace:
        return []
    return [{"filename": f, "line": int(n), "name": fn.strip()} for f, n, fn in reversed(_FRAME.findall(stack_trace))]


@dataclasses.dataclass(slots=True)
class _Block:
    addr: int
    size: int
    logical: int
    frames: list[Frame]


class MemorySnapshot:
    """The run's snapshot, fed by the memory tracker, and each compiled program's.

    Args:
        path: the run's file; a program's goes beside it (``<stem>.<program>.pickle``).
        clock: seconds since the run started (``time_us`` of the trace).
        max_entries: trace entries kept before the peak (the oldest go first).
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] | None = None,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.path = Path(path)
        self._clock = clock or (lambda: 0.0)
        self._lock = threading.Lock()
        self._trace: collections.deque[dict] = collections.deque(maxlen=max(2, max_entries))
        self._appended = 0
        self._live: dict[int, _Block] = {}  # storage serial id -> its block
        self._next = _BASE
        self.live_bytes = 0
        self.peak_bytes = 0
        self._rising = False
        self._peak_blocks: list[_Block] = []
        self._peak_appended = 0
        self._programs: list[tuple[str, dict]] = []

    # -- the run's tensors (the memory tracker calls these with the bytes it charges) ---------

    def alloc(self, storage: int, nbytes: int, logical: int, frames: list[Frame]) -> None:
        """Storage ``storage`` was charged ``nbytes`` more (``logical`` of them its elements'): a
        buffer of its new size replaces the one it had."""
        with self._lock:
            old = self._live.pop(storage, None)
            if old is not None:
                self._free(old)
                frames = old.frames
            size = (old.size if old is not None else 0) + nbytes
            block = _Block(self._next, size, (old.logical if old is not None else 0) + logical, frames)
            self._next += -(-max(size, 1) // _ALIGN) * _ALIGN
            self._live[storage] = block
            self._append("segment_alloc", block)
            self._append("alloc", block)
            self.live_bytes += size
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
                self._rising = True

    def free(self, storage: int, nbytes: int, logical: int) -> None:
        """Storage ``storage`` gave back ``nbytes`` (all it had, or part of them)."""
        with self._lock:
            if self._rising:
                self._keep_peak()
            block = self._live.pop(storage, None)
            if block is None:
                return
            self._free(block)
            left = block.size - nbytes
            if left > 0:
                kept = _Block(self._next, left, max(block.logical - logical, 0), block.frames)
                self._next += -(-left // _ALIGN) * _ALIGN
                self._live[storage] = kept
                self._append("segment_alloc", kept)
                self._append("alloc", kept)
                self.live_bytes += left

    def _free(self, block: _Block) -> None:
        self._append("free_requested", block)
        self._append("free_completed", block)
        self._append("segment_free", block)
        self.live_bytes -= block.size

    def _append(self, action: str, block: _Block) -> None:
        self._trace.append({"action": action, "addr": block.addr, "size": block.size, "stream": 0,
                            "time_us": int(self._clock() * 1e6), "frames": block.frames})
        self._appended += 1

    def _keep_peak(self) -> None:
        """The state now is the highest yet: keep its blocks and where the trace stands."""
        self._rising = False
        self._peak_blocks = list(self._live.values())
        self._peak_appended = self._appended

    # -- programs -------------------------------------------------------------------------

    def add_program(self, name: str, snapshot: dict) -> None:
        """A compiled program's snapshot (:func:`program_snapshot`), written beside the run's."""
        with self._lock:
            self._programs.append((name, snapshot))

    # -- the files --------------------------------------------------------------------------

    def run_snapshot(self) -> dict:
        """The run's snapshot at its peak (the format of ``torch.cuda.memory._snapshot()``)."""
        with self._lock:
            if self._rising:
                self._keep_peak()
            dropped = self._appended - len(self._trace)
            trace = list(self._trace)[: max(0, self._peak_appended - dropped)]
            blocks = sorted(self._peak_blocks, key=lambda b: b.addr)
        segments = [_segment(b.addr, b.size, [_active(b.size, b.logical, b.frames)], b.frames) for b in blocks]
        return _snapshot(segments, trace)

    def program_paths(self) -> list[tuple[str, Path]]:
        """Each program's name and the file its snapshot goes to."""
        with self._lock:
            names = [name for name, _ in self._programs]
        return [(name, self.path.with_name(f"{self.path.stem}.{_safe(name)}.pickle")) for name in names]

    def write(self) -> list[Path]:
        """Write the run's snapshot and each program's; the files written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        written = [self.path]
        self.path.write_bytes(pickle.dumps(self.run_snapshot()))
        with self._lock:
            programs = list(self._programs)
        for (name, snapshot), (_, path) in zip(programs, self.program_paths()):
            path.write_bytes(pickle.dumps(snapshot))
            written.append(path)
        return written


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "." for c in name)


def _active(size: int, logical: int, frames: list[Frame]) -> dict:
    return {"size": size, "requested_size": min(logical or size, size), "state": "active_allocated",
            "frames": frames}


def _segment(address: int, size: int, blocks: list[dict], frames: list[Frame]) -> dict:
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": address, "total_size": size, "allocated_size": allocated,
            "active_size": allocated, "requested_size": sum(b.get("requested_size", 0) for b in blocks
                                                           if b["state"] == "active_allocated"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": frames, "blocks": blocks}


def _snapshot(segments: list[dict], trace: list[dict]) -> dict:
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "device": "tpu"}}


# -- a compiled program's snapshot, from its buffer assignment ----------------------------------

#: (frames, logical bytes) of a value, by value id: what made it (program_buffers describes it)
ValueFrames = Callable[[int], tuple[list[Frame], int]]


def program_snapshot(assignment: BufferAssignment, describe: ValueFrames, color: int = 0) -> dict:
    """A compiled program's snapshot at its peak: one segment per allocation of ``color``, laid
    end to end, each holding its values at their offsets; the trace follows program order up to
    the peak (a value allocated at its first point, freed after its last; where a value takes
    the bytes of one still live, an in-place update, that one is freed first); the blocks are
    what the compiler's assignment holds at the peak (:meth:`BufferAssignment.peak`), so their
    bytes and the free bytes add up to the assignment's total."""
    peak = assignment.peak(color)
    allocations = [a for a in assignment.allocations if a.color == color]
    base, addresses = _BASE, {}
    for a in allocations:
        addresses[a.index] = base
        base += -(-max(a.size, 1) // _ALIGN) * _ALIGN
    segments = []
    held: dict[int, list] = {}
    for b in peak.buffers:
        held.setdefault(b.allocation.index, []).append(b)
    for a in allocations:
        blocks, at = [], 0
        for b in sorted(held.get(a.index, []), key=lambda b: b.offset):
            if b.offset > at:
                blocks.append({"size": b.offset - at, "state": "inactive"})
            frames, logical = describe(b.value.id)
            # a reserved row's bytes are held for its value, not yet (or no longer) written
            blocks.append(_active(b.nbytes, b.nbytes if b.reserved else min(logical, b.nbytes), frames))
            at = b.offset + b.nbytes
        if at < a.size:
            blocks.append({"size": a.size - at, "state": "inactive"})
        segments.append(_segment(addresses[a.index], a.size, blocks, []))
    return _snapshot(segments, _program_trace(assignment, allocations, addresses, peak.position, describe))


def _program_trace(assignment: BufferAssignment, allocations: Iterable, addresses: dict[int, int], peak: int,
                   describe: ValueFrames) -> list[dict]:
    by_index = {a.index: a for a in allocations}
    trace = [{"action": "segment_alloc", "addr": addresses[a.index], "size": a.size, "stream": 0, "time_us": 0,
              "frames": []} for a in by_index.values()]
    values = [v for v in assignment.values if v.allocation in by_index]
    events: list[tuple[int, int, Any]] = []  # (point, 0 free / 1 alloc, value)
    for v in values:
        # a parameter, a constant or a scalar of XLA's is there for the whole program
        whole = v.start < 0 or by_index[v.allocation].kind in ("parameter", "constant", "thread_local")
        start = 0 if whole else v.start
        if start > peak:
            continue
        events.append((start, 1, v))
        end = 1 << 62 if whole else v.end
        if end < peak:
            events.append((end + 1, 0, v))
    live: dict[int, tuple[int, int, Any]] = {}  # value id -> (address, size, value)
    for point, kind, v in sorted(events, key=lambda e: (e[0], e[1], e[2].id)):
        addr = addresses[v.allocation] + v.offset
        if kind == 0:
            if live.pop(v.id, None) is not None:
                trace += _free_entries(addr, v.size, point, describe(v.id)[0])
            continue
        # an in-place result takes its operand's bytes: the operand leaves first
        for other_id, (o_addr, o_size, other) in list(live.items()):
            if o_addr < addr + v.size and addr < o_addr + o_size:
                del live[other_id]
                trace += _free_entries(o_addr, o_size, point, describe(other.id)[0])
        live[v.id] = (addr, v.size, v)
        trace.append({"action": "alloc", "addr": addr, "size": v.size, "stream": 0, "time_us": point,
                      "frames": describe(v.id)[0]})
    return trace


def _free_entries(addr: int, size: int, point: int, frames: list[Frame]) -> list[dict]:
    return [{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": point, "frames": frames}
            for action in ("free_requested", "free_completed")]
