"""The divergence probe: eager ops and compiled graphs checked against CPU, one run summary."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.tracers.recording.divergence.graph_checker import GraphChecker
from tpu_debug.tracers.recording.divergence.op_checker import EagerChecker
from tpu_debug.tracers.recording.divergence.event_log import EventLog
from tpu_debug.tracers.recording.divergence.tolerances import format_tolerances
from tpu_debug.tracers.recording.divergence.values import single_threaded
from tpu_debug.tracers.events import DivergenceSummaryEvent, UncomparedOp

__all__ = ["DivergenceTracer"]

_SUMMARY_SITES = 500  # sites listed in the run's summary, the busiest first


class DivergenceTracer:
    """Compares every device op and compiled-graph node with PyTorch on CPU (a probe).

    Args:
        writer: the run writer (events and the run's divergence summary go there).
        clock: seconds since the run started (the run's timestamps).
        tolerances: a table from :func:`parse_tolerances` (None: the defaults).
        sample: compare every ``sample``-th tensor node of a compiled graph (1: all).
        max_per_site: events recorded per (op, line, measure); later ones are only counted.
        record_error: where a failure of this tracer is reported (the program goes on).

    Example::

        with tpu_debug.trace(divergence=True) as session:
            loss = model(x).sum()
        session.divergences.first()
    """

    def __init__(
        self,
        writer: Any,
        *,
        clock: Callable[[], float],
        tolerances: Mapping | None = None,
        sample: int = 1,
        max_per_site: int = 5,
        record_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.tolerances = tolerances
        self.sample = max(1, int(sample))
        self.record_error = record_error
        self._log = EventLog(writer, clock, max_per_site)
        self._eager = EagerChecker(self._log, tolerances)
        self._graphs = GraphChecker(self._log, tolerances, self.sample)

    # -- probe methods ------------------------------------------------------------------

    def before_op(self, op: Any, args: tuple, kwargs: dict) -> None:
        self._eager.before_op(op, args, kwargs)

    def on_op(self, op: Any, args: tuple, kwargs: dict, out: Any) -> None:
        self._eager.on_op(op, args, kwargs, out)

    def on_graph(self, graph: Any, arrays: list, outputs: Any) -> None:
        try:
            with single_threaded():
                self._graphs.check(graph, arrays, outputs)
        except Exception as exc:  # noqa: BLE001 - one graph failing to compare is reported, not raised
            self._error(f"divergence of graph {graph.graph_id}", exc)

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(f"DivergenceTracer.{method}", exc)

    def _error(self, where: str, exc: BaseException) -> None:
        if self.record_error is not None:
            self.record_error(where, f"{type(exc).__name__}: {exc}")

    # -- the run's summary ----------------------------------------------------------------

    def summary(self) -> DivergenceSummaryEvent:
        """The run's divergence summary: counts, and occurrences per site."""
        eager, graphs, log = self._eager, self._graphs, self._log
        return DivergenceSummaryEvent(
            self.writer.new_id(), log.clock(), None, threading.get_native_id(), None,
            numerics=runtime_config.numerics,
            precision=runtime_config.effective_precision(),
            tolerances=format_tolerances(self.tolerances) or "default",
            sample=self.sample,
            ops_compared=eager.ops_compared,
            ops_copied=eager.ops_copied,
            graphs_compared=graphs.graphs_compared,
            nodes_compared=graphs.nodes_compared,
            over_local=log.over["local"],
            over_drift=log.over["drift"],
            nan_origins=log.nan_origins,
            not_compared=tuple(UncomparedOp(op, why) for op, why in sorted(eager.uncompared.items())),
            sites=log.site_rows(_SUMMARY_SITES),
            outputs_compared=graphs.fused.outputs_compared,
            over_output=log.over["output"],
            fused_programs=graphs.fused.programs_compiled,
            calls_skipped=graphs.schedule.skipped,
        )

    def close(self) -> None:
        """Record the summary in the run (the trace calls this at its end)."""
        self.writer.put(self.summary())
