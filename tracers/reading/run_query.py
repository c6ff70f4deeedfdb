"""``RunQuery``: one run read back, the run-wide queries and one part per subject."""

from __future__ import annotations

import json
from pathlib import Path

from tpu_debug.tracers.events import (
    CollectivesTargetEvent,
    DryRunSummaryEvent,
    InternalErrorEvent,
    ProcessEvent,
    TensorBoardSummaryEvent,
    event_type,
)
from tpu_debug.tracers.reading.compiles_query import CompilesQuery
from tpu_debug.tracers.reading.divergences_query import DivergencesQuery
from tpu_debug.tracers.reading.invalid_values_query import InvalidValuesQuery
from tpu_debug.tracers.reading.memory_query import MemoryQuery
from tpu_debug.tracers.reading.ops_query import OpsQuery
from tpu_debug.tracers.reading.programs_query import ProgramsQuery
from tpu_debug.tracers.reading.reader import RunReader
from tpu_debug.tracers.reading.recompiles_query import RecompilesQuery
from tpu_debug.tracers.reading.steps_query import StepsQuery
from tpu_debug.tracers.reading.transfers_query import TransfersQuery
from tpu_debug.tracers.store import META_CAPPED

__all__ = ["RunQuery"]


class RunQuery(RunReader):
    """Queries over one run's database (read-only).

    Each subject is a part: calling it lists the subject's records, its methods answer the
    subject's other questions. ``ops``, ``programs``, ``compiles``, ``recompiles``,
    ``transfers``, ``divergences``, ``steps``, ``invalid_values``, ``memory``; ``events(kind)``, ``metadata()``
    and the run's summaries are the run's own. It is a :class:`~.view.RunView`, what every reader
    takes; what the advisor finds in it is ``Session.findings()`` (the advisor reads runs, so a
    run does not call it).

    Example::

        q = RunQuery(Path("tpu_debug_runs/20260101T000000.000Z-train/run.db"))
        [(o.name, o.count) for o in q.ops()][:3]
        q.compiles.groups()[0].recompiles
        print(q.programs.hlo("aten::mul.Tensor"))
    """

    def __init__(self, db_path: Path) -> None:
        super().__init__(db_path)
        self.ops = OpsQuery(self)
        self.programs = ProgramsQuery(self)
        self.compiles = CompilesQuery(self)
        self.recompiles = RecompilesQuery(self)
        self.transfers = TransfersQuery(self)
        self.divergences = DivergencesQuery(self)
        self.steps = StepsQuery(self)
        self.invalid_values = InvalidValuesQuery(self)
        self.memory = MemoryQuery(self)

    # -- what was recorded ----------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Number of events per kind (kinds with none are left out). Op executions count
        as ``"op"`` events only when per-execution events were recorded."""
        counts = dict(self._rows("SELECT kind, count(*) FROM events GROUP BY kind"))
        executions = self._rows("SELECT count(*) FROM executions")[0][0]
        if executions:
            counts["op"] = executions
        return dict(sorted(counts.items()))

    def capped_counts(self, kind: str) -> dict[str, int]:
        """Events of a capped kind (``Stored.cap``, e.g. internal errors per ``where``)
        whose value went over the cap: per value, how many there were in all (the run
        keeps only the first ones).

        Raises:
            ValueError: ``kind`` is not an event kind.
        """
        event_type(kind)
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (META_CAPPED,))
        try:
            capped = json.loads(rows[0][0]) if rows else {}
            return {str(k): int(v) for k, v in capped.get(kind, {}).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise self._damaged(exc) from None

    def modes(self) -> list[str]:
        """The execution modes seen in the run (``"eager"``, ``"compiled"``)."""
        rows = self._rows(
            "SELECT mode FROM op_stats UNION "
            "SELECT mode FROM events WHERE kind = 'compile' AND mode IS NOT NULL"
        )
        return sorted(r[0] for r in rows)

    def watermark(self) -> tuple[int, int, int]:
        """A value that changes whenever something new is recorded (for following a live run):
        the last event id, the last op-execution id and the op executions counted so far."""
        row = self._rows(
            "SELECT (SELECT coalesce(max(id), 0) FROM events), (SELECT coalesce(max(id), 0) FROM executions), "
            "(SELECT coalesce(sum(count), 0) FROM op_stats)"
        )[0]
        return (int(row[0]), int(row[1]), int(row[2]))

    def internal_errors(self) -> list[InternalErrorEvent]:
        """Tracer failures recorded during the run (the first ones of each ``where``; see
        :meth:`capped_counts` for how many there were in all)."""
        return self.events(InternalErrorEvent.kind)  # type: ignore[return-value]

    # -- the run's summaries (one each, written as the run ends) ---------------------------

    def process(self) -> ProcessEvent | None:
        """This run's rank in a multi-process run, or None for a single-process run."""
        return self._summary(ProcessEvent)

    def tensorboard_summary(self) -> TensorBoardSummaryEvent | None:
        """What the TensorBoard export captured, or None when the run was recorded without it."""
        return self._summary(TensorBoardSummaryEvent)

    def dry_run_summary(self) -> DryRunSummaryEvent | None:
        """How the dry run went (its target, programs compiled), or None for a run that executed."""
        return self._summary(DryRunSummaryEvent)

    def collectives_target(self) -> CollectivesTargetEvent | None:
        """How the collectives' target compiles ended, or None without a target."""
        return self._summary(CollectivesTargetEvent)
