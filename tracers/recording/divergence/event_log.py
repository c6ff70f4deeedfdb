"""From measures to events: sites, the first divergence, the per-site cap.

A *site* is one op or graph node at one source line, per measure and phase.
Every occurrence over tolerance (or a NaN/Inf origin, or a dtype mismatch) is
counted for its site; at most ``max_per_site`` become events, except the
first over tolerance and NaN/Inf origins, which are always recorded. The
first over tolerance is kept per mode and measure, and per compiled graph.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from tpu_debug.tracers.recording.divergence.measures import Measures
from tpu_debug.tracers.recording.divergence.triage import NOT_TRIAGED, Triaged, Verdict
from tpu_debug.tracers.events import DivergenceEvent, DivergenceSite, SourceLocation

__all__ = ["EventLog", "Site", "Subject"]


@dataclasses.dataclass(frozen=True, slots=True)
class Subject:
    """What a divergence event is about: an eager op or a compiled graph's node."""

    mode: str  # "eager" | "compiled"
    name: str  # the aten op (eager) or the FX node (compiled)
    target: str  # the aten op
    phase: str  # "forward" | "backward"
    location: SourceLocation | None
    graph: str | None = None  # the compiled graph
    autograd_node: str = ""  # eager backward: the autograd node that ran the op

    def site_key(self, measure: str) -> tuple:
        """The site this subject's ``measure`` is counted under (the run summary's row)."""
        return (self.mode, measure, self.phase, self.graph, self.name, self.location)


@dataclasses.dataclass(slots=True)
class Site:
    """Occurrences at one site; with TPU numerics, its verdict at precision "highest"; and
    its float64 verdict (:mod:`.triage`), both computed once per site."""

    count: int = 0
    recorded: int = 0
    highest: bool | None = None  # within tolerance at "highest" (None: not known)
    checked_highest: bool = False
    verdict: Verdict | None = None  # None: not known
    checked_verdict: bool = False


class EventLog:
    """Counts divergences per site and writes the ones worth an event.

    Args:
        writer: the run writer (``new_id()``, ``put(event)``).
        clock: seconds since the run started.
        max_per_site: events per site; later occurrences are only counted.
    """

    def __init__(self, writer: Any, clock: Callable[[], float], max_per_site: int) -> None:
        self.writer = writer
        self.clock = clock
        self.max_per_site = max_per_site
        self.sites: dict[tuple, Site] = {}
        self.over = {"local": 0, "drift": 0, "output": 0, "fused": 0}
        self.nan_origins = 0
        self._first: set[tuple] = set()
        self._lock = threading.Lock()

    def site(self, subject: Subject, measure: str) -> Site:
        key = subject.site_key(measure)
        site = self.sites.get(key)
        if site is None:
            with self._lock:
                site = self.sites.setdefault(key, Site())
        return site

    def record(
        self,
        subject: Subject,
        measure: str,
        m: Measures,
        *,
        nan_origin: bool = False,
        highest: bool | None = None,
        detail: Callable[[], Measures] | None = None,
        triage: Callable[[], Triaged] | None = None,
    ) -> None:
        """Count one divergence of ``subject`` and write its event unless its site is full.

        Args:
            subject: the op or node.
            measure: ``"local"`` or ``"drift"``.
            m: its measures (the cheap ones suffice to decide).
            nan_origin: the result holds NaN/Inf its inputs did not.
            highest: with TPU numerics, the verdict at precision "highest".
            detail: the full measures (relative error, ratio, ULP), computed only
                when an event is written.
            triage: its verdict (:mod:`.triage`), computed only when an event is written.
        """
        site = self.site(subject, measure)
        with self._lock:
            site.count += 1
            if m.over:
                self.over[measure] += 1
            if nan_origin:
                self.nan_origins += 1
            first_key = (subject.mode, subject.graph, measure)
            first = m.over and first_key not in self._first
            if first:
                self._first.add(first_key)
            if site.recorded >= self.max_per_site and not first and not nan_origin:
                return
            site.recorded += 1
        if detail is not None:
            m = detail()
        verdict = triage() if triage is not None else NOT_TRIAGED
        self.writer.put(
            _event(self.writer.new_id(), self.clock(), subject, measure, m, nan_origin, highest, first, verdict)
        )

    def site_rows(self, limit: int) -> tuple[DivergenceSite, ...]:
        """The busiest ``limit`` sites, most occurrences first, as the run summary lists them."""
        ranked = sorted(self.sites.items(), key=lambda kv: -kv[1].count)[:limit]
        return tuple(
            DivergenceSite(
                mode, measure, phase, graph, name,
                location.file if location else None, location.line if location else None,
                site.count, site.recorded,
            )
            for (mode, measure, phase, graph, name, location), site in ranked
        )


def _event(
    id: int,
    ts: float,
    subject: Subject,
    measure: str,
    m: Measures,
    nan_origin: bool,
    highest: bool | None,
    first: bool,
    triage: Triaged,
) -> DivergenceEvent:
    return DivergenceEvent(
        id=id,
        ts=ts,
        mode=subject.mode,
        thread=threading.get_native_id(),
        location=subject.location,
        name=subject.name,
        measure=measure,
        max_abs=m.max_abs,
        max_rel=m.max_rel,
        ulp=m.ulp,
        mismatched=m.mismatched,
        nan_origin=nan_origin,
        tolerance=m.allowed if m.allowed else m.atol,
        first=first,
        rtol=m.rtol,
        atol=m.atol,
        ratio=m.ratio,
        numel=m.numel,
        shape=m.shape,
        dtype=m.dtype,
        device_dtype=m.device_dtype,
        device_nonfinite=m.device_nonfinite,
        cpu_nonfinite=m.cpu_nonfinite,
        phase=subject.phase,
        graph=subject.graph,
        target=subject.target,
        autograd_node=subject.autograd_node,
        highest=highest,
        verdict=triage.verdict,
        basis=triage.basis,
        f64_max_abs=triage.f64_max_abs,
        f64_mismatched=triage.f64_mismatched,
        upstream=triage.upstream,
        crossings=triage.crossings,
    )
