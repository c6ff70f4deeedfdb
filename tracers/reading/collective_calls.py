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
import signal
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence

from tpu_debug.core import desync as _desync
from tpu_debug.core.collective_kinds import P2P_OPS
from tpu_debug.tracers.collective_journal import journal_events
from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDesyncEvent, CollectiveDoneEvent
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "Desync",
    "GroupDesync",
    "RankRecord",
    "Straggler",
    "desync_subject",
    "desync_text",
    "event_calls",
    "first_desyncs",
    "group_desyncs",
    "rank_call",
    "read_rank",
    "stragglers",
    "warm_up_calls",
]

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
    # (rank, the exception it raised, its exit status), for ranks that did not call this one
    details: tuple[tuple[int, str, int | None], ...] = ()

    def rank_calls(self) -> list[_desync.RankCall]:
        """Each rank's part as :class:`tpu_debug.core.desync.RankCall`."""
        last, states = dict(self.last), dict(self.states)
        details = {rank: (error, status) for rank, error, status in self.details}
        out = []
        for rank, call in self.calls:
            if call is not None:
                out.append(rank_call(rank, call))
                continue
            error, status = details.get(rank, ("", None))
            out.append(dataclasses.replace(rank_call(rank, last.get(rank), states.get(rank, "missing")),
                                           error=error, exit_status=status))
        return out

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
            lines.append(f"  rank {rank}: {rank_call(rank, call).call_text()}")
        return "\n".join(lines)


def _global_rank(call: CollectiveCallEvent) -> int:
    return call.ranks[call.rank] if 0 <= call.rank < len(call.ranks) else call.rank


def rank_call(rank: int, call: CollectiveCallEvent | None, state: str = "called") -> _desync.RankCall:
    """A rank's call (or, with another ``state``, its last call) as :class:`~tpu_debug.core.desync.RankCall`."""
    if call is None:
        return _desync.RankCall(rank, state)
    loc = call.location
    return _desync.RankCall(
        rank, state, call.op, call.seq, _desync.shape_texts(call.shapes), call.dtype, call.reduce_op, call.peer,
        loc.file if loc is not None else None, loc.line if loc is not None else None,
        loc.function if loc is not None else None,
    )


def event_calls(event: CollectiveDesyncEvent) -> list[_desync.RankCall]:
    """Each rank's part of a desync the live check recorded."""
    return list(event.calls)


def desync_subject(event: CollectiveDesyncEvent) -> str | None:
    """How the text names a recorded desync's call: a send and its receive, or None for the
    group's collective ``#seq``."""
    return _desync.p2p_subject(*event.p2p) if len(event.p2p) == 4 else None


def desync_text(event: CollectiveDesyncEvent) -> str:
    """The text of a desync the live check recorded (what the rank raised)."""
    return _desync.describe(event.group, event.seq, event.reason, event.cause, event_calls(event),
                            timeout=event.timeout, what=desync_subject(event))


def first_desyncs(calls_by_rank: Mapping[int, Sequence[CollectiveCallEvent]],
                  states: Mapping[int, str] | None = None,
                  details: Mapping[int, tuple[str, int | None]] | None = None) -> list[Desync]:
    """The first differing collective of each group the ranks share, in group order.

    Args:
        calls_by_rank: each rank's ``collective_call`` events (any order), keyed by global rank.
        states: how ranks whose calls stop early stopped, when the caller knows (``"ended"``:
            the process exited; ``"raised"``: with an exception; ``"died"``: killed); others
            are ``"missing"``.
        details: for such ranks, (the exception it raised, its exit status), when known.

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
            members.setdefault(call.group, call.ranks)
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
            known = tuple((r, *(details or {})[r]) for r, _ in before if r in (details or {}))
            draft = Desync(group, seq, reason, tuple(at), "", before, how, known)
            repeated = any(c.location in agreed for c in present)
            cause = _desync.cause_of(reason, draft.rank_calls(), repeated=repeated)
            found.append(dataclasses.replace(draft, cause=cause))
            break
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class RankRecord:
    """One rank's collectives as its run holds them: ``calls`` and ``dones`` (None for a run
    recorded before returns were) from the run store and, for the last moments of a rank
    that was killed, its journal (``tracers/collective_journal.py``); ``desyncs`` the live
    check recorded; how its process ended: ``state`` (``"ended"``, ``"raised"`` with
    ``error``, ``"died"`` with ``exit_status`` when known, ``"missing"`` while it runs, or
    when a launcher stopped it while it still ran)."""

    rank: int
    calls: tuple[CollectiveCallEvent, ...]
    dones: tuple[CollectiveDoneEvent, ...] | None
    desyncs: tuple[CollectiveDesyncEvent, ...] = ()
    state: str = "missing"
    error: str = ""
    exit_status: int | None = None


def _key(op: str, group: str, seq: int) -> tuple[str, bool, int]:
    # a group's sends and receives count their own sequence: one seq can name two calls
    return group, op in P2P_OPS, seq


def read_rank(rank: int, session: RunView, *, exit_status: int | None = None) -> RankRecord:
    """Rank ``rank``'s collectives from its run (``session``), with the calls its journal
    kept that the run store had not committed when the rank was killed.

    Args:
        rank: the rank's global rank.
        session: its run.
        exit_status: its exit status, when the launcher recorded it (``tpu-debug run --nproc``).
    """
    meta = session.metadata()
    calls = list(session.events("collective_call"))
    dones = list(session.events("collective_done")) if session.records("collective_done") else None
    if not dones and meta.imported_from:
        dones = None  # dumps whose entries carry no completion times (gloo's): returns unknown, not missing
    lost_calls, lost_dones = journal_events(session.run_dir)
    have = {_key(c.op, c.group, c.seq) for c in calls}
    calls += [c for c in lost_calls if _key(c.op, c.group, c.seq) not in have]
    if dones is not None or lost_dones:
        done = {_key(d.op, d.group, d.seq) for d in dones or ()}
        dones = list(dones or ()) + [d for d in lost_dones if _key(d.op, d.group, d.seq) not in done]
    error = meta.error or ""
    status = meta.exit_status if exit_status is None else exit_status
    if meta.status == "terminated":
        # SIGTERM: stopped from outside while it still ran (torchrun stops the other ranks once
        # one failed): it did not fail there itself
        state = "missing"
    elif meta.status == "killed" or (status is not None and status < 0 and status != -signal.SIGTERM):
        state = "died"
    elif meta.status == "failed" and error:
        state = "raised"
    elif meta.status in ("finished", "failed", "interrupted"):
        state = "ended"
    else:
        state = "missing"
    return RankRecord(rank, tuple(sorted(calls, key=lambda c: c.ts)),
                      None if dones is None else tuple(sorted(dones, key=lambda d: d.ts)),
                      tuple(session.events("collective_desync")), state,
                      error if state == "raised" else "", status if state == "died" else None)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupDesync:
    """Where a group's ranks first differ, read after the fact: ``desync`` from the ranks'
    calls, and ``text``: the live check's own text when a rank recorded it (``live``),
    else :meth:`Desync.describe` with what the runs say of the ranks that stopped."""

    desync: Desync | None
    text: str
    group: str
    seq: int
    reason: str
    cause: str
    live: bool


def group_desyncs(records: Mapping[int, RankRecord]) -> list[GroupDesync]:
    """The first difference of each group whose ranks differ, in the words of the live error
    when one was raised (the same text, live and after the fact)."""
    calls = {r: list(rec.calls) for r, rec in records.items()}
    states = {r: rec.state for r, rec in records.items()}
    details = {r: (rec.error, rec.exit_status) for r, rec in records.items()}
    found = {d.group: d for d in first_desyncs(calls, states, details)}
    live: dict[str, CollectiveDesyncEvent] = {}
    for rank in sorted(records):
        for e in records[rank].desyncs:
            if not e.p2p and (e.group not in live or e.seq < live[e.group].seq):
                live[e.group] = e
    out = []
    for group in sorted(set(found) | set(live), key=lambda g: (len(g), g)):
        d, e = found.get(group), live.get(group)
        if e is not None:
            out.append(GroupDesync(d, desync_text(e), group, e.seq, e.reason, e.cause, True))
        elif d is not None:
            out.append(GroupDesync(d, d.describe(), group, d.seq, d.reason, d.cause, False))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Straggler:
    """The rank of ``group`` that entered its collectives last most often: last at ``last``
    of the ``of`` collectives every rank entered, ``late`` seconds after the rank before it
    on average there (what the others waited for it), ``waited`` in all."""

    group: str
    rank: int
    last: int
    of: int
    late: float
    waited: float


#: a rank is named the straggler when it arrived last at least this share of at least
#: STRAGGLER_MIN_CALLS collectives, STRAGGLER_MIN_LATE seconds late on average: with ranks
#: alike, which one comes last is a coin toss, and a few microseconds are noise
STRAGGLER_SHARE = 0.75
STRAGGLER_MIN_CALLS = 4
STRAGGLER_MIN_LATE = 0.001


def warm_up_calls(sites: Iterable[tuple[tuple[str, int], Hashable]]) -> set[tuple[str, int]]:
    """The (group, seq) of each call site's first collective in its group: the ranks reach
    it after work they do once (imports, first compiles, a compile cache one rank has and
    another lacks), so who arrives last there says nothing about the steady state a
    straggler costs.

    Args:
        sites: ((group, seq), where it was called) pairs, in any order.
    """
    first: dict[tuple[str, Hashable], tuple[str, int]] = {}
    for (group, seq), site in sites:
        key = (group, site)
        if key not in first or seq < first[key][1]:
            first[key] = (group, seq)
    return set(first.values())


def stragglers(entered: Mapping[tuple[str, int], Mapping[int, float]],
               members: Mapping[str, Sequence[int]],
               warm_up: Container[tuple[str, int]] = ()) -> list[Straggler]:
    """Per group, the rank that arrived last most often, when it stands out.

    Args:
        entered: (group, seq) -> rank -> when it entered that collective, on one clock.
        members: each group's global ranks.
        warm_up: collectives left out (:func:`warm_up_calls`).
    """
    tally: dict[str, dict[int, list[float]]] = {}
    count: dict[str, int] = {}
    for (group, seq), at in entered.items():
        if (group, seq) in warm_up:
            continue
        ranks = members.get(group, ())
        if len(ranks) < 2 or any(r not in at for r in ranks):
            continue
        order = sorted(ranks, key=lambda r: at[r])
        count[group] = count.get(group, 0) + 1
        tally.setdefault(group, {}).setdefault(order[-1], []).append(at[order[-1]] - at[order[-2]])
    out = []
    for group, by_rank in sorted(tally.items(), key=lambda kv: (len(kv[0]), kv[0])):
        rank, lates = max(by_rank.items(), key=lambda kv: (len(kv[1]), sum(kv[1])))
        n = count[group]
        mean = sum(lates) / len(lates)
        if n >= STRAGGLER_MIN_CALLS and len(lates) >= STRAGGLER_SHARE * n and mean >= STRAGGLER_MIN_LATE:
            out.append(Straggler(group, rank, len(lates), n, mean, sum(lates)))
    return out
