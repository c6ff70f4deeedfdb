"""``session.invalid_values``: the argument values a TPU would have computed with silently (an
index out of range, an invalid distribution), one record per (line, op, argument) with how
often it came (``tracers/recording/invalid_value_tracer.py`` records them)."""

from __future__ import annotations

import dataclasses

from tpu_debug.tracers.events import InvalidValueEvent
from tpu_debug.tracers.reading.reader import Part

__all__ = ["InvalidValuePlace", "InvalidValuesQuery"]


@dataclasses.dataclass(frozen=True, slots=True)
class InvalidValuePlace:
    """One (line, op, argument) where an op met values PyTorch refuses: ``event`` is its first
    occurrence with ``count`` the occurrences in all; ``last_ts`` when it was last seen."""

    event: InvalidValueEvent
    last_ts: float

    @property
    def count(self) -> int:
        return self.event.count


class InvalidValuesQuery(Part):
    """``session.invalid_values()``: each place in the order it was first seen."""

    __slots__ = ()

    def __call__(self) -> list[InvalidValuePlace]:
        """Each (line, op, argument) an invalid value was found at, first seen first: the first
        event, its ``count`` the occurrences in all (the tracer writes a place's first event at
        once and one with the count as the trace ends; a run that ended abruptly has the first).

        Example::

            [(p.event.op, p.event.value, p.event.location, p.count) for p in session.invalid_values()]
        """
        events: list[InvalidValueEvent] = self._run.events(InvalidValueEvent.kind)  # type: ignore[assignment]
        places: dict[tuple, tuple[InvalidValueEvent, InvalidValueEvent]] = {}
        for e in sorted(events, key=lambda e: e.id):
            key = (e.location, e.op, e.argument)
            first, last = places.get(key, (e, e))
            places[key] = (first, e if e.count >= last.count else last)
        return [
            InvalidValuePlace(dataclasses.replace(first, count=max(first.count, last.count)), last.ts)
            for first, last in places.values()
        ]
