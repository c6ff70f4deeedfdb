"""``session.steps``: the run's training steps, each with when it began and ended, how it was
detected, what ran in it and where its time went (``tracers.recording.step_tracker.StepTracker`` records them;
``tracers.reading.step_time`` splits them)."""

from __future__ import annotations

from tpu_debug.tracers.events import StepEvent, WaitEvent
from tpu_debug.tracers.reading.reader import Part
from tpu_debug.tracers.reading.step_phases import step_phases
from tpu_debug.tracers.reading.step_time import Goodput, StepSplit, Verdict, goodput, split_step, verdict

__all__ = ["StepsQuery"]


class StepsQuery(Part):
    """``session.steps()``: the run's steps in order; ``.split()``, ``.verdict()``,
    ``.goodput()``: where their time went, what bounds the run, its goodput."""

    __slots__ = ()

    def __call__(self) -> list[StepEvent]:
        """The run's steps in order (``tracers.events.StepEvent``: when each began and ended,
        how it was detected, what ran in it); empty when the run had none.

        Example::

            [(s.index, s.compiles) for s in session.steps()]
        """
        steps: list[StepEvent] = self._run.events(StepEvent.kind)  # type: ignore[assignment]
        return sorted(steps, key=lambda s: s.index)

    def phases(self) -> list[str]:
        """Each step's phase, ``"warm-up"`` or ``"steady"``, in the order of :meth:`__call__`."""
        return step_phases(self())

    def split(self) -> list[StepSplit]:
        """Each step's wall time in parts that add up to it (``tracers.reading.step_time.StepSplit``:
        input, compile, sync, collective, checkpoint, dispatch, host); empty for a run that
        recorded no split (recorded before it was kept, or imported).

        Example::

            [round(s.share("input"), 2) for s in session.steps.split()]
        """
        return [sp for sp in map(split_step, self()) if sp is not None]

    def verdict(self) -> Verdict | None:
        """What bounds the run's steady state (``tracers.reading.step_time.Verdict``), or None."""
        steps = self()
        return verdict(steps, self.phases() if steps else [])

    def waits(self, what: str | None = None) -> list[WaitEvent]:
        """The program's waits outside the runtime (``WaitEvent``: input, checkpoint,
        synchronize), in order; ``what`` keeps one kind."""
        waits: list[WaitEvent] = self._run.events(WaitEvent.kind)  # type: ignore[assignment]
        return [w for w in sorted(waits, key=lambda w: w.ts) if what is None or w.what == what]

    def goodput(self) -> Goodput | None:
        """The run's goodput and badput by cause (``tracers.reading.step_time.Goodput``), or None
        without split steps."""
        steps = self()
        if not steps:
            return None
        return goodput(steps, self.phases(), self._run.metadata().duration, self.waits("checkpoint"))
