"""Where ranks stopped calling the same collectives: a reader of ``collective_call`` events.

c10d pairs the ranks' collectives of a group by their order: the n-th collective of
one rank runs with the n-th of every other. When one rank calls another collective,
with other sizes or another dtype, or stops calling (a collective under
``if rank == 0``, an uneven last batch, a rank that died), the group hangs or mixes
data. Each rank's run records the collectives it entered, in order, at the user's
line (``CollectiveCallEvent``); comparing the ranks' sequences, group by group, names
the first sequence number where they differ and what each rank did there.

The cause and the fix come from :mod:`tpu_debug.core.desync`, the same words the live
check of the `tpu` process group raises and records (``CollectiveDesyncEvent``): a run
killed while it hung reads here as a run whose check fired reads in its finding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tpu_debug.core import desync as _desync
from tpu_debug.core.collective_kinds import P2P_OPS
from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDesyncEvent

__all__ = ["Desync", "desync_text", "event_calls", "first_desyncs", "rank_call"]

@dataclasses.dataclass(frozen=True, slots=True)
class Desync:
    """The first collective of ``group`` at which its ranks differ.

    ``seq`` is that collective's sequence number in the group (from 1); ``calls`` holds,
    per global rank, what the rank called there (None: it called no collective of the
    group there, so it stopped, ended or hung before); ``reason`` is ``"missing"``,
    ``"op"``, ``"shapes"``, ``"dtype"``, ``"reduce_op"`` or ``"root"``. ``cause`` is the
    likeliest cause (a key of :data:`tpu_debug.core.desync.CAUSES`: ``"rank_zero"``,
    ``"branch"``, ``"uneven_batch"``, ``"sizes"``, ``"dtype"``, ``"died"``, ``"late"``),
    ``last`` the last collective of the group of each rank that did not call this one,
    ``states`` how such a rank stopped (``"missing"``, ``"ended"``, ``"died"``).
    """

    group: str
    seq: int
    reason: str
    calls: tuple[tuple[int, CollectiveCallEvent | None], ...]
    cause: str = ""
    last: tuple[tuple[int, CollectiveCallEvent | None], ...] = ()
    states: tuple[tuple[int, str], ...] = ()

    def rank_calls(self) -> list[_desync.RankCall]:
        """Each rank's part as :class:`tpu_debug.core.desync.RankCall`."""
        last, states = dict(self.last), dict(self.states)
        return [
            rank_call(rank, call) if call is not None else rank_call(rank, last.get(rank), states.get(rank, "missing"))
            for rank, call in self.calls
        ]

    @property
    def fix(self) -> str:
        """What to do, for this cause, naming the ranks and lines."""
        return _desync.fix_for(self.cause, self.rank_calls(), self.seq)

    def describe(self) -> str:
        """The whole text: the collective, each rank's call and line, the cause and the fix
        (the words of the live check's error and finding)."""
        return _desync.describe(self.group, self.seq, self.reason, self.cause, self.rank_calls())

    def render(self) -> str:
        """Text: the collective and, per rank, what it called there and where."""
        lines = [f"group {self.group}, collective #{self.seq}: the ranks differ ({self.reason})"]
        for rank, call in self.calls:
            if call is None:
                lines.append(f"  rank {rank}: no collective #{self.seq} (its calls in this group ended before)")
                continue
            where = f" at {call.location}" if call.location is not None else ""
            shapes = ", ".join(call.shapes) or "no tensors"
            lines.append(f"  rank {rank}: {call.op}({shapes}; {call.dtype or '-'}){where}")
        return "\n".join(lines)


def _global_rank(call: CollectiveCallEvent) -> int:
    return call.group_ranks[call.rank] if 0 <= call.rank < len(call.group_ranks) else call.rank


def rank_call(rank: int, call: CollectiveCallEvent | None, state: str = "called") -> _desync.RankCall:
    """A rank's call (or, with another ``state``, its last call) as :class:`~tpu_debug.core.desync.RankCall`."""
    if call is None:
        return _desync.RankCall(rank, state)
    loc = call.location
    return _desync.RankCall(
        rank, state, call.op, call.seq, tuple(call.shapes), call.dtype, call.reduce_op, call.peer,
        loc.file if loc is not None else None, loc.line if loc is not None else None,
        loc.function if loc is not None else None,
    )


def event_calls(event: CollectiveDesyncEvent) -> list[_desync.RankCall]:
    """Each rank's part of a desync the live check recorded."""
    return [
        _desync.RankCall(c.rank, c.state, c.op, c.seq, tuple(c.shapes.split("; ")) if c.shapes else (), c.dtype,
                         c.reduce_op, c.peer, c.file, c.line, c.function, c.device, c.error, tuple(c.stack),
                         c.exit_status)
        for c in event.calls
    ]


def desync_text(event: CollectiveDesyncEvent) -> str:
    """The text of a desync the live check recorded (what the rank raised)."""
    return _desync.describe(event.group, event.seq, event.reason, event.cause, event_calls(event),
                            timeout=event.timeout)


def first_desyncs(calls_by_rank: Mapping[int, Sequence[CollectiveCallEvent]],
                  states: Mapping[int, str] | None = None) -> list[Desync]:
    """The first differing collective of each group the ranks share, in group order.

    Args:
        calls_by_rank: each rank's ``collective_call`` events (any order), keyed by global rank.
        states: how ranks whose calls stop early stopped, when the caller knows (``"ended"``:
            the process exited; ``"died"``: killed); others are ``"missing"``.

    Returns:
        One :class:`Desync` per group whose ranks differ; empty when every group's ranks
        called the same collectives, with the same sizes, the same number of times.

    Example::

        first_desyncs({0: rank0_calls, 1: rank1_calls})[0].render()
        # 'group 0, collective #3: the ranks differ (missing)\\n  rank 0: allreduce([4]; float32) at ...'
    """
    groups: dict[str, dict[int, dict[int, CollectiveCallEvent]]] = {}
    members: dict[str, tuple[int, ...]] = {}
    for calls in calls_by_rank.values():
        for call in calls:
            if call.op in P2P_OPS:
                continue
            members.setdefault(call.group, call.group_ranks)
            groups.setdefault(call.group, {}).setdefault(_global_rank(call), {})[call.seq] = call
    found = []
    for group in sorted(groups, key=lambda g: (len(g), g)):
        ranks = [r for r in members[group] if r in calls_by_rank]
        by_rank = groups[group]
        last = max(seq for seqs in by_rank.values() for seq in seqs)
        agreed: set = set()
        for seq in range(1, last + 1):
            at = [(r, by_rank.get(r, {}).get(seq)) for r in ranks]
            present = [c for _, c in at if c is not None]
            reason = "missing" if len(present) < len(at) else _desync.differ([rank_call(r, c) for r, c in at])
            if reason is None:
                agreed.update(c.location for c in present)
                continue
            before = tuple(
                (r, max((c for s, c in by_rank.get(r, {}).items() if s < seq), key=lambda c: c.seq, default=None))
                for r, c in at if c is None
            )
            how = tuple((r, (states or {}).get(r, "missing")) for r, _ in before)
            draft = Desync(group, seq, reason, tuple(at), "", before, how)
            repeated = any(c.location in agreed for c in present)
            cause = _desync.cause_of(reason, draft.rank_calls(), repeated=repeated)
            found.append(dataclasses.replace(draft, cause=cause))
            break
    return found
