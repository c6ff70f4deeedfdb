"""The report's findings section: the advisor's records, rendered (the report composes no advice)."""

from __future__ import annotations

import weakref
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tpu_debug.core.format import format_bytes, format_location, format_seconds
from tpu_debug.report.core import (
    dim_note,
    section,
)
from tpu_debug.tracers.advisor import FINDINGS_SCHEMA, Advice, Finding, advise
from tpu_debug.tracers.reading.view import RunView

# the advice of each session, with the run's watermark it was worked out at
_ADVICE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def advice_of(session: RunView) -> Advice:
    """The advisor's :class:`~tpu_debug.tracers.advisor.Advice` for ``session``'s run, worked
    out once per state of the run (a live run that grew is advised again)."""
    mark = session.watermark()
    known = _ADVICE.get(session)
    if known is not None and known[0] == mark:
        return known[1]
    advice = advise(session)
    _ADVICE[session] = (mark, advice)
    return advice


_SEVERITY_MARK = {"error": "ERROR", "warning": "WARN", "info": "INFO"}
_SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}


def _count_text(c: Any) -> str:
    if c.unit == "s":
        return f"{c.name} {format_seconds(c.value)}"
    if c.unit == "B":
        return f"{c.name} {format_bytes(int(c.value))}"
    value = f"{c.value:,.0f}" if float(c.value).is_integer() else f"{c.value:,.3g}"
    return f"{c.name} {value}"


def consequence_text(c: Any, cwd: str | None = None) -> str:
    """One consequence of a finding's cause: what happened, and its own line when it has one."""
    loc = c.location
    where = f" (at {format_location(loc.file, loc.line, loc.function, cwd=cwd, full=True)})" if loc is not None else ""
    cost = f", {format_seconds(c.cost_seconds)}" if c.cost_seconds else ""
    return f"{c.text}{cost}{where}"


def finding_text(f: Any, *, terminal: bool = False, cwd: str | None = None) -> Text:
    """One finding as the report shows it: severity and title, then where, what it cost,
    the evidence, what its cause led to (the consequences, under the cause) and the fix
    (every word of it from the finding)."""
    text = Text()
    text.append(f"{_SEVERITY_MARK[f.severity]} ", style=_SEVERITY_STYLE[f.severity] if terminal else "")
    text.append(f.title, style="bold" if terminal else "")
    loc = f.evidence.location
    details = []
    if loc is not None:
        details.append(("at", format_location(loc.file, loc.line, loc.function, cwd=cwd, full=True)))
    if f.steps is not None:
        first, last = f.steps
        details.append(("steps", f"{first}" if first == last else f"{first}-{last}"))
    if f.cost_seconds:
        details.append(("cost", format_seconds(f.cost_seconds) + (" (estimate)" if f.estimated else "")))
    if f.evidence.counts:
        details.append(("evidence", ", ".join(_count_text(c) for c in f.evidence.counts)))
    details += [("", fact) for fact in f.evidence.facts]
    details += [("led to", consequence_text(c, cwd)) for c in f.consequences]
    details.append(("fix", f.fix))
    for key, value in details:
        text.append("\n  ")
        if key:
            text.append(f"{key}: ", style="dim" if terminal else "")
        text.append(value)
    return text


def _render_findings(d: dict, terminal: bool) -> RenderableType:
    # the advisor's records, most serious and most costly first; no prose is made here
    parts: list[RenderableType] = []
    if not d["findings"]:
        parts.append(dim_note(
            "nothing to fix: no recompiles, syncs, fallbacks or uploads that repeat in steady state, "
            "no graph breaks inside the step, no float64, no divergence found"
        ))
    parts += [finding_text(Finding.from_dict(f), terminal=terminal) for f in d["findings"]]
    parts += [dim_note(e) for e in d["advisor_errors"]]
    return Group(*parts)


@section("Findings", order=1, key=None, render=_render_findings)
def _findings(session: RunView) -> dict[str, Any]:
    advice = advice_of(session)
    return {
        "findings_schema": FINDINGS_SCHEMA,
        "findings": [f.to_dict() for f in advice.findings],
        "advisor_errors": list(advice.errors),
    }
