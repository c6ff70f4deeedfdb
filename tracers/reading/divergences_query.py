"""``session.divergences``: where the device's numbers left the CPU's, the first op over
tolerance, the first NaN/Inf, and what the divergence check compared."""

from __future__ import annotations

from tpu_debug.tracers.events import DivergenceEvent, DivergenceSummaryEvent
from tpu_debug.tracers.reading.reader import Part
from tpu_debug.tracers.store import layout

__all__ = ["DivergencesQuery"]


class DivergencesQuery(Part):
    """``session.divergences(...)``: divergence events; ``session.divergences.first()`` the op
    that introduced the error, ``.nan_origin()``, ``.summary()``, ``.ranked()`` (the TUI's order)."""

    __slots__ = ()

    def __call__(
        self, *, measure: str | None = None, mode: str | None = None, over: bool | None = None
    ) -> list[DivergenceEvent]:
        """Divergence events in the order they happened.

        Args:
            measure: only ``"local"`` or ``"drift"``.
            mode: only ``"eager"`` or ``"compiled"``.
            over: only events over tolerance (True) or within it (False: NaN/Inf
                origins and dtype mismatches within tolerance).

        Example::

            over = session.divergences(measure="local", over=True)
        """
        out: list[DivergenceEvent] = self._run.events(DivergenceEvent.kind)  # type: ignore[assignment]
        return [
            e
            for e in out
            if (measure is None or e.measure == measure)
            and (mode is None or e.mode == mode)
            and (over is None or e.over == over)
        ]

    def first(self, measure: str = "local", *, mode: str | None = None) -> DivergenceEvent | None:
        """The first op or node over tolerance (``measure="local"``: the one that introduced
        the error), or None when everything compared was within tolerance."""
        for e in self(measure=measure, mode=mode):
            if e.first:
                return e
        return None

    def nan_origin(self) -> DivergenceEvent | None:
        """The first op or node whose device output held NaN/Inf its inputs did not."""
        return next((e for e in self() if e.nan_origin), None)

    def summary(self) -> DivergenceSummaryEvent | None:
        """What the divergence tracer compared (ops compared, occurrences per site...),
        or None when divergence was not checked in this run."""
        return self._run._summary(DivergenceSummaryEvent)

    def ranked(self, *, limit: int | None = None, offset: int = 0) -> list[DivergenceEvent]:
        """Divergence events ranked: the firsts over tolerance (local measure first, then in
        the order they happened), then NaN/Inf origins, then by error in units of tolerance
        (``ratio``), largest first."""
        run = self._run
        # rank on the divergences table alone, then fetch the page's events: sorting the
        # join would read every event of the run
        order = (
            "d.first DESC, CASE WHEN d.first THEN d.measure != 'local' END, CASE WHEN d.first THEN d.event_id END, "
            "d.nan_origin DESC, d.ratio DESC, "
            "CASE WHEN d.tolerance > 0 THEN d.max_abs / d.tolerance ELSE d.max_abs END DESC, d.event_id"
        )
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        ids = [r[0] for r in run._rows(f"SELECT d.event_id FROM divergences d ORDER BY {order}{page}")]
        if not ids:
            return []
        rank = {eid: i for i, eid in enumerate(ids)}
        out: list[DivergenceEvent] = run._decode_ids(layout(DivergenceEvent), ids)  # type: ignore[assignment]
        out.sort(key=lambda e: rank[e.id])
        return out
