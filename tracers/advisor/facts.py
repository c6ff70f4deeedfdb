"""What the rules read: a run's events, each placed in its step and phase, read once."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tpu_debug.runtime.target.hardware import Target, TargetSpecError, parse_target
from tpu_debug.tracers.events import (
    CompileEvent,
    FallbackEvent,
    GraphBreakEvent,
    RecompileLimitEvent,
    StepEvent,
    TargetCompileEvent,
    TargetStepEvent,
    TargetSummaryEvent,
    TransferEvent,
)
from tpu_debug.tracers.reading.memory_view import MemoryView, memory_view
from tpu_debug.tracers.reading.step_phases import (
    STEADY,
    StepIndex,
    StepSummary,
    phase_of,
    step_phases,
    summarize_steps,
)
from tpu_debug.tracers.reading.view import RunView

__all__ = ["RunFacts"]

T = TypeVar("T")


class RunFacts:
    """One run as the rules see it. Everything is read from the run on first use and kept.

    Args:
        query: the run (a :class:`~tpu_debug.tracers.reading.RunQuery` or a Session).
    """

    def __init__(self, query: RunView) -> None:
        self.query = query
        self._memo: dict[str, Any] = {}

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """What ``make()`` reads from the run, worked out once: rules that judge one analysis
        (the sizes that change, which the dynamic_shape rule makes findings of and the recompile
        rules leave to it) ask for it by one ``key``."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # -- steps ----------------------------------------------------------------------------

    @functools.cached_property
    def steps(self) -> list[StepEvent]:
        return self.query.steps()

    @functools.cached_property
    def phases(self) -> dict[int, str]:
        """``"warm-up"`` or ``"steady"`` per step index."""
        return dict(zip((s.index for s in self.steps), step_phases(self.steps)))

    @functools.cached_property
    def index(self) -> StepIndex:
        return StepIndex(self.steps)

    @functools.cached_property
    def steady(self) -> list[StepEvent]:
        """The steady-state steps, in order."""
        return [s for s in self.steps if self.phases[s.index] == STEADY]

    @functools.cached_property
    def summary(self) -> StepSummary:
        return summarize_steps(self.steps, self.compiles)

    def step_of(self, ts: float) -> int | None:
        """The index of the step holding ``ts`` (None outside every step)."""
        return self.index.step_of(ts)

    def phase(self, ts: float) -> str:
        """``"setup"``, ``"warm-up"``, ``"steady"``, ``"tail"``, ``"between"`` or ``"unstepped"``."""
        return phase_of(self.index, self.phases, ts)

    def steady_steps_of(self, events: Sequence[Any]) -> list[int]:
        """The steady steps (their indexes, sorted, once each) that hold any of ``events``."""
        out: set[int] = set()
        for e in events:
            i = self.index.position(e.ts)
            if i is not None:
                step = self.index.steps[i]
                if self.phases[step.index] == STEADY:
                    out.add(step.index)
        return sorted(out)

    def in_steady(self, events: Sequence[Any]) -> list[Any]:
        """The events among ``events`` that happened in steady steps."""
        return [e for e in events if self.phase(e.ts) == STEADY]

    # -- events ---------------------------------------------------------------------------

    @functools.cached_property
    def metadata(self) -> Any:
        return self.query.metadata()

    @functools.cached_property
    def compiles(self) -> list[CompileEvent]:
        return self.query.compiles()

    @functools.cached_property
    def transfers(self) -> list[TransferEvent]:
        return self.query.transfers()

    @functools.cached_property
    def fallbacks(self) -> list[FallbackEvent]:
        return self.query.ops.fallbacks()

    @functools.cached_property
    def graph_breaks(self) -> list[GraphBreakEvent]:
        return self.query.recompiles.graph_breaks()

    @functools.cached_property
    def recompile_limits(self) -> list[RecompileLimitEvent]:
        return self.query.recompiles.limits()

    @functools.cached_property
    def memory(self) -> MemoryView:
        """The memory tracer's records: per step, the summary, the fit's verdicts."""
        return memory_view(self.query)

    @functools.cached_property
    def target_compiles(self) -> list[TargetCompileEvent]:
        """The run's programs compiled again for its TPU target."""
        return [e for e in self.query.events(TargetCompileEvent.kind) if isinstance(e, TargetCompileEvent)]

    @functools.cached_property
    def target(self) -> Target | None:
        """The TPU the run's programs were also compiled for (``--target``), or None."""
        summaries = [e for e in self.query.events(TargetSummaryEvent.kind) if isinstance(e, TargetSummaryEvent)]
        if not summaries:
            return None
        try:
            return parse_target(summaries[-1].target)
        except TargetSpecError:
            return None  # a run recorded with a target this version does not know

    @functools.cached_property
    def target_seconds(self) -> dict[int, float]:
        """Per step index, the step's time on the target as its compiles estimate it (the
        programs' roofline time, back to back: see ``TargetStepEvent``); steps whose programs
        were not all estimated are left out."""
        out = {}
        for e in self.query.events(TargetStepEvent.kind):
            if isinstance(e, TargetStepEvent) and not e.unfinished and e.executions and e.estimated == e.executions:
                out[e.step] = e.estimated_seconds
        return out

    @functools.cached_property
    def ops(self) -> list[Any]:
        """Per op and mode: the device's executions and time (``OpSummary.executed``): the
        rules judge dispatch and device work, and read CPU fallbacks from ``fallbacks``."""
        return [o.executed() for o in self.query.ops() if o.count > o.fallbacks or o.compiles]
