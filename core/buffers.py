"""XLA's buffer assignment of one compiled program, read from the compiler's own reports.

A compile asked to dump (``xla_dump_to``) writes, beside the optimized module, two reports
of how it placed the program's values in memory:

- ``*after_optimizations-buffer-assignment.txt``: every allocation (its index, size,
  memory color, and what it is: an entry parameter, the output, a constant, a thread-local
  scalar, or the ``preallocated-temp`` heap of the temporaries) and every value in it
  (``value: <25 fusion.1 @0> (size=262144,offset=0): f32[128,512]{1,0}``: its id, the
  instruction and shape index that define it, its offset and size in the allocation, its
  shape with its layout);
- ``*after_optimizations-live-range.txt``: the program order (``InstructionSequence``, every
  computation's instructions flattened in the order the schedule runs them) and each
  value's live range in it (``fusion.1{}:3-5``: defined at 3, last used at 5).

The temporaries' heap is sized by XLA's heap simulator: the values take offsets in it, and
its size is the highest offset + size any value reaches. At any program point the bytes in
use are the union of the live values' byte ranges (two values may share a range: an
in-place update writes its result where its operand was), so :meth:`BufferAssignment.peak`
finds the point where that union is largest and lists the values holding it; what no live
value occupies there is the heap's fragmentation. The static allocations (parameters,
outputs, constants) are reserved for the whole program. So the buffers at the peak plus
the heap's unused bytes add up, to the byte, to the buffer assignment's total
(:meth:`BufferAssignment.total`): the figure XLA's TPU compiler compares with a device's HBM
("the total memory required for HLO temporaries (22.50G) exceeds available HBM"; its
memory usage report's "Total bytes").

Color 0 is the device's main memory (HBM on a TPU, RAM on the CPU); a TPU's other colors
are its on-chip memories (1: VMEM, 2: SMEM) and, for what a checkpoint policy offloads, the
host (5, memory space ``S(5)``). Shapes are read by :mod:`tpu_debug.core.hlo_text`.

Standard library only: the run store, the report and the TUI read its records.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tpu_debug.core.hlo_text import Shape, parse_shape

__all__ = [
    "HOST_COLOR",
    "Allocation",
    "BufferAssignment",
    "HeapPeak",
    "PeakBuffer",
    "Value",
    "parse_buffer_assignment",
    "read_dump",
]

#: the memory color of XLA's pinned host memory space (``S(5)``): what a policy offloads
HOST_COLOR = 5

_ASSIGNMENT = "after_optimizations-buffer-assignment.txt"
_LIVE_RANGE = "after_optimizations-live-range.txt"


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation of the buffer assignment.

    Attributes:
        index: its number in the assignment.
        size: its bytes.
        color: its memory (0 the device's main memory; see the module docstring).
        kind: ``"parameter"`` (an entry parameter), ``"output"`` (holds a value the program
            returns), ``"constant"``, ``"thread_local"``, or ``"temp"`` (values that live
            part of the program: the heap of temporaries).
        parameter: the entry parameter's number, for ``"parameter"``.
        parameter_index: the shape index inside that parameter (a tuple parameter's element).
        live_out: it holds a value the program returns (a donated parameter's too).
    """

    index: int
    size: int
    color: int
    kind: str
    parameter: int | None = None
    parameter_index: tuple[int, ...] = ()
    live_out: bool = False

    @property
    def static(self) -> bool:
        """Reserved for the whole program (every kind but the temporaries' heap)."""
        return self.kind != "temp"


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
    """One value placed in an allocation.

    Attributes:
        id: XLA's value id.
        instruction: the instruction that defines it.
        index: its shape index in that instruction's result (``()`` for the whole result).
        allocation: the allocation holding it.
        offset: its first byte in the allocation.
        size: its bytes there (with the layout's padding).
        shape: its shape as XLA printed it, with its layout.
        start, end: its live range in program order (positions in
            :attr:`BufferAssignment.sequence`, both included); -1 when the report gave none.
    """

    id: int
    instruction: str
    index: tuple[int, ...]
    allocation: int
    offset: int
    size: int
    shape: str
    start: int = -1
    end: int = -1

    @property
    def key(self) -> str:
        """``name{0,1}``: how the live-range report names it."""
        return f"{self.instruction}{{{','.join(map(str, self.index))}}}"

    @property
    def parsed_shape(self) -> Shape:
        return parse_shape(self.shape)

    def live_at(self, position: int) -> bool:
        return self.start < 0 or self.start <= position <= self.end


@dataclasses.dataclass(frozen=True, slots=True)
class PeakBuffer:
    """A value holding memory at the peak, and the bytes it is counted for there: its size, less
    what it shares with a buffer already counted (an in-place result over its operand).

    ``reserved``: the bytes are not ``value``'s at the peak but held for it: an output's
    allocation is reserved for the whole program, so where ``value`` is written before or after
    the peak (or is larger than the value the allocation holds there), its bytes are counted
    as this reserved row."""

    value: Value
    allocation: Allocation
    nbytes: int
    reserved: bool = False
    offset: int = 0  # the first of its counted bytes in the allocation


@dataclasses.dataclass(frozen=True, slots=True)
class HeapPeak:
    """The program's memory of one color at its peak.

    Attributes:
        position: the program point where the temporaries occupy the most (-1: no temporaries).
        instruction: the instruction running there ("" when none).
        total: the buffer assignment's total for the color (static allocations + heaps).
        heap: the temporaries' heaps' sizes.
        buffers: what holds memory there, largest first: every static allocation (its value
            live there, or the last it holds) and every live temporary.
        unused: heap bytes no live value occupies there (fragmentation).
    """

    position: int
    instruction: str
    total: int
    heap: int
    buffers: tuple[PeakBuffer, ...]
    unused: int

    @property
    def counted(self) -> int:
        """The buffers' bytes plus the unused heap: equal to :attr:`total`."""
        return sum(b.nbytes for b in self.buffers) + self.unused


@dataclasses.dataclass(frozen=True, slots=True)
class BufferAssignment:
    """A program's buffer assignment: allocations, values, and the program order.

    Example:
        >>> text = ("allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\\n"
        ...         " value: <1 p @0> (size=64,offset=0): f32[16]{0}\\n"
        ...         "allocation 1: size 128, preallocated-temp:\\n"
        ...         " value: <2 a @0> (size=64,offset=0): f32[16]{0}\\n"
        ...         " value: <3 b @0> (size=64,offset=64): f32[16]{0}\\n")
        >>> ranges = "  InstructionSequence:\\n    0:p\\n    1:a\\n    2:b\\n  BufferLiveRange:\\n" \\
        ...          "    p{}:0-2\\n    a{}:1-2\\n    b{}:2-2\\n"
        >>> peak = parse_buffer_assignment(text, ranges).peak()
        >>> peak.total, peak.position, [(b.value.instruction, b.nbytes) for b in peak.buffers]
        (192, 2, [('p', 64), ('a', 64), ('b', 64)])
    """

    allocations: tuple[Allocation, ...]
    values: tuple[Value, ...]
    sequence: tuple[str, ...] = ()

    def allocation(self, index: int) -> Allocation:
        return self.allocations[self._index()[index]]

    def _index(self) -> dict[int, int]:
        return {a.index: i for i, a in enumerate(self.allocations)}

    def total(self, color: int = 0) -> int:
        """Bytes of every allocation of ``color``: what the program needs of that memory."""
        return sum(a.size for a in self.allocations if a.color == color)

    def colors(self) -> tuple[int, ...]:
        return tuple(sorted({a.color for a in self.allocations}))

    def values_of(self, color: int = 0) -> Iterator[tuple[Value, Allocation]]:
        allocations = {a.index: a for a in self.allocations}
        for v in self.values:
            a = allocations.get(v.allocation)
            if a is not None and a.color == color:
                yield v, a

    def peak(self, color: int = 0) -> HeapPeak:
        """The program point where the temporaries of ``color`` occupy the most, and what holds
        memory there (see the module docstring); the buffers' bytes and the unused heap add up
        to :meth:`total`."""
        static: dict[int, list[Value]] = {}
        temps: list[tuple[Value, Allocation]] = []
        allocations = [a for a in self.allocations if a.color == color]
        for v, a in self.values_of(color):
            if a.static:
                static.setdefault(a.index, []).append(v)
            else:
                temps.append((v, a))
        heap = sum(a.size for a in allocations if not a.static)
        position, counted = _busiest(temps, len(self.sequence))
        buffers = [b for a in allocations if a.static and static.get(a.index)
                   for b in _static_buffers(a, static[a.index], position)]
        # a static allocation no value names (an emptied output table): its bytes, unnamed
        orphans = [a for a in allocations if a.static and not static.get(a.index)]
        buffers += [PeakBuffer(Value(-1, "", (), a.index, 0, a.size, ""), a, a.size) for a in orphans]
        buffers += counted
        buffers.sort(key=lambda b: (-b.nbytes, b.allocation.index, b.value.offset))
        used = sum(b.nbytes for b in counted)
        instruction = self.sequence[position] if 0 <= position < len(self.sequence) else ""
        return HeapPeak(position, instruction, self.total(color), heap, tuple(buffers), heap - used)

    def timeline(self, color: int = 0, points: int = 400) -> tuple[tuple[int, int], ...]:
        """(program point, bytes of ``color`` in use) over the program: the static allocations
        plus the temporaries live there, at most ``points`` points (each the busiest point of
        its stretch of the program, so the peak is among them)."""
        static = sum(a.size for a in self.allocations if a.color == color and a.static)
        temps = [(v, a) for v, a in self.values_of(color) if not a.static]
        length = max(len(self.sequence), 1)
        live = _live_sums(temps, length)
        peak, _ = _busiest(temps, length)
        width = max(1, -(-length // max(points, 1)))
        chosen = []
        for s in range(0, length, width):
            stretch = range(s, min(s + width, length))
            chosen.append(peak if peak in stretch else max(stretch, key=lambda p: live[p]))
        used = _union_at(temps, chosen)
        return tuple((p, static + used[p]) for p in chosen)

    # -- the record a cache or a run store keeps ------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The assignment as JSON data (lists of numbers and strings)."""
        return {
            "allocations": [[a.index, a.size, a.color, a.kind, a.parameter, list(a.parameter_index), a.live_out]
                            for a in self.allocations],
            "values": [[v.id, v.instruction, list(v.index), v.allocation, v.offset, v.size, v.shape, v.start, v.end]
                       for v in self.values],
            "sequence": list(self.sequence),
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> BufferAssignment:
        """The assignment :meth:`to_record` wrote (KeyError, TypeError or ValueError for other data)."""
        allocations = tuple(Allocation(int(i), int(s), int(c), str(k), None if p is None else int(p),
                                       tuple(int(x) for x in pi), bool(lo))
                            for i, s, c, k, p, pi, lo in data["allocations"])
        values = tuple(Value(int(i), str(n), tuple(int(x) for x in ix), int(a), int(o), int(s), str(sh), int(b), int(e))
                       for i, n, ix, a, o, s, sh, b, e in data["values"])
        return cls(allocations, values, tuple(str(s) for s in data["sequence"]))


def _holder(values: Iterable[Value], position: int) -> Value:
    """The value a static allocation holds at ``position``: the largest live there, else the
    largest it holds (an output's result, reserved before it is written)."""
    values = list(values)
    pool = [v for v in values if v.live_at(position)] or values
    return max(pool, key=lambda v: (v.size, v.start))


def _static_buffers(a: Allocation, values: list[Value], position: int) -> list[PeakBuffer]:
    """What a static allocation holds at ``position``, adding up to its size.

    A parameter, a constant or a thread-local scalar is its value for the whole program. An
    output's allocation is shared over time: XLA places in it values whose live ranges do not
    meet (a temporary early on, the output later), so at the peak it holds the value live there,
    and the rest of it (all of it, when no value is live there) is reserved for the largest
    value that takes it at another point."""
    if a.kind != "output":
        return [PeakBuffer(_holder(values, position), a, a.size)]
    live = [v for v in values if v.live_at(position)]
    out = []
    if live:
        held = max(live, key=lambda v: (v.size, v.start))
        out.append(PeakBuffer(held, a, min(held.size, a.size)))
    rest = a.size - sum(b.nbytes for b in out)
    if rest > 0:
        others = [v for v in values if not v.live_at(position)] or values
        out.append(PeakBuffer(max(others, key=lambda v: (v.size, v.start)), a, rest, reserved=True,
                              offset=a.size - rest))
    return out


def _live_sums(temps: list[tuple[Value, Allocation]], length: int) -> list[int]:
    """Sum of the live temporaries' sizes at each program point (an upper bound of the bytes in
    use: values sharing bytes are counted twice where their ranges meet)."""
    delta = [0] * (length + 1)
    for v, _ in temps:
        start = 0 if v.start < 0 else min(v.start, length - 1)
        end = length - 1 if v.start < 0 else min(max(v.end, start), length - 1)
        delta[start] += v.size
        delta[end + 1] -= v.size
    out, running = [], 0
    for d in delta[:length]:
        running += d
        out.append(running)
    return out


def _counted(live: list[tuple[Value, Allocation]]) -> list[PeakBuffer]:
    """The live values with the bytes each adds to the union of their ranges: a value inside one
    counted before (a result sharing its operand's bytes) adds only what lies outside it."""
    out = []
    by_allocation: dict[int, list[tuple[Value, Allocation]]] = {}
    for v, a in live:
        by_allocation.setdefault(a.index, []).append((v, a))
    for group in by_allocation.values():
        # by offset, and at one offset the value defined last first: it is what the shared
        # bytes hold now. Every range counted before starts at or below this one, so what
        # they cover of it is [offset, reach)
        group.sort(key=lambda p: (p[0].offset, -p[0].start, -p[0].size))
        reach = 0
        for v, a in group:
            lo, hi = v.offset, v.offset + v.size
            new = hi - lo - max(0, min(hi, reach) - lo)
            first = max(lo, reach)
            reach = max(reach, hi)
            if new > 0:
                out.append(PeakBuffer(v, a, new, offset=first))
    return out


def _union_at(temps: list[tuple[Value, Allocation]], positions: list[int]) -> dict[int, int]:
    """Bytes the live temporaries occupy (their ranges' union) at each of ``positions``."""
    order = sorted(set(positions))
    by_start = sorted(temps, key=lambda p: (p[0].start, p[0].id))
    active: list[tuple[int, int, tuple[Value, Allocation]]] = []  # heap of (end, id, value)
    out: dict[int, int] = {}
    i = 0
    for p in order:
        while i < len(by_start) and by_start[i][0].start <= p:
            v = by_start[i][0]
            heapq.heappush(active, (v.end if v.start >= 0 else 1 << 62, v.id, by_start[i]))
            i += 1
        while active and active[0][0] < p:
            heapq.heappop(active)
        out[p] = sum(b.nbytes for b in _counted([entry[2] for entry in active]))
    return out


def _busiest(temps: list[tuple[Value, Allocation]], length: int) -> tuple[int, list[PeakBuffer]]:
    """The program point where the temporaries' union is largest, and its buffers.

    The union is computed where the sum of live sizes is highest first, going down until that
    sum is below the best union found: the union is never above the sum, so no other point
    can beat it."""
    if not temps:
        return -1, []
    length = max(length, 1 + max(max(v.start, v.end) for v, _ in temps))
    sums = _live_sums(temps, length)
    ranked = sorted(range(length), key=lambda p: (-sums[p], p))
    best, best_position = -1, ranked[0]
    for start in range(0, len(ranked), 64):
        batch = ranked[start:start + 64]
        if sums[batch[0]] <= best:
            break
        unions = _union_at(temps, batch)
        for p in batch:
            if unions[p] > best or (unions[p] == best and p < best_position):
                best, best_position = unions[p], p
    live = [(v, a) for v, a in temps if v.live_at(best_position)]
    return best_position, _counted(live)


# -- reading the reports -----------------------------------------------------------------------


def _shape_index(text: str) -> tuple[int, ...]:
    """``{0,1}`` or ``{}`` -> (0, 1) / ()."""
    inner = text.strip().strip("{}")
    return tuple(int(x) for x in inner.split(",") if x.strip().lstrip("-").isdigit())


def _allocation(line: str) -> Allocation | None:
    """``allocation 3: size 4, parameter 1, shape |f32[4]| at ShapeIndex {}, maybe-live-out:``."""
    head, colon, rest = line.partition(":")
    number = head.split()[-1] if head.split() else ""
    if not colon or not number.isdigit():
        return None
    # the shape between bars may hold commas: read the words around it
    before, bar, after = rest.partition("|")
    if bar:
        _, _, after = after.partition("|")
    words = [w.strip() for w in (before + after).replace(":", " ").split(",")]
    size, color, parameter, index = 0, 0, None, ()
    flags = set()
    for word in words:
        parts = word.split()
        if len(parts) >= 2 and parts[0] == "size" and parts[1].isdigit():
            size = int(parts[1])
        elif len(parts) >= 2 and parts[0] == "color" and parts[1].isdigit():
            color = int(parts[1])
        elif len(parts) >= 2 and parts[0] == "parameter" and parts[1].isdigit():
            parameter = int(parts[1])
            if "ShapeIndex" in word:
                index = _shape_index(word.partition("ShapeIndex")[2])
        elif "ShapeIndex" in word:
            index = _shape_index(word.partition("ShapeIndex")[2])
        elif parts:
            flags.add(" ".join(parts))
    live_out = "maybe-live-out" in flags
    if parameter is not None:
        kind = "parameter"
    elif "constant" in flags:
        kind = "constant"
    elif "thread-local" in flags:
        kind = "thread_local"
    elif live_out or any(f.startswith("output shape") for f in flags):
        kind = "output"
    else:
        kind = "temp"
    return Allocation(int(number), size, color, kind, parameter, index, live_out)


def _value(line: str, allocation: int) -> Value | None:
    """`` value: <25 fusion.1{0} @0> (size=262144,offset=0): f32[128,512]{1,0}``."""
    start, end = line.find("<"), line.find(">")
    if start < 0 or end < start:
        return None
    words = line[start + 1:end].split()
    if len(words) < 2 or not words[0].isdigit():
        return None
    name, brace, index = words[1].partition("{")
    numbers = line[end + 1:].partition(")")[0]
    fields = dict(part.split("=", 1) for part in numbers.strip(" (").split(",") if "=" in part)
    shape = line[end + 1:].partition("):")[2].strip()
    return Value(int(words[0]), name, _shape_index(brace + index) if brace else (), allocation,
                 int(fields.get("offset", 0)), int(fields.get("size", 0)), shape)


def _live_ranges(text: str) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """(program order, value name -> (start, end)) of a live-range report."""
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and not stripped[:1].isdigit():
            section = stripped
            continue
        if section == "InstructionSequence:":
            number, _, name = stripped.partition(":")
            if number.isdigit():
                sequence.append(name.strip())
        elif section == "BufferLiveRange:":
            name, _, span = stripped.rpartition(":")
            first, dash, last = span.partition("-")
            if name and dash and first.isdigit() and last.isdigit():
                ranges[name] = (int(first), int(last))
    return tuple(sequence), ranges


def parse_buffer_assignment(assignment: str, live_range: str = "") -> BufferAssignment:
    """Read XLA's buffer-assignment report, with the live ranges of its live-range report.

    Args:
        assignment: the text of ``*after_optimizations-buffer-assignment.txt``.
        live_range: the text of ``*after_optimizations-live-range.txt`` ("" when not kept:
            every value is then taken as live for the whole program).

    Returns:
        The :class:`BufferAssignment`.
    """
    sequence, ranges = _live_ranges(live_range) if live_range else ((), {})
    allocations: list[Allocation] = []
    values: list[Value] = []
    for line in assignment.splitlines():
        if line.startswith("allocation "):
            found = _allocation(line)
            if found is not None:
                allocations.append(found)
        elif line.startswith(" value:") and allocations:
            value = _value(line, allocations[-1].index)
            if value is not None:
                start, end = ranges.get(value.key, (-1, -1))
                values.append(dataclasses.replace(value, start=start, end=end))
        elif line.strip().startswith("Total bytes used"):
            break
    return BufferAssignment(tuple(allocations), tuple(values), sequence)


def read_dump(directory: str | Path) -> BufferAssignment | None:
    """The buffer assignment of the module a compile dumped into ``directory`` (the last one
    when several were), or None when it holds no buffer-assignment report."""
    reports = sorted(Path(directory).glob("*" + _ASSIGNMENT))
    if not reports:
        return None
    report = reports[-1]
    live = report.with_name(report.name[: -len(_ASSIGNMENT)] + _LIVE_RANGE)
    return parse_buffer_assignment(report.read_text(), live.read_text() if live.exists() else "")
