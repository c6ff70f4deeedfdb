"""``session.transfers``: host <-> device transfers, and the same grouped by the source line
that made them."""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_debug.tracers.events import SourceLocation, TransferEvent
from tpu_debug.tracers.reading.reader import Part
from tpu_debug.tracers.reading.transfer_causes import call_sites

__all__ = ["TransferSite", "TransfersQuery"]


@dataclasses.dataclass(frozen=True, slots=True)
class TransferSite:
    """Transfers from one source line with one direction, cause and kind, added up.

    ``timeline`` counts them per time bucket between the run's first and last
    transfer (empty unless asked for, see :meth:`TransfersQuery.sites`).
    """

    location: SourceLocation | None
    direction: str
    op: str
    implicit: bool
    count: int
    nbytes: int
    seconds: float
    first_ts: float
    last_ts: float
    timeline: tuple[int, ...] = ()


class TransfersQuery(Part):
    """``session.transfers(...)``: transfer events; ``session.transfers.call_sites()`` by line
    and cause (the report's), ``.sites(buckets=...)`` by line over time (the TUI's)."""

    __slots__ = ()

    def __call__(self, *, direction: str | None = None, op: str | None = None) -> list[TransferEvent]:
        """Host <-> device transfers, oldest first.

        Example::

            syncs = [t for t in session.transfers(direction="d2h") if t.implicit]
        """
        out: list[TransferEvent] = self._run.events(TransferEvent.kind, name=op)  # type: ignore[assignment]
        if direction is not None:
            out = [t for t in out if t.direction == direction]
        return out

    def call_sites(self) -> list[Any]:
        """Transfers by source line, direction and cause: implicit first, then loops, then the
        most frequent (``tracers.reading.transfer_causes.CallSite``; ``loop`` marks a line that synced often)."""

        return call_sites(self())

    def sites(self, *, buckets: int = 0, limit: int | None = None) -> list[TransferSite]:
        """Transfers grouped by source line, direction, cause and kind: implicit ones first,
        then the most frequent, then the slowest.

        One pass over the transfers, however many there are (the TUI calls this on runs
        with hundreds of thousands of them).

        Args:
            buckets: also count each site's transfers in this many equal time buckets
                between the first and the last transfer of the run (``timeline``).
            limit: at most this many sites.
        """
        run = self._run
        t0, t1 = run._rows("SELECT min(ts), max(ts) FROM events WHERE kind = 'transfer'")[0]
        if t0 is None:
            return []
        n = max(1, buckets)
        width = (t1 - t0) / n or 1.0
        rows = run._rows(
            "SELECT e.location_id, t.direction, e.name, t.implicit, "
            "min(CAST((e.ts - ?) / ? AS INTEGER), ?), count(*), total(t.nbytes), total(e.seconds), "
            "min(e.ts), max(e.ts) FROM transfers t JOIN events e ON e.id = t.event_id GROUP BY 1, 2, 3, 4, 5",
            (t0, width, n - 1),
        )
        sites: dict[tuple, list] = {}
        for lid, direction, op, implicit, b, count, nbytes, seconds, first, last in rows:
            site = sites.get((lid, direction, op, implicit))
            if site is None:
                site = sites[(lid, direction, op, implicit)] = [0, 0.0, 0.0, first, last, [0] * n]
            site[0] += count
            site[1] += nbytes
            site[2] += seconds
            site[3] = min(site[3], first)
            site[4] = max(site[4], last)
            site[5][b] += count
        locations = self._locations(sorted({key[0] for key in sites if key[0] is not None}))
        out = [
            TransferSite(
                locations.get(lid) if lid is not None else None,
                direction,
                op,
                bool(implicit),
                count,
                int(nbytes),
                seconds,
                first,
                last,
                tuple(timeline) if buckets > 0 else (),
            )
            for (lid, direction, op, implicit), (count, nbytes, seconds, first, last, timeline) in sites.items()
        ]
        out.sort(key=lambda s: (not s.implicit, -s.count, -s.seconds, str(s.location), s.direction, s.op))
        return out[:limit] if limit is not None else out

    def _locations(self, ids: list[int]) -> dict[int, SourceLocation]:
        locations: dict[int, SourceLocation] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for lid, file, line, function in self._run._rows(
                f"SELECT id, file, line, function FROM locations WHERE id IN ({','.join('?' * len(chunk))})",
                tuple(chunk),
            ):
                locations[lid] = SourceLocation(file, line, function)
        return locations
