"""The advisor's rules for c10d collectives: ranks of a group that stopped calling the same
ones, and a rank the others wait for at every collective.

The live check of the `tpu` process group records a ``collective_desync`` event in the
rank's run before it raises, so the run of a job that ended with
``CollectiveDesyncError`` or ``CollectiveTimeoutError`` holds the finding: which
collective, what each rank did there and where, the cause and its fix, in the words of
:mod:`tpu_debug.core.desync` (the error's, and :func:`first_desyncs`' over killed
runs').
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tpu_debug.core.desync import CAUSES, fix_for
from tpu_debug.core.format import format_seconds
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.reading.collective_calls import (
    STRAGGLER_MIN_CALLS,
    STRAGGLER_MIN_LATE,
    STRAGGLER_SHARE,
    desync_subject,
    desync_text,
    event_calls,
    warm_up_calls,
)
from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDesyncEvent, CollectiveDoneEvent

__all__ = ["collective_desync", "collective_straggler"]


@rule("collective_desync", about="ranks of a c10d group that called different collectives, or one that "
      "did not arrive (a hang or mixed data), with each rank's line and the fix by cause", view="collectives")
def collective_desync(facts: RunFacts) -> Iterable[Finding]:
    """One finding per desync the live check recorded in this run."""
    events: list[CollectiveDesyncEvent] = facts.query.events("collective_desync")
    for e in events:
        calls = event_calls(e)
        text = desync_text(e)
        header, _, rest = text.partition("\n")
        facts_lines = tuple(line.strip() for line in rest.splitlines() if line.startswith("  "))
        others = [c.rank for c in calls if c.rank != e.rank]
        yield Finding(
            kind="collective_desync",
            severity="error",
            title=f"{header}: {CAUSES.get(e.cause, e.cause)}",
            fix=fix_for(e.cause, calls, e.seq, timeout=e.timeout, what=desync_subject(e)),
            cost_seconds=float(e.timeout or 0.0),
            evidence=Evidence(
                e.location,
                (Count("collective", e.seq), Count("ranks", len(calls)))
                + ((Count("waited", e.timeout, "s"),) if e.timeout is not None else ()),
                facts_lines,
            ),
            cause=e.cause,
            subject=(f"group {e.group} {desync_subject(e) or f'#{e.seq}'} {e.reason} "
                     f"ranks {','.join(map(str, [e.rank, *others]))}"),
        )


@rule("collective_straggler", about="a rank that enters a c10d group's collectives last, again and again, while "
      "this rank waits for it (the live check's view of the ranks' arrival)", view="collectives")
def collective_straggler(facts: RunFacts) -> Iterable[Finding]:
    """One finding per group whose collectives one other rank entered last at least
    :data:`STRAGGLER_SHARE` of the time, this rank waiting for it; each call site's first
    collective is warm-up and left out (:func:`warm_up_calls`)."""
    dones: list[CollectiveDoneEvent] = [d for d in facts.query.events("collective_done") if d.last_rank is not None]
    if not dones:
        return
    calls: list[CollectiveCallEvent] = facts.query.events("collective_call")
    me = {c.group: c.ranks[c.rank] for c in calls if 0 <= c.rank < len(c.ranks)}
    where = {(c.group, c.seq): c.location for c in calls}
    warm_up = warm_up_calls(where.items())
    by_group: dict[str, list[CollectiveDoneEvent]] = {}
    for d in dones:
        if (d.group, d.seq) in warm_up:
            continue
        by_group.setdefault(d.group, []).append(d)
    for group, done in sorted(by_group.items(), key=lambda kv: (len(kv[0]), kv[0])):
        last = Counter(d.last_rank for d in done if d.last_rank != me.get(group))
        if not last:
            continue
        rank, hits = last.most_common(1)[0]
        waits = [d for d in done if d.last_rank == rank]
        waited = sum(d.waited or 0.0 for d in waits)
        n = len(done)
        if n < STRAGGLER_MIN_CALLS or hits < STRAGGLER_SHARE * n or waited / hits < STRAGGLER_MIN_LATE:
            continue
        lines = Counter(where.get((group, d.seq)) for d in waits if where.get((group, d.seq)) is not None)
        location = lines.most_common(1)[0][0] if lines else None
        yield Finding(
            kind="collective_straggler",
            severity="warning",
            title=(f"rank {rank} entered last at {hits} of {n} collectives of group {group}: this rank waited "
                   f"{format_seconds(waited)} for it ({format_seconds(waited / hits)} each)"),
            fix=(f"Rank {rank} reaches the group's collectives later than the others every time: it does more work "
                 "between them (its data loading or preprocessing, logging or checkpointing on that rank alone, "
                 "larger batches) or runs on a slower host. Its own run shows where its time goes between the "
                 f"collectives (tpu-debug report on rank {rank}'s run): even that work out across the ranks, or "
                 "move rank-specific work out of the training loop."),
            cost_seconds=waited,
            evidence=Evidence(location, (Count("last", hits), Count("collectives", n), Count("waited", waited, "s"))),
            cause="straggler",
            subject=f"group {group} rank {rank}",
        )
