"""Reading a run: typed queries over its database (what the report, TUI and users call).

Every query is a plain SQL statement over indexed columns; results come back
as the event dataclasses of :mod:`.events` or the summary records below.
A damaged file surfaces as :class:`~tpu_debug.core.errors.RunDamagedError`, never
as an ``sqlite3`` traceback; an event whose row does not decode is left out and named
by :meth:`RunQuery.damaged_rows`, so one bad value costs that event, not the run.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_debug.tracers.events import (
    EVENT_TYPES,
    CollectivesTargetEvent,
    CompileEvent,
    DivergenceEvent,
    DivergenceSite,
    DivergenceSummaryEvent,
    DryRunSummaryEvent,
    Event,
    FallbackEvent,
    GraphBreakEvent,
    GuardFailureEvent,
    InternalErrorEvent,
    ProcessEvent,
    RecompileLimitEvent,
    SourceLocation,
    TensorBoardSummaryEvent,
    TransferEvent,
    UncomparedOp,
    event_type,
)
from tpu_debug.tracers.hlo import ProgramNode, instruction_lines
from tpu_debug.tracers.liveness import writer_alive
from tpu_debug.tracers.store import (
    META_CAPPED,
    META_DROPPED,
    META_RECORDING_ERROR,
    KindLayout,
    connect,
    layout,
)

from tpu_debug.core.errors import NotRecordedError, RunDamagedError

if TYPE_CHECKING:  # the advisor reads runs through this module: imported when findings are asked for
    from tpu_debug.tracers.advisor.findings import Finding

__all__ = [
    "RunQuery",
    "RunMetadata",
    "OpSummary",
    "ProgramSummary",
    "ProgramText",
    "TransferSite",
    "CompileGroup",
    "DamagedRow",
    "op_name_of",
]


@dataclasses.dataclass(frozen=True, slots=True)
class DamagedRow:
    """A recorded event whose row does not decode (a value cut or overwritten in run.db):
    readers leave that event out and go on with the rest of the run."""

    kind: str
    table: str
    event_id: int
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class RunMetadata:
    """What the run store records about the run itself."""

    name: str
    schema_version: int
    tpu_debug_version: str
    torch_version: str
    jax_version: str
    jaxlib_version: str
    python_version: str
    platform: str
    device_kind: str
    device_count: int
    argv: tuple[str, ...]
    command: tuple[str, ...]
    cwd: str
    hostname: str
    pid: int
    start_time: str
    end_time: str | None
    duration: float | None
    # "running" | "finished" | "failed" | "interrupted" (SIGINT, KeyboardInterrupt) |
    # "terminated" (SIGTERM) | "killed" (the process ended without closing the run)
    status: str
    exit_status: int | None
    error: str | None
    options: dict[str, Any]
    # why recording stopped early (the disk filled, say), and events never written
    recording_error: str | None = None
    dropped_events: int = 0
    # the log a run was imported from (``tpu-debug import-trace``): such a run holds what the
    # log records (compiles, guards, graph breaks), no op executions, transfers or platform
    imported_from: str | None = None
    # time.perf_counter() at the run's time 0: on one machine (CLOCK_MONOTONIC), it puts the
    # ``ts`` of runs of several processes on one clock; None in runs recorded without it
    clock_origin: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class OpSummary:
    """One op (or compiled graph) in one mode: executions, time, compiles."""

    name: str
    mode: str
    count: int
    seconds: float
    compiles: int
    compile_seconds: float
    programs: int
    read_back: int = 0  # executables read back from the persistent compile cache (not compiles)
    saved_seconds: float = 0.0  # the compile time those read-backs saved

    @property
    def mean_seconds(self) -> float:
        return self.seconds / self.count if self.count else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramSummary:
    """One distinct program (HLO stored once): what it is, how often it ran, its compiles."""

    id: int
    hash: str
    mode: str
    name: str
    signature: str
    instructions: int
    count: int
    seconds: float
    compiles: int
    compile_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramText:
    """A program's texts: StableHLO as lowered, HLO as XLA optimized it."""

    id: int
    hash: str
    mode: str
    name: str
    stablehlo: str
    hlo: str


@dataclasses.dataclass(frozen=True, slots=True)
class CompileGroup:
    """The compiles of one op or graph in one mode (the TUI's recompiles view).

    ``identity`` is what was compiled again (the op, or the function dynamo
    compiled and its direction); ``names`` counts the distinct program names
    under it (a graph recompiled by dynamo gets a new name each time).
    ``compiles``, ``recompiles`` and ``seconds`` count what XLA compiled;
    ``read_backs`` the executables read back from the persistent compile cache
    instead (none of them a compile or a recompile).
    """

    identity: str
    mode: str
    compiles: int
    recompiles: int
    seconds: float
    names: int
    read_backs: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TransferSite:
    """Transfers from one source line with one direction, cause and kind, added up.

    ``timeline`` counts them per time bucket between the run's first and last
    transfer (empty unless asked for, see :meth:`RunQuery.transfer_sites`).
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


def op_name_of(target: Any) -> str:
    """``aten.mul.Tensor``, ``aten::mul.Tensor``, ``torch.ops.aten.mul.Tensor`` -> ``mul.Tensor``."""
    text = str(target)
    for prefix in ("aten::", "aten."):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


_STATUS_RUNNING = "running"

# the schema from which the run summaries are events; before it, JSON objects in
# ``meta`` under these keys, with the same fields (but for the divergence summary's)
_SUMMARIES_AS_EVENTS = 7
_LEGACY_SUMMARY_KEYS: dict[type[Event], str] = {
    DivergenceSummaryEvent: "divergence",
    TensorBoardSummaryEvent: "tensorboard",
    DryRunSummaryEvent: "dry_run",
    ProcessEvent: "distributed",
    CollectivesTargetEvent: "collectives_target",
}


def _from_legacy(cls: type[Event], value: dict[str, Any]) -> Event:
    """A summary event from the JSON object a schema 6 run kept in ``meta``."""
    if cls is DivergenceSummaryEvent:
        over = value.get("over_tolerance") or {}
        value = {
            **value,
            "over_local": over.get("local", 0),
            "over_drift": over.get("drift", 0),
            "not_compared": tuple(UncomparedOp(op, why) for op, why in sorted(value["not_compared"].items())),
            "sites": tuple(DivergenceSite(**site) for site in value["sites"]),
        }
    names = {f.name for f in dataclasses.fields(cls)[5:]}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items() if k in names}
    return cls(0, 0.0, None, 0, None, **fields)


_DAMAGED = (
    "{path}: not a readable tpu_debug run ({detail}). The file is damaged or truncated; re-record the run."
)


class RunQuery:
    """Queries over one run's database (read-only).

    Example::

        q = RunQuery(Path("tpu_debug_runs/20260101T000000.000Z-train/run.db"))
        [(o.name, o.count) for o in q.ops()][:3]
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        self._conn: sqlite3.Connection | None = None
        self._tables: frozenset[str] | None = None
        self._version: int | None = None
        self._table_columns: dict[str, frozenset[str]] = {}
        self._damaged_rows: dict[tuple[str, int], DamagedRow] = {}

    # -- plumbing -------------------------------------------------------------------

    def _sync(self) -> None:
        """Hook for live sessions: make everything recorded so far visible."""

    @property
    def connection(self) -> sqlite3.Connection:
        """The read-only SQLite connection (opened on first use)."""
        if self._conn is None:
            self._conn = connect(self.db_path)
        return self._conn

    def _rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        self._sync()
        try:
            return self.connection.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise RunDamagedError(_DAMAGED.format(path=self.db_path, detail=exc)) from None

    def _damaged(self, exc: Exception) -> RunDamagedError:
        """A value that does not decode (JSON cut in the middle, a wrong type): the file was damaged."""
        return RunDamagedError(_DAMAGED.format(path=self.db_path, detail=f"{type(exc).__name__}: {exc}"))

    def records(self, kind: str) -> bool:
        """Whether this run could record events of ``kind``: a run recorded by a version before
        the kind existed has no place for them, so their absence there says nothing."""
        cls = EVENT_TYPES.get(kind)
        stored = getattr(cls, "stored", None)
        return stored is not None and self._has_table(stored.table)

    def _has_table(self, name: str) -> bool:
        # a run lacks the tables of event kinds registered after it was recorded
        if self._tables is None:
            rows = self._rows("SELECT name FROM sqlite_master WHERE type = 'table'")
            self._tables = frozenset(r[0] for r in rows)
        return name in self._tables

    def close(self) -> None:
        """Close the database connection (queries reopen it)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._tables = None
            self._version = None
            self._table_columns = {}

    # -- the run --------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        try:
            return {k: json.loads(v) for k, v in self._rows("SELECT key, value FROM meta")}
        except ValueError as exc:
            raise self._damaged(exc) from None

    def metadata(self) -> RunMetadata:
        """The run's metadata; ``status`` says ``"killed"`` for a run whose
        process ended without closing it (SIGKILL, a crash of the interpreter)."""
        raw = self._meta()
        if raw.get("status", _STATUS_RUNNING) == _STATUS_RUNNING and not writer_alive(
            self.db_path, pid=raw.get("pid"), hostname=raw.get("hostname")
        ):
            # the writer commits how the run ended before it lets go of its lock: read again
            raw = self._meta()
            if raw.get("status", _STATUS_RUNNING) == _STATUS_RUNNING:
                raw["status"] = "killed"
        status = raw.get("status", _STATUS_RUNNING)
        return RunMetadata(
            name=raw.get("name", ""),
            schema_version=int(raw.get("schema_version", 0)),
            tpu_debug_version=raw.get("tpu_debug_version", ""),
            torch_version=raw.get("torch_version", ""),
            jax_version=raw.get("jax_version", ""),
            jaxlib_version=raw.get("jaxlib_version", ""),
            python_version=raw.get("python_version", ""),
            platform=raw.get("platform", ""),
            device_kind=raw.get("device_kind", ""),
            device_count=int(raw.get("device_count", 0)),
            argv=tuple(raw.get("argv", ())),
            command=tuple(raw.get("command", ())),
            cwd=raw.get("cwd", ""),
            hostname=raw.get("hostname", ""),
            pid=int(raw.get("pid", 0)),
            start_time=raw.get("start_time", ""),
            end_time=raw.get("end_time"),
            duration=raw.get("duration"),
            status=status,
            exit_status=raw.get("exit_status"),
            error=raw.get("error"),
            options=dict(raw.get("options", {})),
            recording_error=raw.get(META_RECORDING_ERROR),
            dropped_events=int(raw.get(META_DROPPED) or 0),
            imported_from=raw.get("imported_from"),
            clock_origin=raw.get("clock_origin"),
        )

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

    def counts(self) -> dict[str, int]:
        """Number of events per kind (kinds with none are left out). Op executions count
        as ``"op"`` events only when per-execution events were recorded."""
        counts = dict(self._rows("SELECT kind, count(*) FROM events GROUP BY kind"))
        executions = self._rows("SELECT count(*) FROM executions")[0][0]
        if executions:
            counts["op"] = executions
        return dict(sorted(counts.items()))

    def modes(self) -> list[str]:
        """The execution modes seen in the run (``"eager"``, ``"compiled"``)."""
        rows = self._rows(
            "SELECT mode FROM op_stats UNION "
            "SELECT mode FROM events WHERE kind = 'compile' AND mode IS NOT NULL"
        )
        return sorted(r[0] for r in rows)

    # -- aggregates -----------------------------------------------------------------

    def ops(
        self, *, mode: str | None = None, name: str | None = None, limit: int | None = None
    ) -> list[OpSummary]:
        """Per op and mode: executions, total time, compiles; heaviest first.

        Args:
            mode: only this mode (``"eager"`` / ``"compiled"``).
            name: only this op (``"mul.Tensor"``; ``aten::``/``aten.`` prefixes are ignored).
            limit: at most this many rows.
        """
        where, params = self._filters(mode=mode, name=op_name_of(name) if name else None)
        stats = self._rows(
            f"SELECT mode, name, sum(count), sum(seconds), count(DISTINCT program_id) FROM op_stats {where} "
            "GROUP BY mode, name",
            params,
        )
        cwhere, cparams = self._filters(
            mode=mode, name=op_name_of(name) if name else None, kind="compile", prefix="e."
        )
        compiles = {
            (m, n): (c, s, r, saved)
            for m, n, c, s, r, saved in self._rows(
                "SELECT e.mode, e.name, sum(NOT c.from_cache), sum(CASE WHEN c.from_cache THEN 0 ELSE e.seconds END), "
                f"sum(c.from_cache), sum(c.saved_seconds) FROM events e JOIN compiles c ON c.event_id = e.id {cwhere} "
                "GROUP BY e.mode, e.name",
                cparams,
            )
        }
        out = []
        seen = set()
        for m, n, count, seconds, programs in stats:
            c, cs, r, saved = compiles.get((m, n), (0, 0.0, 0, 0.0))
            out.append(OpSummary(n, m, count, seconds, c, cs, programs, r, saved))
            seen.add((m, n))
        for (m, n), (c, cs, r, saved) in compiles.items():
            if (m, n) not in seen:
                out.append(OpSummary(n, m, 0, 0.0, c, cs, 0, r, saved))
        out.sort(key=lambda o: (-o.seconds, -o.count, o.name))
        return out[:limit] if limit is not None else out

    def programs(
        self, *, mode: str | None = None, name: str | None = None, limit: int | None = None
    ) -> list[ProgramSummary]:
        """Distinct programs with their executions and compiles; most total execution time first."""
        where, params = self._filters(mode=mode, name=op_name_of(name) if name else None, prefix="p.")
        rows = self._rows(
            "SELECT p.id, p.hash, p.mode, p.name, p.instructions, "
            "coalesce(s.n, 0), coalesce(s.t, 0.0), coalesce(c.n, 0), coalesce(c.t, 0.0), c.sig "
            "FROM programs p "
            "LEFT JOIN (SELECT program_id, sum(count) AS n, sum(seconds) AS t "
            "  FROM op_stats GROUP BY program_id) s "
            "  ON s.program_id = p.id "
            "LEFT JOIN (SELECT e.program_id, count(*) AS n, sum(e.seconds) AS t, min(cc.signature) AS sig "
            "  FROM events e JOIN compiles cc ON cc.event_id = e.id WHERE e.kind = 'compile' "
            "  GROUP BY e.program_id) c ON c.program_id = p.id "
            f"{where} ORDER BY 7 DESC, 9 DESC, p.id",
            params,
        )
        out = [
            ProgramSummary(pid, h, m, n, sig or n, ins, cnt, secs, comp, csecs)
            for pid, h, m, n, ins, cnt, secs, comp, csecs, sig in rows
        ]
        return out[:limit] if limit is not None else out

    # -- events ---------------------------------------------------------------------

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
        """Events in id order, optionally of one kind, one name and a time window [start, end).

        Raises:
            ValueError: ``kind`` is not an event kind.
        """
        kinds = [kind] if kind is not None else list(EVENT_TYPES)
        if kind is not None:
            event_type(kind)
        per_kind = [
            self._events_of(k, name, start, end, limit + offset if limit is not None else None) for k in kinds
        ]
        merged: Iterator[Event] = (
            heapq.merge(*per_kind, key=lambda e: e.id) if len(per_kind) > 1 else iter(per_kind[0])
        )
        out = []
        for i, ev in enumerate(merged):
            if i < offset:
                continue
            if limit is not None and len(out) >= limit:
                break
            out.append(ev)
        return out

    def compiles(self, *, mode: str | None = None, name: str | None = None) -> list[CompileEvent]:
        """Compile events, oldest first (``name``: an op like ``"mul.Tensor"`` or a graph id)."""
        out = self.events("compile", name=op_name_of(name) if name else None)
        return out if mode is None else [e for e in out if e.mode == mode]

    def transfers(self, *, direction: str | None = None, op: str | None = None) -> list[TransferEvent]:
        """Host <-> device transfers, oldest first."""
        out = self.events("transfer", name=op)
        if direction is not None:
            out = [t for t in out if t.direction == direction]
        return out

    def fallbacks(self) -> list[FallbackEvent]:
        """Ops that ran on CPU for lack of a lowering."""
        return self.events("fallback")

    def internal_errors(self) -> list[InternalErrorEvent]:
        """Tracer failures recorded during the run (the first ones of each ``where``; see
        :meth:`capped_counts` for how many there were in all)."""
        return self.events("internal_error")

    # -- recompiles and transfers -------------------------------------------------------

    def recompiles(self, *, mode: str | None = None, name: str | None = None) -> list[CompileEvent]:
        """Compiles that were recompiles (they carry the diffs against the closest earlier key).
        An executable read back from the persistent compile cache is none: XLA compiled nothing."""
        return [c for c in self.compiles(mode=mode, name=name) if c.diffs and not c.from_cache]

    def recompile_groups(self, *, storm_threshold: int | None = None) -> list[Any]:
        """The run's compiles grouped by op or graph, most recompiled first, with what kept
        changing, storms and advice (``tracers.recompiles.RecompileGroup``).

        Args:
            storm_threshold: more recompiles than this make a storm (default: the run's
                ``storm_threshold`` option).
        """
        from tpu_debug.tracers.recompiles import DEFAULT_STORM_THRESHOLD, summarize

        if storm_threshold is None:
            storm_threshold = int(self.metadata().options.get("storm_threshold", DEFAULT_STORM_THRESHOLD))
        return summarize(self.compiles(), storm_threshold=storm_threshold)

    def graph_breaks(self) -> list[GraphBreakEvent]:
        """Where dynamo split compiled functions, and why."""
        return self.events("graph_break")

    def guard_failures(self) -> list[GuardFailureEvent]:
        """Dynamo recompiles: the failed guard of each cached graph, per new compile."""
        return self.events("guard_failure")

    def recompile_limits(self) -> list[RecompileLimitEvent]:
        """Functions that hit dynamo's recompile limit."""
        return self.events("recompile_limit")

    def transfer_call_sites(self) -> list[Any]:
        """Transfers by source line, direction and cause: implicit first, then loops, then the
        most frequent (``tracers.transfers.CallSite``; ``loop`` marks a line that synced often)."""
        from tpu_debug.tracers.transfers import call_sites

        return call_sites(self.transfers())

    # -- divergence ---------------------------------------------------------------------

    def divergences(
        self, *, measure: str | None = None, mode: str | None = None, over: bool | None = None
    ) -> list[DivergenceEvent]:
        """Divergence events in the order they happened.

        Args:
            measure: only ``"local"`` or ``"drift"``.
            mode: only ``"eager"`` or ``"compiled"``.
            over: only events over tolerance (True) or within it (False: NaN/Inf
                origins and dtype mismatches within tolerance).
        """
        out = self.events("divergence")
        return [
            e
            for e in out
            if (measure is None or e.measure == measure)
            and (mode is None or e.mode == mode)
            and (over is None or e.over == over)
        ]

    def first_divergence(self, measure: str = "local", *, mode: str | None = None) -> DivergenceEvent | None:
        """The first op or node over tolerance (``measure="local"``: the one that introduced
        the error), or None when everything compared was within tolerance."""
        for e in self.divergences(measure=measure, mode=mode):
            if e.first:
                return e
        return None

    def nan_origin(self) -> DivergenceEvent | None:
        """The first op or node whose device output held NaN/Inf its inputs did not."""
        return next((e for e in self.divergences() if e.nan_origin), None)

    def divergence_summary(self) -> DivergenceSummaryEvent | None:
        """What the divergence tracer compared (ops compared, occurrences per site...),
        or None when divergence was not checked in this run."""
        return self._summary(DivergenceSummaryEvent)

    # -- the run's summaries --------------------------------------------------------

    def _summary(self, cls: type[Event]) -> Any:
        """The last event of a kind recorded once per run (or once per state, the last
        being the run's), or None when the run has none."""
        if self._schema() < _SUMMARIES_AS_EVENTS:
            return self._legacy_summary(cls)
        lay = layout(cls)
        if not self._recorded(lay):
            return None
        rows = self._rows(self._select(lay) + " ORDER BY e.id DESC LIMIT 1")
        return self._decode(lay, rows)[0] if rows else None

    def _schema(self) -> int:
        if self._version is None:
            self._version = int(self._rows("PRAGMA user_version")[0][0])
        return self._version

    def _legacy_summary(self, cls: type[Event]) -> Any:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (_LEGACY_SUMMARY_KEYS[cls],))
        if not rows:
            return None
        try:
            return _from_legacy(cls, json.loads(rows[0][0]))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise self._damaged(exc) from None

    def tensorboard_summary(self) -> TensorBoardSummaryEvent | None:
        """What the TensorBoard export captured, or None when the run was recorded without it."""
        return self._summary(TensorBoardSummaryEvent)

    def dry_run_summary(self) -> DryRunSummaryEvent | None:
        """How the dry run went (its target, programs compiled), or None for a run that executed."""
        return self._summary(DryRunSummaryEvent)

    def process(self) -> ProcessEvent | None:
        """This run's rank in a multi-process run, or None for a single-process run."""
        return self._summary(ProcessEvent)

    def collectives_target(self) -> CollectivesTargetEvent | None:
        """How the collectives' target compiles ended, or None without a target."""
        return self._summary(CollectivesTargetEvent)

    def _events_of(
        self, kind: str, name: str | None, start: float | None, end: float | None, limit: int | None
    ) -> list[Event]:
        lay = layout(event_type(kind))
        if not self._recorded(lay):
            return []
        sql, params = self._select(lay), []
        if name is not None:
            sql += " AND e.name = ?"
            params.append(name)
        if start is not None:
            sql += " AND e.ts >= ?"
            params.append(start)
        if end is not None:
            sql += " AND e.ts < ?"
            params.append(end)
        sql += " ORDER BY e.id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._decode(lay, self._rows(sql, tuple(params)))

    def _select(self, lay: KindLayout) -> str:
        return lay.select_sql(self._columns_of(lay.table) if lay.table is not None else None)

    def _columns_of(self, table: str) -> frozenset[str]:
        """The columns ``table`` has in this run (one recorded before a field was added lacks it)."""
        cols = self._table_columns.get(table)
        if cols is None:
            cols = frozenset(r[1] for r in self._rows(f"PRAGMA table_info({table})"))
            self._table_columns[table] = cols
        return cols

    def _recorded(self, lay: KindLayout) -> bool:
        """The run has the kind's detail table (a kind registered after the run was recorded has
        none). A child table may be missing: a field added since reads as its default."""
        return lay.table is None or self._has_table(lay.table)

    def _decode(self, lay: KindLayout, rows: list[tuple]) -> list[Event]:
        """Events from :meth:`KindLayout.select_sql` rows, with their child records."""
        children: dict[str, dict[int, list]] = {}
        if lay.children and rows:
            ids = [r[0] for r in rows]
            for child in lay.children:
                by_event: dict[int, list] = children.setdefault(child.field, {})
                if not self._has_table(child.table):
                    continue
                sql = lay.child_select_sql(child, self._columns_of(child.table))
                if len(ids) > 2000:  # most of the run's: one pass over the table beats many lookups
                    wanted = set(ids)
                    found = [r for r in self._rows(sql + " ORDER BY event_id, position") if r[0] in wanted]
                else:
                    found = []
                    for i in range(0, len(ids), 500):
                        chunk = ids[i : i + 500]
                        marks = ",".join("?" * len(chunk))
                        found += self._rows(
                            f"{sql} WHERE event_id IN ({marks}) ORDER BY event_id, position", tuple(chunk)
                        )
                for row in found:
                    try:
                        by_event.setdefault(row[0], []).append(child.decode(row[1:]))
                    except (ValueError, TypeError) as exc:
                        self._note_damage(lay, child.table, row[0], exc)
        events = []
        for row in rows:
            if (lay.kind, row[0]) in self._damaged_rows:
                continue
            try:
                events.append(lay.decode(row, self._location(*row[4:7]), children))
            except (ValueError, TypeError) as exc:
                self._note_damage(lay, lay.table or "events", row[0], exc)
        return events

    def _note_damage(self, lay: KindLayout, table: str, event_id: int, exc: Exception) -> None:
        # one value that does not decode costs its event, not the run: the event is left out
        # and named by damaged_rows(), so every reader shows the rest
        key = (lay.kind, event_id)
        if key not in self._damaged_rows:
            self._damaged_rows[key] = DamagedRow(lay.kind, table, event_id, f"{type(exc).__name__}: {exc}")

    def damaged_rows(self) -> list[DamagedRow]:
        """The events read so far whose rows do not decode, and were left out, in id order.

        Example::

            q.events("compile"); [(d.table, d.event_id) for d in q.damaged_rows()]
            # [('compiles', 12)]
        """
        return sorted(self._damaged_rows.values(), key=lambda d: (d.event_id, d.kind))

    def _location(self, file, line, function) -> SourceLocation | None:
        if file is None:
            return None
        return SourceLocation(file, line, function)

    # -- HLO ------------------------------------------------------------------------

    def program(self, program: int | str) -> ProgramText:
        """A program's texts, by id or content hash.

        Raises:
            NotRecordedError: no such program in this run.
        """
        col = "id" if isinstance(program, int) else "hash"
        rows = self._rows(
            f"SELECT id, hash, mode, name, stablehlo, hlo FROM programs WHERE {col} = ?", (program,)
        )
        if not rows:
            raise NotRecordedError(f"{self.db_path}: no program {program!r} in this run")
        return ProgramText(*rows[0])

    def fx_nodes(self, program: int | str) -> list[ProgramNode]:
        """The FX nodes of a compiled program, with their source lines."""
        pid = self.program(program).id
        rows = self._rows(
            "SELECT n.node, n.target, l.file, l.line, l.function FROM fx_nodes n "
            "LEFT JOIN locations l ON l.id = n.location_id WHERE n.program_id = ? ORDER BY n.position",
            (pid,),
        )
        return [ProgramNode(node, target, self._location(f, ln, fn)) for node, target, f, ln, fn in rows]

    def node_instructions(self, program: int | str, node: str) -> list[str]:
        """Names of the optimized-HLO instructions that came from FX node ``node``."""
        pid = self.program(program).id
        rows = self._rows(
            "SELECT instruction FROM node_instructions WHERE program_id = ? AND node = ?", (pid, node)
        )
        return [r[0] for r in rows]

    def hlo(self, target: Any, *, stage: str = "hlo", graph: str | None = None) -> str:
        """The HLO of an op, an FX node, a compiled graph or a program.

        Args:
            target: an aten op (``torch.ops.aten.mul.Tensor``, ``"aten::mul.Tensor"``,
                ``"mul.Tensor"``; an overload packet or ``"mul"`` matches every
                overload), an FX node name, a compiled graph id, or a program
                id/content hash. An op with several programs (one per input
                signature) gives its most-executed one; pass a program id from
                ``programs(name=...)`` for another.
            stage: ``"hlo"`` (optimized by XLA) or ``"stablehlo"`` (as lowered).
                For an FX node, only ``"hlo"``: the node's instructions.
            graph: restrict an FX node lookup to this compiled graph.

        Returns:
            The text.

        Raises:
            NotRecordedError: nothing in the run matches ``target`` (or HLO recording was off).
            ValueError: ``stage`` is not ``"hlo"`` or ``"stablehlo"``.
        """
        if stage not in ("hlo", "stablehlo"):
            raise ValueError(f"stage={stage!r}; use 'hlo' (optimized) or 'stablehlo'")
        if isinstance(target, int) or (isinstance(target, str) and len(target) == 64 and _is_hex(target)):
            text = self.program(target)
            return text.hlo if stage == "hlo" else text.stablehlo
        name = op_name_of(target)
        candidates = [p for p in self.programs() if p.name == name] or [
            p for p in self.programs() if p.mode == "eager" and p.name.split(".")[0] == name
        ]
        if graph is None and candidates:
            text = self.program(candidates[0].id)
            return text.hlo if stage == "hlo" else text.stablehlo
        where = "WHERE n.node = ?" + (" AND p.name = ?" if graph is not None else "")
        params = (name,) + ((graph,) if graph is not None else ())
        rows = self._rows(
            f"SELECT p.id FROM fx_nodes n JOIN programs p ON p.id = n.program_id {where} "
            "ORDER BY p.id DESC LIMIT 1",
            params,
        )
        if rows:
            pid = rows[0][0]
            return instruction_lines(self.program(pid).hlo, self.node_instructions(pid, name))
        known = sorted({p.name for p in self.programs()})
        hint = (
            f" Programs recorded: {', '.join(known[:8])}{', ...' if len(known) > 8 else ''}."
            if known
            else (" This run recorded no HLO (it was traced with hlo=False, or ran no ops).")
        )
        raise NotRecordedError(
            f"{self.db_path}: no HLO recorded for {name!r}: it names no op, FX node, graph or program of "
            f"this run.{hint}"
        )

    # -- paged and grouped views (the TUI) ------------------------------------------------

    def watermark(self) -> tuple[int, int, int]:
        """A value that changes whenever something new is recorded (for following a live run):
        the last event id, the last op-execution id and the op executions counted so far."""
        row = self._rows(
            "SELECT (SELECT coalesce(max(id), 0) FROM events), (SELECT coalesce(max(id), 0) FROM executions), "
            "(SELECT coalesce(sum(count), 0) FROM op_stats)"
        )[0]
        return (int(row[0]), int(row[1]), int(row[2]))

    def counts_by_name(self, kind: str) -> dict[str, tuple[int, float]]:
        """Events of one kind per name: (count, total seconds), e.g. fallbacks per op.

        Raises:
            ValueError: ``kind`` is not an event kind.
        """
        event_type(kind)
        rows = self._rows(
            "SELECT name, count(*), total(seconds) FROM events WHERE kind = ? GROUP BY name", (kind,)
        )
        return {name: (n, s) for name, n, s in rows}

    def float64_ops(self) -> dict[str, tuple[int, int]]:
        """Ops and graphs compiled with float64 or complex128 values: per name,
        (programs compiled, executions). It runs here; a TPU has no float64, so on a TPU
        each of these would fail or need a float32 rewrite."""
        wide = "(signature LIKE '%float64%' OR signature LIKE '%complex128%')"
        compiled = self._rows(
            "SELECT e.name, count(*) FROM events e JOIN compiles c ON c.event_id = e.id "
            f"WHERE e.kind = 'compile' AND {wide.replace('signature', 'c.signature')} GROUP BY e.name"
        )
        runs = dict(self._rows(f"SELECT name, sum(count) FROM op_stats WHERE {wide} GROUP BY name"))
        return {name: (n, int(runs.get(name) or 0)) for name, n in compiled}

    def compile_groups(self) -> list[CompileGroup]:
        """Compiles per op or graph (per identity, see :class:`CompileGroup`): most compiled
        first, then the most compile time."""
        rows = self._rows(
            "SELECT e.mode, coalesce(c.identity, e.name), total(NOT c.from_cache), "
            "total(CASE WHEN c.from_cache THEN 0 ELSE e.seconds END), "
            "total(NOT c.from_cache AND EXISTS (SELECT 1 FROM key_diffs k WHERE k.event_id = e.id)), "
            "count(DISTINCT e.name), total(c.from_cache) "
            "FROM events e JOIN compiles c ON c.event_id = e.id WHERE e.kind = 'compile' "
            "GROUP BY 1, 2 ORDER BY 3 DESC, 4 DESC, 7 DESC, 2"
        )
        return [CompileGroup(i, m or "", int(n), int(r), s, k, int(b)) for m, i, n, s, r, k, b in rows]

    def compile_history(
        self, identity: str, *, mode: str | None = None, limit: int | None = None, offset: int = 0
    ) -> list[CompileEvent]:
        """The compiles of one op or graph (an identity of :meth:`compile_groups`; for runs
        recorded before identities, the op or graph name), oldest first, with their key
        diffs; paged by ``limit``/``offset`` so a recompile storm is read a page at a time."""
        lay = layout(CompileEvent)
        # the IN list narrows through the compiles table and the (kind, name) index first
        sql = self._select(lay) + (
            " AND e.id IN (SELECT event_id FROM compiles WHERE identity = ? "
            "UNION ALL SELECT id FROM events WHERE kind = 'compile' AND name = ?) "
            "AND coalesce(d.identity, e.name) = ?"
        )
        params: list[Any] = [identity, identity, identity]
        if mode is not None:
            sql += " AND e.mode = ?"
            params.append(mode)
        sql += " ORDER BY e.id"
        if limit is not None:
            sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
        return self._decode(lay, self._rows(sql, tuple(params)))  # type: ignore[return-value]

    def compile_by_id(self, event_id: int) -> CompileEvent | None:
        """One compile event (with its key diffs), or None when ``event_id`` is no compile."""
        lay = layout(CompileEvent)
        out = self._decode(lay, self._rows(self._select(lay) + " AND e.id = ?", (event_id,)))
        return out[0] if out else None  # type: ignore[return-value]

    def transfer_sites(self, *, buckets: int = 0, limit: int | None = None) -> list[TransferSite]:
        """Transfers grouped by source line, direction, cause and kind: implicit ones first,
        then the most frequent, then the slowest.

        One pass over the transfers, however many there are (the TUI calls this on runs
        with hundreds of thousands of them).

        Args:
            buckets: also count each site's transfers in this many equal time buckets
                between the first and the last transfer of the run (``timeline``).
            limit: at most this many sites.
        """
        t0, t1 = self._rows("SELECT min(ts), max(ts) FROM events WHERE kind = 'transfer'")[0]
        if t0 is None:
            return []
        n = max(1, buckets)
        width = (t1 - t0) / n or 1.0
        rows = self._rows(
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
        ids = sorted({key[0] for key in sites if key[0] is not None})
        locations: dict[int, SourceLocation] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for lid, file, line, function in self._rows(
                f"SELECT id, file, line, function FROM locations WHERE id IN ({','.join('?' * len(chunk))})",
                tuple(chunk),
            ):
                locations[lid] = SourceLocation(file, line, function)
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

    def ranked_divergences(self, *, limit: int | None = None, offset: int = 0) -> list[DivergenceEvent]:
        """Divergence events ranked: the firsts over tolerance (local measure first, then in
        the order they happened), then NaN/Inf origins, then by error in units of tolerance
        (``ratio``), largest first."""
        lay = layout(DivergenceEvent)
        # rank on the divergences table alone, then fetch the page's events: sorting the
        # join would read every event of the run
        order = (
            "d.first DESC, CASE WHEN d.first THEN d.measure != 'local' END, CASE WHEN d.first THEN d.event_id END, "
            "d.nan_origin DESC, d.ratio DESC, "
            "CASE WHEN d.tolerance > 0 THEN d.max_abs / d.tolerance ELSE d.max_abs END DESC, d.event_id"
        )
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        ids = [r[0] for r in self._rows(f"SELECT d.event_id FROM divergences d ORDER BY {order}{page}")]
        if not ids:
            return []
        rank = {eid: i for i, eid in enumerate(ids)}
        out: list[DivergenceEvent] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            sql = self._select(lay) + f" AND e.id IN ({','.join('?' * len(chunk))})"
            out.extend(self._decode(lay, self._rows(sql, tuple(chunk))))  # type: ignore[arg-type]
        out.sort(key=lambda e: rank[e.id])
        return out

    def program_of_node(self, node: str, *, graph: str | None = None) -> int | None:
        """The id of the latest compiled program holding FX node ``node`` (None when none does)."""
        where = "WHERE n.node = ?" + (" AND p.name = ?" if graph is not None else "")
        rows = self._rows(
            f"SELECT p.id FROM fx_nodes n JOIN programs p ON p.id = n.program_id {where} "
            "ORDER BY p.id DESC LIMIT 1",
            (node,) + ((graph,) if graph is not None else ()),
        )
        return rows[0][0] if rows else None

    # -- steps and findings -------------------------------------------------------------

    def steps(self) -> list[Any]:
        """The run's steps in order (``tracers.events.StepEvent``: when each began and ended,
        how it was detected, what ran in it); empty when the run had none."""
        return sorted(self.events("step"), key=lambda s: s.index)

    def findings(self) -> list[Finding]:
        """What the advisor finds in the run (``tracers.advisor.Finding``), the most costly
        first; an empty list is a run with nothing to fix."""
        from tpu_debug.tracers.advisor import advise

        return list(advise(self).findings)

    # -- helpers --------------------------------------------------------------------

    @staticmethod
    def _filters(*, prefix: str = "", **conds: Any) -> tuple[str, tuple]:
        parts, params = [], []
        for col, value in conds.items():
            if value is not None:
                parts.append(f"{prefix}{col} = ?")
                params.append(value)
        return ("WHERE " + " AND ".join(parts) if parts else ""), tuple(params)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True
