"""``session.recompiles``: the compiles that were recompiles, grouped with what kept changing,
and dynamo's side of them (graph breaks, failed guards, functions at the recompile limit)."""

from __future__ import annotations

from typing import Any

from tpu_debug.tracers.events import CompileEvent, GraphBreakEvent, GuardFailureEvent, RecompileLimitEvent
from tpu_debug.tracers.reading.compiles_query import compile_events
from tpu_debug.tracers.reading.reader import Part
from tpu_debug.tracers.reading.recompile_analysis import DEFAULT_STORM_THRESHOLD, summarize

__all__ = ["RecompilesQuery"]


class RecompilesQuery(Part):
    """``session.recompiles(...)``: recompile events; ``session.recompiles.groups()`` per op or
    graph with storms and advice, ``.graph_breaks()``, ``.guard_failures()``, ``.limits()``."""

    __slots__ = ()

    def __call__(self, *, mode: str | None = None, name: str | None = None) -> list[CompileEvent]:
        """Compiles that were recompiles (they carry the diffs against the closest earlier key).
        An executable read back from the persistent compile cache is none: XLA compiled nothing."""
        return [c for c in compile_events(self._run, mode=mode, name=name) if c.diffs and not c.from_cache]

    def groups(self, *, storm_threshold: int | None = None) -> list[Any]:
        """The run's compiles grouped by op or graph, most recompiled first, with what kept
        changing, storms and advice (``tracers.reading.recompile_analysis.RecompileGroup``).

        Args:
            storm_threshold: more recompiles than this make a storm (default: the run's
                ``storm_threshold`` option).

        Example::

            [(g.identity, g.recompiles, g.storm) for g in session.recompiles.groups()]
        """

        run = self._run
        if storm_threshold is None:
            storm_threshold = int(run.metadata().options.get("storm_threshold", DEFAULT_STORM_THRESHOLD))
        return summarize(compile_events(run), storm_threshold=storm_threshold)

    def graph_breaks(self) -> list[GraphBreakEvent]:
        """Where dynamo split compiled functions, and why."""
        return self._run.events(GraphBreakEvent.kind)  # type: ignore[return-value]

    def guard_failures(self) -> list[GuardFailureEvent]:
        """Dynamo recompiles: the failed guard of each cached graph, per new compile."""
        return self._run.events(GuardFailureEvent.kind)  # type: ignore[return-value]

    def limits(self) -> list[RecompileLimitEvent]:
        """Functions that hit dynamo's recompile limit."""
        return self._run.events(RecompileLimitEvent.kind)  # type: ignore[return-value]
