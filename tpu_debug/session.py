"""``Session``: one run, live (while ``trace()`` records) or reopened from disk."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_debug.core.options import default_logdir
from tpu_debug.report import print_report
from tpu_debug.report.findings import advice_of
from tpu_debug.runs import resolve_run
from tpu_debug.tracers.advisor import Finding
from tpu_debug.tracers.reading import RunQuery

__all__ = ["Session", "open_run"]


class Session(RunQuery):
    """Queries over one run: ops, programs, compiles, recompiles, transfers, divergences,
    steps, events, findings, and the report (``summary()``).

    Each subject is a part (``tracers/reading/``): calling it lists the subject's records
    (``session.ops()``, ``session.compiles()``, ``session.recompiles()``,
    ``session.transfers()``, ``session.divergences()``, ``session.programs()``,
    ``session.steps()``), its methods answer the subject's other questions
    (``session.recompiles.groups()``, ``session.divergences.first()``,
    ``session.programs.hlo(op)``, ``session.transfers.call_sites()``). ``events(kind)``,
    ``metadata()``, ``counts()`` and ``findings()`` are the run's own.

    A live session (the one ``trace()`` yields) flushes the recorder before
    each query (``flush``: the trace hands its writer's), so it sees everything recorded so
    far. After the trace ends it reads the finished run. A session only reads: the report
    renders it (``summary()`` is ``tpu_debug.report``'s text of it) and the advisor judges it
    (``findings()``).

    Example::

        with tpu_debug.trace() as session:
            y = torch.ones(3, device="tpu") * 2
        session.ops()[0].name
        # 'mul.Tensor'
        print(session.programs.hlo("aten::mul.Tensor"))
    """

    def __init__(self, db_path: Path, *, flush: Callable[[], object] | None = None) -> None:
        super().__init__(db_path)
        self._flush = flush
        self._exit_status: int | None = None
        self._exit_error: str | None = None

    @property
    def live(self) -> bool:
        """True while the trace that owns this session is recording."""
        return self._flush is not None

    def _sync(self) -> None:
        if self._flush is not None:
            self._flush()

    def _detach(self) -> None:
        self._flush = None

    def mark_exit(self, status: int, error: str | None = None) -> None:
        """Record the traced program's exit status and the error that ended it, if any
        (``tpu-debug run`` does this; the run's metadata keeps both)."""
        self._exit_status = int(status)
        self._exit_error = error

    def findings(self) -> list[Finding]:
        """What the advisor finds in the run (``tracers.advisor.Finding``), the most costly
        first; an empty list is a run with nothing to fix."""
        return list(advice_of(self).findings)

    def summary(self, *, width: int = 100) -> str:
        """The run's report as plain text (what ``tpu-debug report`` prints)."""

        buf = io.StringIO()
        print_report(self, file=buf, width=width, terminal=False)
        return buf.getvalue()

    def print_summary(self, file: Any = None) -> None:
        """Print the report: rich when ``file`` (default stdout) is a terminal, plain text otherwise."""

        print_report(self, file=file)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({str(self.run_dir)!r}{', live' if self.live else ''})"


def open_run(run: str | os.PathLike | None = None, *, logdir: str | os.PathLike | None = None) -> Session:
    """Open a recorded run for queries.

    Args:
        run: a run directory, its run.db, a run directory name or run name in
            ``logdir``; ``None`` for the latest run.
        logdir: where runs are (default: ``TPU_DEBUG_LOGDIR`` or ``./tpu_debug_runs``).

    Returns:
        A :class:`Session` over the run.

    Raises:
        RunNotFoundError: no such run.
        RunDamagedError: the database is damaged or not a run.
        SchemaVersionError: the run was written by a tpu_debug with another store layout.

    Example::

        session = tpu_debug.open_run()          # the latest run
        session.metadata().platform
        # 'cpu'
    """
    root = Path(logdir) if logdir is not None else default_logdir()
    session = Session(resolve_run(run, root))
    _ = session.connection  # validate now: a bad run fails here, not at the first query
    return session
