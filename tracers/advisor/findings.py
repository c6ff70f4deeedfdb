"""Findings as data: what the advisor found, how sure, what it cost, and what to do.

A :class:`Finding` is rendered by the report, the TUI and ``report --json``;
none of them composes prose of its own. Its dictionary form
(:meth:`Finding.to_dict`, read back by :meth:`Finding.from_dict`) is versioned
by :data:`FINDINGS_SCHEMA`: a field is only ever added (a reader of version 1
ignores what it does not know), and a change that would make an old reader
misread a finding bumps the version.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tpu_debug.tracers.events import SourceLocation

__all__ = ["FINDINGS_SCHEMA", "SEVERITIES", "Consequence", "Count", "Evidence", "Finding", "rank"]

FINDINGS_SCHEMA = "tpu_debug.findings/1"

# most serious first: an "error" is about the results (wrong or failing on a TPU), a
# "warning" about time the program loses
SEVERITIES = ("error", "warning", "info")


@dataclasses.dataclass(frozen=True, slots=True)
class Count:
    """One measured figure of a finding's evidence: ``Count("steps", 18)``,
    ``Count("compile time", 2.4, "s")`` (``unit``: ``""``, ``"s"`` or ``"B"``)."""

    name: str
    value: float
    unit: str = ""

    def __post_init__(self) -> None:
        if self.unit not in ("", "s", "B"):
            raise ValueError(f"Count unit {self.unit!r}; use '', 's' (seconds) or 'B' (bytes)")


@dataclasses.dataclass(frozen=True, slots=True)
class Evidence:
    """What a finding rests on: the line, the figures, and the facts read from the run
    (a key diff, a guard, the values a dimension took), one line each."""

    location: SourceLocation | None = None
    counts: tuple[Count, ...] = ()
    facts: tuple[str, ...] = ()

    def count(self, name: str) -> float | None:
        """The value of the count called ``name``, if there is one."""
        return next((c.value for c in self.counts if c.name == name), None)


@dataclasses.dataclass(frozen=True, slots=True)
class Consequence:
    """What a finding's cause led to, shown under the cause rather than as a finding of its own:
    the recompile limit a changing size made a function hit, the eager ops it then recompiled,
    the read a print inside a compiled function makes.

    ``kind`` is the rule that names such a thing when it stands alone (``"recompile_limit"``,
    ``"recompile"``, ``"implicit_sync"``, ...), ``text`` what happened, in one line,
    ``location`` its user line (None when it has none of its own), ``cost_seconds`` what it
    cost (part of the finding's cost), ``targets`` the ops and graphs it is about.
    """

    kind: str
    text: str
    location: SourceLocation | None = None
    cost_seconds: float = 0.0
    targets: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "location": _location_dict(self.location),
            "cost_seconds": self.cost_seconds,
            "targets": list(self.targets),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Consequence:
        return cls(
            str(data["kind"]),
            str(data["text"]),
            _location_of(data.get("location")),
            float(data.get("cost_seconds") or 0.0),
            tuple(str(t) for t in data.get("targets", ())),
        )


def _location_dict(loc: SourceLocation | None) -> dict[str, Any] | None:
    return {"file": loc.file, "line": loc.line, "function": loc.function} if loc is not None else None


def _location_of(data: dict[str, Any] | None) -> SourceLocation | None:
    return SourceLocation(str(data["file"]), int(data["line"]), str(data["function"])) if data else None


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """Something in the run worth fixing.

    Attributes:
        kind: the rule that found it (``"recompile"``, ``"implicit_sync"``, ...;
            see :data:`tpu_debug.tracers.advisor.RULES`).
        severity: ``"error"`` (results: a divergence, float64 a TPU lacks, a
            function dynamo gave up compiling) or ``"warning"`` (time lost).
        title: what happens, in one line.
        fix: what to do about it, valid for the cause found.
        cost_seconds: the time it cost in this run (measured, or an estimate
            when ``estimated``); the advisor ranks findings by it.
        evidence: the line, figures and facts it rests on.
        steps: the first and last step (``StepEvent.index``) it was seen in,
            or None when it is not tied to steps.
        cause: what caused it, within the kind (for a recompile: ``"shape"``,
            ``"rank"``, ``"dtype"``, ``"scalar"``, ``"static"``, ``"precision"``,
            ``"guard"``, ``"grad"``, ``"layout"``, ``"cache"``, ``"inputs"``).
        subject: what it is about, stable across runs of the same program (an
            op or graph, a line and a cause): (kind, subject) matches one
            finding of one run with the same one of another.
        estimated: ``cost_seconds`` is an estimate, not a measurement.
        targets: the ops and graphs it is about, as the run names them (a
            compile's ``identity``, a fallback's op), for views that link to them.
        consequences: what the cause led to that would otherwise be findings of their own (one
            cause, one finding: a size that changes is one finding, and the recompile limit it
            made a function hit is one of its consequences), each with its own line and cost.
    """

    kind: str
    severity: str
    title: str
    fix: str
    cost_seconds: float
    evidence: Evidence = Evidence()
    steps: tuple[int, int] | None = None
    cause: str | None = None
    subject: str = ""
    estimated: bool = False
    targets: tuple[str, ...] = ()
    consequences: tuple[Consequence, ...] = ()

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding severity {self.severity!r}; use one of {', '.join(SEVERITIES)}")

    @property
    def key(self) -> tuple[str, str]:
        """(kind, subject): what matches this finding in another run."""
        return (self.kind, self.subject)

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (see the module docstring for its versioning)."""
        loc = self.evidence.location
        return {
            "kind": self.kind,
            "severity": self.severity,
            "title": self.title,
            "fix": self.fix,
            "cost_seconds": self.cost_seconds,
            "estimated": self.estimated,
            "steps": list(self.steps) if self.steps is not None else None,
            "cause": self.cause,
            "subject": self.subject,
            "targets": list(self.targets),
            "consequences": [c.to_dict() for c in self.consequences],
            "evidence": {
                "location": _location_dict(loc),
                "counts": [
                    {"name": c.name, "value": c.value if math.isfinite(c.value) else None, "unit": c.unit}
                    for c in self.evidence.counts
                ],
                "facts": list(self.evidence.facts),
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """A finding from :meth:`to_dict`'s form (fields it does not know are ignored).

        Raises:
            ValueError: a field is missing or has the wrong type.
        """
        try:
            ev = data.get("evidence") or {}
            loc = ev.get("location")
            steps = data.get("steps")
            return cls(
                kind=str(data["kind"]),
                severity=str(data["severity"]),
                title=str(data["title"]),
                fix=str(data["fix"]),
                cost_seconds=float(data["cost_seconds"]),
                evidence=Evidence(
                    _location_of(loc),
                    tuple(
                        Count(str(c["name"]), float("nan") if c["value"] is None else c["value"], str(c.get("unit", "")))
                        for c in ev.get("counts", ())
                    ),
                    tuple(str(f) for f in ev.get("facts", ())),
                ),
                steps=(int(steps[0]), int(steps[1])) if steps else None,
                cause=data.get("cause"),
                subject=str(data.get("subject", "")),
                estimated=bool(data.get("estimated", False)),
                targets=tuple(str(t) for t in data.get("targets", ())),
                consequences=tuple(Consequence.from_dict(c) for c in data.get("consequences", ())),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a finding ({type(exc).__name__}: {exc}): {data!r:.200}") from None


def rank(findings: list[Finding]) -> list[Finding]:
    """Most serious first (errors: results), then by the time each cost, most first."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -f.cost_seconds, f.kind, f.subject))
