"""The base every query of a run reads through: one read-only connection, the SQL and the
decoding of stored events back into their dataclasses, and the run's metadata.

A damaged file surfaces as :class:`~tpu_debug.core.errors.RunDamagedError`, never as an
``sqlite3`` traceback; an event whose row does not decode is left out and named by
:meth:`RunReader.damaged_rows`, so one bad value costs that event, not the run.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpu_debug.core.errors import RunDamagedError
from tpu_debug.tracers.events import (
    EVENT_TYPES,
    CollectivesTargetEvent,
    DivergenceSite,
    DivergenceSummaryEvent,
    DryRunSummaryEvent,
    Event,
    ProcessEvent,
    SourceLocation,
    TensorBoardSummaryEvent,
    UncomparedOp,
    event_type,
)
from tpu_debug.tracers.liveness import writer_alive
from tpu_debug.tracers.store import META_DROPPED, META_RECORDING_ERROR, KindLayout, connect, layout

__all__ = ["DamagedRow", "Part", "RunMetadata", "RunReader", "op_name_of"]


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


class RunReader:
    """One run's database, read-only: the connection, events by kind, the run's metadata.

    The queries by subject (:class:`Part` subclasses: ``session.ops``, ``session.compiles``, ...)
    read through it; :class:`~tpu_debug.tracers.reading.RunQuery` puts them together.
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        self._conn: sqlite3.Connection | None = None
        self._tables: frozenset[str] | None = None
        self._version: int | None = None
        self._table_columns: dict[str, frozenset[str]] = {}
        self._damaged_rows: dict[tuple[str, int], DamagedRow] = {}

    @property
    def run_dir(self) -> Path:
        """The run's directory."""
        return self.db_path.parent

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

    def damaged_rows(self) -> list[DamagedRow]:
        """The events read so far whose rows do not decode, and were left out, in id order.

        Example::

            q.events("compile"); [(d.table, d.event_id) for d in q.damaged_rows()]
            # [('compiles', 12)]
        """
        return sorted(self._damaged_rows.values(), key=lambda d: (d.event_id, d.kind))

    # -- reading events back (for the parts) --------------------------------------------

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

    def _decode_ids(self, lay: KindLayout, ids: list[int]) -> list[Event]:
        """The events of ``lay``'s kind with these ids (in no set order), a few hundred per statement."""
        out: list[Event] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            sql = self._select(lay) + f" AND e.id IN ({','.join('?' * len(chunk))})"
            out.extend(self._decode(lay, self._rows(sql, tuple(chunk))))
        return out

    def _note_damage(self, lay: KindLayout, table: str, event_id: int, exc: Exception) -> None:
        # one value that does not decode costs its event, not the run: the event is left out
        # and named by damaged_rows(), so every reader shows the rest
        key = (lay.kind, event_id)
        if key not in self._damaged_rows:
            self._damaged_rows[key] = DamagedRow(lay.kind, table, event_id, f"{type(exc).__name__}: {exc}")

    def _location(self, file, line, function) -> SourceLocation | None:
        if file is None:
            return None
        return SourceLocation(file, line, function)

    @staticmethod
    def _filters(*, prefix: str = "", **conds: Any) -> tuple[str, tuple]:
        parts, params = [], []
        for col, value in conds.items():
            if value is not None:
                parts.append(f"{prefix}{col} = ?")
                params.append(value)
        return ("WHERE " + " AND ".join(parts) if parts else ""), tuple(params)


class Part:
    """The queries of one subject of a run (``session.ops``, ``session.compiles``, ...), read
    through the run's :class:`RunReader`. Calling a part lists the subject's records
    (``session.compiles()``); its methods answer the subject's other questions
    (``session.compiles.groups()``)."""

    __slots__ = ("_run",)

    def __init__(self, run: RunReader) -> None:
        self._run = run

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._run.db_path}>"
