"""``RunView``: one recorded run as every reader sees it.

The report's sections, the TUI's views, ``diff``, the advisor's rules and the analyses of
this package take a run through this protocol, never ``Any``: the queries by subject
(one part each, :mod:`tpu_debug.tracers.reading`), the events by kind, the run's metadata
and its summaries. :class:`~tpu_debug.tracers.reading.run_query.RunQuery` is one (and so is
:class:`~tpu_debug.Session`, a ``RunQuery`` of a run that may still be recording); a test
may hand a reader anything else that has these members. It sits below the readers and
the run objects alike, so neither imports the other to name the type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from tpu_debug.tracers.events import (
    CollectivesTargetEvent,
    DryRunSummaryEvent,
    Event,
    InternalErrorEvent,
    ProcessEvent,
    TensorBoardSummaryEvent,
)
from tpu_debug.tracers.reading.compiles_query import CompilesQuery
from tpu_debug.tracers.reading.divergences_query import DivergencesQuery
from tpu_debug.tracers.reading.invalid_values_query import InvalidValuesQuery
from tpu_debug.tracers.reading.memory_query import MemoryQuery
from tpu_debug.tracers.reading.ops_query import OpsQuery
from tpu_debug.tracers.reading.programs_query import ProgramsQuery
from tpu_debug.tracers.reading.reader import DamagedRow, RunMetadata
from tpu_debug.tracers.reading.recompiles_query import RecompilesQuery
from tpu_debug.tracers.reading.steps_query import StepsQuery
from tpu_debug.tracers.reading.transfers_query import TransfersQuery

__all__ = ["RunView"]


@runtime_checkable
class RunView(Protocol):
    """One recorded run, read-only: what a reader may ask of it."""

    db_path: Path
    ops: OpsQuery
    programs: ProgramsQuery
    compiles: CompilesQuery
    recompiles: RecompilesQuery
    transfers: TransfersQuery
    divergences: DivergencesQuery
    steps: StepsQuery
    invalid_values: InvalidValuesQuery
    memory: MemoryQuery

    @property
    def run_dir(self) -> Path:
        """The run's directory."""

    def events(
        self,
        kind: str | None = None,
        *,
        name: str | None = None,
        start: float | None = None,
        end: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Event]:
        """Events in id order, of one kind, name and time window."""

    def records(self, kind: str) -> bool:
        """Whether the run can hold events of ``kind`` (its table exists)."""

    def metadata(self) -> RunMetadata:
        """The run's metadata: its name, status, platform, versions, options."""

    def counts(self) -> dict[str, int]:
        """Events per kind."""

    def capped_counts(self, kind: str) -> dict[str, int]:
        """Per value of a capped kind, how many events there were in all."""

    def modes(self) -> list[str]:
        """The execution modes seen in the run."""

    def watermark(self) -> tuple[int, int, int]:
        """A value that changes whenever something new is recorded."""

    def internal_errors(self) -> list[InternalErrorEvent]:
        """Tracer failures recorded during the run."""

    def damaged_rows(self) -> list[DamagedRow]:
        """Events read so far whose rows did not decode."""

    def process(self) -> ProcessEvent | None:
        """This run's rank in a multi-process run."""

    def tensorboard_summary(self) -> TensorBoardSummaryEvent | None:
        """What the TensorBoard export captured."""

    def dry_run_summary(self) -> DryRunSummaryEvent | None:
        """How the dry run went."""

    def collectives_target(self) -> CollectivesTargetEvent | None:
        """How the collectives' target compiles ended."""

    def close(self) -> None:
        """Close the run's connection."""
