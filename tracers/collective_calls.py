"""Where ranks stopped calling the same collectives: a reader of ``collective_call`` events.

c10d pairs the ranks' collectives of a group by their order: the n-th collective of
one rank runs with the n-th of every other. When one rank calls another collective,
with other sizes or another dtype, or stops calling (a collective under
``if rank == 0``, an uneven last batch, a rank that died), the group hangs or mixes
data. Each rank's run records the collectives it entered, in order, at the user's
line (``CollectiveCallEvent``); comparing the ranks' sequences, group by group, names
the first sequence number where they differ and what each rank did there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tpu_debug.tracers.events import CollectiveCallEvent

__all__ = ["Desync", "first_desyncs"]

_P2P = ("send", "recv", "recv_anysource")
# collectives whose tensors have the same shapes on every rank; all_to_all with splits,
# gather and scatter differ by design (a root's lists, each rank's split sizes)
_SAME_SHAPES = frozenset({
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
    "all_gather_single", "all_gather_single_coalesced", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_single_coalesced", "alltoall", "barrier",
})


@dataclasses.dataclass(frozen=True, slots=True)
class Desync:
    """The first collective of ``group`` at which its ranks differ.

    ``seq`` is that collective's sequence number in the group (from 1); ``calls`` holds,
    per global rank, what the rank called there (None: it called no collective of the
    group there, so it stopped, ended or hung before); ``reason`` is ``"missing"``,
    ``"op"``, ``"shapes"`` or ``"dtype"``.
    """

    group: str
    seq: int
    reason: str
    calls: tuple[tuple[int, CollectiveCallEvent | None], ...]

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


def _differ(calls: list[CollectiveCallEvent]) -> str | None:
    first = calls[0]
    if any(c.op != first.op for c in calls):
        return "op"
    if first.op in _SAME_SHAPES and any(c.shapes != first.shapes for c in calls):
        return "shapes"
    if any(c.dtype != first.dtype for c in calls):
        return "dtype"
    return None


def first_desyncs(calls_by_rank: Mapping[int, Sequence[CollectiveCallEvent]]) -> list[Desync]:
    """The first differing collective of each group the ranks share, in group order.

    Args:
        calls_by_rank: each rank's ``collective_call`` events (any order), keyed by global rank.

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
            if call.op in _P2P:
                continue
            members.setdefault(call.group, call.group_ranks)
            groups.setdefault(call.group, {}).setdefault(_global_rank(call), {})[call.seq] = call
    found = []
    for group in sorted(groups, key=lambda g: (len(g), g)):
        ranks = [r for r in members[group] if r in calls_by_rank]
        by_rank = groups[group]
        last = max(seq for seqs in by_rank.values() for seq in seqs)
        for seq in range(1, last + 1):
            at = [(r, by_rank.get(r, {}).get(seq)) for r in ranks]
            present = [c for _, c in at if c is not None]
            reason = "missing" if len(present) < len(at) else _differ(present)
            if reason is not None:
                found.append(Desync(group, seq, reason, tuple(at)))
                break
    return found
