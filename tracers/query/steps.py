"""``session.steps``: the run's training steps, each with when it began and ended, how it was
detected and what ran in it (``tracers.steps.StepTracker`` records them)."""

from __future__ import annotations

from tpu_debug.tracers.events import StepEvent
from tpu_debug.tracers.query.reader import Part

__all__ = ["StepsQuery"]


class StepsQuery(Part):
    """``session.steps()``: the run's steps in order."""

    __slots__ = ()

    def __call__(self) -> list[StepEvent]:
        """The run's steps in order (``tracers.events.StepEvent``: when each began and ended,
        how it was detected, what ran in it); empty when the run had none.

        Example::

            [(s.index, s.compiles) for s in session.steps()]
        """
        steps: list[StepEvent] = self._run.events(StepEvent.kind)  # type: ignore[assignment]
        return sorted(steps, key=lambda s: s.index)
