"""Multi-device programs read back: their collectives, per-device memory, and where ranks part.

The collectives tracer (``tracers/recording/collectives_tracer.py``) records one
:class:`~tpu_debug.tracers.events.CollectivesEvent` per program spread over several
devices. :func:`program_collectives` gives each program's latest record,
:func:`collective_totals` sums them, and :func:`compare_ranks` finds the first place
where the ranks of a multi-process run compiled different programs or collective
sequences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tpu_debug.tracers.events import CollectivesEvent
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "CollectiveTotals",
    "RankDifference",
    "collective_totals",
    "compare_ranks",
    "program_calls",
    "program_collectives",
]


def program_collectives(run: RunView, *, target: str | None = "") -> list[CollectivesEvent]:
    """The latest collectives record of each program (``target``: ``""`` for the run's own
    devices, a target name, or None for all), most bytes sent first."""
    latest: dict[tuple[str, str, str | None], CollectivesEvent] = {}
    for e in run.events("collectives"):
        if target is None or e.target == target:
            latest[(e.name, e.target, e.program)] = e
    return sorted(latest.values(), key=lambda e: (-e.collective_bytes, e.name))


def program_calls(run: RunView, events: Sequence[CollectivesEvent]) -> dict[int, int]:
    """How many times each program of ``events`` ran (by event id): from its program's
    execution count, or its op or graph's when HLO was not recorded."""
    by_hash = {p.hash: p.count for p in run.programs()} if any(e.program for e in events) else {}
    by_name: dict[str, int] = {}
    if any(not e.program for e in events):
        for o in run.ops():
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
