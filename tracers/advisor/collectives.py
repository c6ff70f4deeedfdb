"""The advisor's rule for c10d collectives: ranks of a group that stopped calling the same ones.

The live check of the `tpu` process group records a ``collective_desync`` event in the
rank's run before it raises, so the run of a job that ended with
``CollectiveDesyncError`` or ``CollectiveTimeoutError`` holds the finding: which
collective, what each rank did there and where, the cause and its fix, in the words of
:mod:`tpu_debug.core.desync` (the error's, and :func:`first_desyncs`' over killed
runs').
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_debug.core.desync import CAUSES, fix_for
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.collective_calls import desync_text, event_calls
from tpu_debug.tracers.events import CollectiveDesyncEvent

__all__ = ["collective_desync"]


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
            fix=fix_for(e.cause, calls, e.seq, timeout=e.timeout),
            cost_seconds=float(e.timeout or 0.0),
            evidence=Evidence(
                e.location,
                (Count("collective", e.seq), Count("ranks", len(calls)))
                + ((Count("waited", e.timeout, "s"),) if e.timeout is not None else ()),
                facts_lines,
            ),
            cause=e.cause,
            subject=f"group {e.group} #{e.seq} {e.reason} ranks {','.join(map(str, [e.rank, *others]))}",
        )
