"""The run store's layout: one SQLite database per run, its tables derived from the event kinds.

The run writer (``tracers/recording/run_writer.py``) fills it from a background
thread; readers open it with :func:`connect` and rebuild events with each kind's
:class:`KindLayout`. HLO text is stored once per distinct program (content hash);
events refer to it by id.

Layout (``SCHEMA_VERSION`` in :mod:`.events`; ``PRAGMA user_version`` holds it
and ``PRAGMA application_id`` marks the file as a tpu_debug run):

- ``meta(key, value)``: run metadata, values JSON-encoded.
- ``events``: one row per event, the common header (``kind``, ``ts``,
  ``mode``, ``thread``, ``location_id``) plus ``name``, ``seconds`` and
  ``program_id``; indexed by (kind, ts) and (kind, name) for the TUI.
- ``executions``: per-execution op events (kind ``"op"``, only recorded on
  request), the same columns without ``kind`` and without secondary indexes:
  they can be millions, id order is time order, and per-op totals live in
  ``op_stats``. Event ids are unique across both tables.
- one detail table per event kind with more fields, keyed by ``event_id``,
  and child tables for tuples of records (``key_diffs``). These follow from
  each kind's declaration (``stored`` on its class, see :mod:`.events`):
  :class:`KindLayout` derives the columns from the field types, and the
  run writer and the queries of ``tracers/reading/`` use the same layout.
- ``locations``, ``programs`` (StableHLO + optimized HLO, deduplicated),
  ``fx_nodes`` and ``node_instructions`` (FX node -> HLO instructions).
- ``op_stats``: per executable (mode, op, signature, program) execution count
  and total seconds, updated in place at every commit.

Nothing is pickled; structured values are JSON.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import re
import sqlite3
import string
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tpu_debug.tracers import events as _events
from tpu_debug.tracers.events import OLDEST_READABLE_SCHEMA, SCHEMA_VERSION, ArgInfo, Event, SourceLocation

from tpu_debug.core.errors import (
    RunAccessError,
    RunDamagedError,
    RunNotFoundError,
    SchemaVersionError,
)
from tpu_debug.core.version import __version__

__all__ = [
    "APPLICATION_ID",
    "DB_NAME",
    "KindLayout",
    "META_CAPPED",
    "META_DROPPED",
    "META_RECORDING_ERROR",
    "connect",
    "layout",
    "schema_statements",
    "args_to_json",
    "args_from_json",
]

DB_NAME = "run.db"
APPLICATION_ID = 0x54504442  # "TPDB"

# the tables every run has; each event kind adds its own (KindLayout.create_statements)
_BASE_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE locations (
    id INTEGER PRIMARY KEY,
    file TEXT NOT NULL,
    line INTEGER NOT NULL,
    function TEXT NOT NULL
);
CREATE TABLE programs (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    mode TEXT NOT NULL,
    name TEXT NOT NULL,
    stablehlo TEXT NOT NULL,
    hlo TEXT NOT NULL,
    instructions INTEGER NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    ts REAL NOT NULL,
    mode TEXT,
    thread INTEGER NOT NULL,
    location_id INTEGER REFERENCES locations(id),
    name TEXT,
    seconds REAL,
    program_id INTEGER REFERENCES programs(id)
);
CREATE INDEX events_by_kind_ts ON events(kind, ts);
CREATE INDEX events_by_kind_name ON events(kind, name);
CREATE TABLE executions (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    mode TEXT,
    thread INTEGER NOT NULL,
    location_id INTEGER REFERENCES locations(id),
    name TEXT NOT NULL,
    seconds REAL NOT NULL,
    program_id INTEGER REFERENCES programs(id)
);
CREATE TABLE op_stats (
    id INTEGER PRIMARY KEY,
    mode TEXT NOT NULL,
    name TEXT NOT NULL,
    signature TEXT NOT NULL,
    program_id INTEGER REFERENCES programs(id),
    count INTEGER NOT NULL,
    seconds REAL NOT NULL
);
CREATE INDEX op_stats_by_name ON op_stats(name);
CREATE TABLE fx_nodes (
    program_id INTEGER NOT NULL REFERENCES programs(id),
    node TEXT NOT NULL,
    position INTEGER NOT NULL,
    target TEXT NOT NULL,
    location_id INTEGER REFERENCES locations(id),
    PRIMARY KEY (program_id, node)
) WITHOUT ROWID;
CREATE TABLE node_instructions (
    program_id INTEGER NOT NULL REFERENCES programs(id),
    node TEXT NOT NULL,
    instruction TEXT NOT NULL,
    PRIMARY KEY (program_id, node, instruction)
) WITHOUT ROWID;
"""
_BASE_TABLES = frozenset(re.findall(r"CREATE TABLE (\w+)", _BASE_SCHEMA))

# meta keys the writer maintains besides what the trace passes
META_CAPPED = "capped_events"  # {kind: {value: total}} for values over their kind's cap
META_DROPPED = "dropped_events"  # events put but never written (writer error, a stalled writer)
META_RECORDING_ERROR = "recording_error"  # why the writer stopped early, when it did


def args_to_json(args: Iterable[Any]) -> str:
    return json.dumps(
        [[a.name, list(a.shape) if a.shape is not None else None, a.dtype, a.static] for a in args]
    )


def args_from_json(text: str) -> tuple[ArgInfo, ...]:
    return tuple(
        ArgInfo(name=name, shape=tuple(shape) if shape is not None else None, dtype=dtype, static=static)
        for name, shape, dtype, static in json.loads(text)
    )


# ---------------------------------------------------------------------------------
# Event kinds -> tables, from each kind's declaration
# ---------------------------------------------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER = ("id", "ts", "mode", "thread", "location")
# decode sources that are not a column of the row
_LOCATION, _CHILDREN, _CONSTANT, _RECORD = -1, -2, -3, -4


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    """One field of an event (or of a record in a child table) as a column.

    ``field`` is the attribute path that holds its value (``"nbytes"``, or ``"transfer.nbytes"``
    for a field of a record the event carries); ``legacy`` and ``default`` are how a run
    recorded before the column existed reads it (see :func:`~.events.column`)."""

    field: str
    name: str
    sql: str  # type and constraint: "TEXT NOT NULL"
    encode: Callable[[Any], Any] | None  # None: stored as it is
    decode: Callable[[Any], Any] | None
    legacy: str | None = None
    default: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class ChildTable:
    """A field holding a tuple of records, one row per record keyed by (event_id, position)."""

    field: str
    table: str
    record: type
    columns: tuple[Column, ...]

    def records(self, event: Any) -> tuple:
        return operator.attrgetter(self.field)(event)

    def row(self, record: Any) -> tuple:
        return tuple(_encoded(getattr(record, c.field), c.encode) for c in self.columns)

    def decode(self, values: tuple) -> Any:
        return self.record(*(_decoded(v, c.decode) for v, c in zip(values, self.columns)))


def _encoded(value: Any, encode: Callable[[Any], Any] | None) -> Any:
    return value if encode is None or value is None else encode(value)


def _decoded(value: Any, decode: Callable[[Any], Any] | None) -> Any:
    return value if decode is None or value is None else decode(value)


def _json_tuple(value: tuple) -> str:
    return json.dumps(list(value))


def _tuple_from_json(text: str) -> tuple:
    return tuple(json.loads(text))


def _tuples_from_json(text: str) -> tuple:
    return tuple(tuple(item) for item in json.loads(text))


def _memo(encode: Callable[[Any], str], size: int = 4096) -> Callable[[Any], str]:
    """``encode`` remembering its last results (the same shapes come back at every step)."""
    cache: dict[Any, str] = {}

    def encoded(value: Any) -> str:
        text = cache.get(value)
        if text is None:
            if len(cache) >= size:
                cache.clear()
            text = cache[value] = encode(value)
        return text

    return encoded


@dataclasses.dataclass(frozen=True, slots=True)
class _Place:
    """Where one field is kept: its column (and child table) names, and how an older run reads it."""

    column: str
    table: str | None = None
    legacy: str | None = None
    children: Mapping[str, str] = dataclasses.field(default_factory=dict)  # a child record's renames
    children_legacy: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _scalar(path: str, name: str, tp: Any, null: str, place: _Place, default: Any) -> Column | None:
    """The column of a field of a plain type (None for another type)."""
    legacy = place.legacy
    if tp is bool:
        return Column(path, name, "INTEGER" + null, int, bool, legacy, default)
    if tp in (int, float, str):
        return Column(path, name, {int: "INTEGER", float: "REAL", str: "TEXT"}[tp] + null, None, None, legacy, default)
    if set(typing.get_args(tp)) == {int, float}:  # no type affinity: an int stays an int, a float a float
        return Column(path, name, "BLOB" + null, None, None, legacy, default)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if item in (int, float, str):
            # ints only: 1 == 1.0 == True as dict keys, and a float tuple must keep its floats
            encode = _memo(_json_tuple) if item is int else _json_tuple
            return Column(path, name, "TEXT" + null, encode, _tuple_from_json, legacy, default)
        if item is ArgInfo:
            return Column(path, name, "TEXT" + null, args_to_json, args_from_json, legacy, default)
        inner = typing.get_args(item)
        if typing.get_origin(item) is tuple and len(inner) == 2 and inner[1] is Ellipsis and inner[0] is int:
            return Column(path, name, "TEXT" + null, _memo(json.dumps), _tuples_from_json, legacy, default)
    return None


def _column(owner: type, f: dataclasses.Field, hint: Any, path: str, place: _Place) -> Column | ChildTable:
    """The column for field ``f`` of ``owner`` (kept at attribute ``path`` of its event), from its type."""
    name = place.column
    if not _IDENTIFIER.match(name):
        raise TypeError(f"{owner.__name__}.{f.name}: column name {name!r} is not an SQL identifier")
    tp, nullable = hint, False
    if typing.get_origin(tp) in (types.UnionType, typing.Union) and type(None) in typing.get_args(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        tp, nullable = (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    default = f.default if f.default is not dataclasses.MISSING else None
    found = _scalar(path, name, tp, "" if nullable else " NOT NULL", place, default)
    if found is not None:
        return found
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
        if place.table is not None:
            return _child_table(owner, f, args[0], path, place)
    raise TypeError(
        f"{owner.__name__}.{f.name}: the run store cannot keep a field of type {hint!r}; use str, int, "
        "float, int | float, bool, a tuple of those, tuple[ArgInfo, ...], a tuple of records with "
        "column(table=...), or X | None of one of these"
    )


def _child_table(owner: type, f: dataclasses.Field, item: type, path: str, place: _Place) -> ChildTable:
    table = place.table or ""
    if not _IDENTIFIER.match(table):
        raise TypeError(f"{owner.__name__}.{f.name}: table name {table!r} is not an SQL identifier")
    hints = typing.get_type_hints(item)
    columns = []
    for g in dataclasses.fields(item):
        col = _column(item, g, hints[g.name], g.name, _Place(
            place.children.get(g.name, g.metadata.get("column") or g.name),
            legacy=place.children_legacy.get(g.name, g.metadata.get("legacy"))))
        if isinstance(col, ChildTable):
            raise TypeError(f"{item.__name__}.{g.name}: a child table's records cannot have children")
        columns.append(col)
    return ChildTable(path, table, item, tuple(columns))


def _place_of(f: dataclasses.Field) -> _Place:
    """Where an event's own field is kept (``column()``'s declaration, or its name)."""
    return _Place(f.metadata.get("column") or f.name, table=f.metadata.get("table"), legacy=f.metadata.get("legacy"))


def _carried_places(f: dataclasses.Field, g: dataclasses.Field) -> _Place:
    """Where field ``g`` of the record an event carries in ``f`` is kept (``carried()``'s renames)."""
    columns, legacy = f.metadata["columns"], f.metadata["legacy"]
    prefix = g.name + "."
    return _Place(
        columns.get(g.name, g.name), table=columns.get(g.name), legacy=legacy.get(g.name),
        children={k[len(prefix):]: v for k, v in columns.items() if k.startswith(prefix)},
        children_legacy={k[len(prefix):]: v for k, v in legacy.items() if k.startswith(prefix)},
    )


def _column_or_default(column: Column, present: frozenset[str] | None, prefix: str = "") -> str:
    """``column`` in a SELECT; a column the run's table lacks (a field added since the run was
    recorded) reads as its ``legacy`` expression over the run's columns (see
    :func:`~.events.column`), else as its default (a plain value; NULL for anything else)."""
    if present is None or column.name in present:
        return f"{prefix}{column.name}"
    legacy = column.legacy
    if legacy is not None:
        names = {name for _, name, _, _ in string.Formatter().parse(legacy) if name}
        # a detail table's SELECT (prefix "d.") also sees the header's name and seconds columns
        # ("{name}", "{seconds}")
        header = {"name": "e.name", "seconds": "e.seconds"} if prefix == "d." else {}
        if names <= present | header.keys():
            return f"({legacy.format_map({n: prefix + n if n in present else header[n] for n in names})}) AS {column.name}"
    default = column.default
    if isinstance(default, bool):
        literal = str(int(default))
    elif isinstance(default, int | float):
        literal = repr(default)
    elif isinstance(default, str):
        literal = "'" + default.replace("'", "''") + "'"
    else:
        literal = "NULL"
    return f"{literal} AS {column.name}"


class KindLayout:
    """How one event kind maps to rows, derived once from its class's ``stored`` declaration.

    The writer builds rows with :meth:`header_of` and :meth:`row`; readers select
    :meth:`select_sql`'s columns and rebuild events with :meth:`decode`.
    """

    def __init__(self, cls: type[Event]) -> None:
        stored = cls.__dict__.get("stored")
        if not isinstance(stored, _events.Stored):
            raise TypeError(f"{cls.__name__} declares no 'stored' (see tpu_debug.tracers.events.Stored)")
        self.cls = cls
        self.kind: str = cls.kind
        self.table: str | None = stored.table
        self.executions = stored.header == "executions"
        self.cap: tuple[str, int] | None = stored.cap
        head = (stored.name, stored.seconds, stored.program)
        names = [f.name for f in dataclasses.fields(cls)]
        columns, children = self._columns(cls, stored, head, names)
        self.columns: tuple[Column, ...] = tuple(columns) if self.table is not None else ()
        self.children: tuple[ChildTable, ...] = tuple(children)
        self._check_tables(cls, head, names)
        self._plan_rows(head)
        self._plan_reading(head, names)

    def _columns(
        self, cls: type, stored: Any, head: tuple, names: list[str]
    ) -> tuple[list[Column], list[ChildTable]]:
        """The detail columns and child tables the fields after the header map to."""
        if stored.header not in ("events", "executions"):
            raise TypeError(f"{cls.__name__}: stored header {stored.header!r}; use 'events' or 'executions'")
        if not _IDENTIFIER.match(cls.kind):
            raise TypeError(f"{cls.__name__}: kind {cls.kind!r} is not an identifier (letters, digits, _)")
        if tuple(names[:5]) != _HEADER:
            raise TypeError(f"{cls.__name__}: an event's first fields are {', '.join(_HEADER)}")
        paths = set(names) | {f"{f.name}.{g.name}" for f in _events.carried_fields(cls)
                              for g in dataclasses.fields(typing.get_type_hints(cls)[f.name])}
        for role, field in zip(("name", "seconds", "program"), head):
            if field is not None and field not in paths:
                raise TypeError(f"{cls.__name__}: stored {role}={field!r} names no field of it")
        hints = typing.get_type_hints(cls)
        columns: list[Column] = []
        children: list[ChildTable] = []
        for f in dataclasses.fields(cls)[5:]:
            if f.name in head:
                continue
            if f.metadata.get("carried"):
                record = hints[f.name]
                record_hints = typing.get_type_hints(record)
                for g in dataclasses.fields(record):
                    path = f"{f.name}.{g.name}"
                    if path in head or g.name in f.metadata["skip"]:
                        continue
                    col = _column(record, g, record_hints[g.name], path, _carried_places(f, g))
                    (children if isinstance(col, ChildTable) else columns).append(col)
                continue
            col = _column(cls, f, hints[f.name], f.name, _place_of(f))
            (children if isinstance(col, ChildTable) else columns).append(col)
        if columns and self.table is None:
            raise TypeError(
                f"{cls.__name__}: fields {', '.join(c.field for c in columns)} need a detail table: "
                "give stored a table name"
            )
        return columns, children

    def _check_tables(self, cls: type, head: tuple, names: list[str]) -> None:
        if self.table is not None and not _IDENTIFIER.match(self.table):
            raise TypeError(f"{cls.__name__}: table name {self.table!r} is not an SQL identifier")
        if self.executions and (self.table is not None or self.children or head != ("name", "seconds", "program")):
            # the writer reads these by name on its fastest path
            raise TypeError(
                f"{cls.__name__}: a kind kept in 'executions' has exactly the fields name, seconds and "
                "program after the header, stored as name, seconds and program"
            )
        tables = [t for t in (self.table, *(c.table for c in self.children)) if t is not None]
        clash = sorted(set(tables) & _BASE_TABLES)
        if clash or len(set(tables)) != len(tables):
            raise TypeError(f"{cls.__name__}: table name {(clash or tables)[0]!r} is taken")
        if self.cap is not None and (self.cap[0] not in names or self.executions):
            raise TypeError(f"{cls.__name__}: stored cap {self.cap!r} names no field of an 'events' kind")

    def _plan_rows(self, head: tuple) -> None:
        """The writer's side: one C call per event reads the header's fields, another the detail's."""
        if all(head):
            self.header_of: Callable[[Any], tuple] = operator.attrgetter(*head)
        else:
            getters = [operator.attrgetter(h) if h else (lambda _e: None) for h in head]
            self.header_of = lambda e: (getters[0](e), getters[1](e), getters[2](e))
        get = operator.attrgetter(*(c.field for c in self.columns)) if self.columns else None
        single = len(self.columns) == 1
        encoders = tuple((i, c.encode) for i, c in enumerate(self.columns) if c.encode is not None)

        def row(event: Any) -> tuple:
            values = get(event)  # type: ignore[misc]
            if single:
                values = (values,)
            if encoders:
                values = list(values)
                for i, encode in encoders:
                    if values[i] is not None:
                        values[i] = encode(values[i])
            return (event.id, *values)

        self.row: Callable[[Any], tuple] = row
        n = len(self.columns) + 1
        self.insert_sql = f"INSERT INTO {self.table} VALUES ({', '.join('?' * n)})" if self.table else ""
        self.child_insert_sql = tuple(
            f"INSERT INTO {c.table} VALUES ({', '.join('?' * (len(c.columns) + 2))})" for c in self.children
        )

    def _plan_reading(self, head: tuple, names: list[str]) -> None:
        """The reader's side: each field of the class from a position of the selected row (a
        carried record's fields each from theirs, the record rebuilt from them)."""
        position = {"id": 0, "ts": 1, "mode": 2, "thread": 3}
        for i, h in enumerate(head):
            if h is not None:
                position[h] = 7 + i  # after id, ts, mode, thread, file, line, function
        for i, c in enumerate(self.columns):
            position[c.field] = 10 + i
        decoders = {c.field: c.decode for c in self.columns}
        children = {c.field: c for c in self.children}

        def source(path: str, default: Any = dataclasses.MISSING) -> tuple:
            if path in children:
                return (_CHILDREN, children[path])
            if path not in position:  # a field the run does not keep (a carried record's skipped one)
                return (_CONSTANT, default)
            return (position[path], decoders.get(path))

        carried = {f.name: f for f in _events.carried_fields(self.cls)}
        hints = typing.get_type_hints(self.cls)
        plan = []
        for name in names:
            if name == "location":
                plan.append((_LOCATION, None))
            elif name in carried:
                record = hints[name]
                parts = tuple(source(f"{name}.{g.name}", g.default) for g in dataclasses.fields(record))
                plan.append((_RECORD, (record, parts)))
            else:
                plan.append(source(name))
        self._plan = tuple(plan)

    def create_statements(self) -> list[str]:
        """The CREATE TABLE statements of the kind's detail and child tables."""
        out = []
        if self.table is not None:
            cols = "".join(f",\n    {c.name} {c.sql}" for c in self.columns)
            out.append(
                f"CREATE TABLE IF NOT EXISTS {self.table} (\n"
                f"    event_id INTEGER PRIMARY KEY REFERENCES events(id){cols}\n)"
            )
        for child in self.children:
            cols = "".join(f"    {c.name} {c.sql},\n" for c in child.columns)
            out.append(
                f"CREATE TABLE IF NOT EXISTS {child.table} (\n"
                "    event_id INTEGER NOT NULL REFERENCES events(id),\n"
                f"    position INTEGER NOT NULL,\n{cols}"
                "    PRIMARY KEY (event_id, position)\n) WITHOUT ROWID"
            )
        return out

    def select_sql(self, present: frozenset[str] | None = None) -> str:
        """SELECT of this kind's events: id, ts, mode, thread, file, line, function, name,
        seconds, program hash, then the detail columns; add conditions with ``AND``.
        ``present``: the detail table's columns in the run being read, when it may lack
        some: a field added since that run was recorded reads as its default."""
        if self.executions:
            return (
                "SELECT e.id, e.ts, e.mode, e.thread, l.file, l.line, l.function, e.name, e.seconds, p.hash "
                "FROM executions e LEFT JOIN locations l ON l.id = e.location_id "
                "LEFT JOIN programs p ON p.id = e.program_id WHERE 1"
            )
        extra = "".join(f", {_column_or_default(c, present, 'd.')}" for c in self.columns)
        join = f"JOIN {self.table} d ON d.event_id = e.id " if self.table is not None else ""
        return (
            "SELECT e.id, e.ts, e.mode, e.thread, l.file, l.line, l.function, e.name, e.seconds, "
            f"p.hash{extra} FROM events e LEFT JOIN locations l ON l.id = e.location_id "
            f"LEFT JOIN programs p ON p.id = e.program_id {join}WHERE e.kind = '{self.kind}'"
        )

    def child_select_sql(self, child: ChildTable, present: frozenset[str] | None = None) -> str:
        """SELECT of a child table's rows: event_id, then the record's columns (``present``:
        as for :meth:`select_sql`)."""
        cols = ", ".join(_column_or_default(c, present) for c in child.columns)
        return f"SELECT event_id, {cols} FROM {child.table}"

    def decode(
        self, row: tuple, location: SourceLocation | None, children: dict[str, dict[int, list]]
    ) -> Event:
        """The event of one :meth:`select_sql` row (``children``: per child field, records by event id)."""
        return self.cls(*(_value(row, location, children, source, how) for source, how in self._plan))


def _value(row: tuple, location: SourceLocation | None, children: dict[str, dict[int, list]], source: int,
           how: Any) -> Any:
    """One field's value in a selected row, as :meth:`KindLayout._plan_reading` placed it."""
    if source == _LOCATION:
        return location
    if source == _CHILDREN:
        return tuple(children.get(how.field, {}).get(row[0], ()))
    if source == _CONSTANT:
        return how
    if source == _RECORD:
        record, parts = how
        return record(*(_value(row, location, children, s, h) for s, h in parts))
    value = row[source]
    return value if how is None or value is None else how(value)


_layouts: dict[type, KindLayout] = {}


def layout(cls: type[Event]) -> KindLayout:
    """The :class:`KindLayout` of an event class (derived once).

    Raises:
        TypeError: the class's declaration cannot be stored (the message says why).
    """
    found = _layouts.get(cls)
    if found is None:
        found = _layouts[cls] = KindLayout(cls)
    return found


def schema_statements() -> list[str]:
    """Every CREATE statement of a new run: the fixed tables, then each registered kind's.

    Raises:
        TypeError: two kinds declare the same table.
    """
    out = [s.strip() for s in _BASE_SCHEMA.split(";") if s.strip()]
    owners: dict[str, str] = {}
    for cls in _events.EVENT_TYPES.values():
        kind = layout(cls)
        for table in (kind.table, *(c.table for c in kind.children)):
            if table is None:
                continue
            if table in owners:
                raise TypeError(
                    f"event kinds {owners[table]!r} and {kind.kind!r} both declare table {table!r}"
                )
            owners[table] = kind.kind
        out.extend(kind.create_statements())
    return out


# ---------------------------------------------------------------------------------
# Opening a run to read it
# ---------------------------------------------------------------------------------


def connect(db_path: Path) -> sqlite3.Connection:
    """Open a run database read-only after checking it is a run this version reads.

    Raises:
        RunNotFoundError: there is no file at ``db_path``.
        RunAccessError: this user may not read it.
        RunDamagedError: the file is not a readable tpu_debug run database.
        SchemaVersionError: the run was written with another store layout.
    """
    db_path = Path(db_path)
    try:
        exists = db_path.is_file()
        readable = exists and os.access(db_path, os.R_OK) and os.access(db_path.parent, os.R_OK | os.X_OK)
    except PermissionError:
        exists, readable = True, False
    if not exists:
        raise RunNotFoundError(f"{db_path}: no such run database. List recorded runs with 'tpu-debug runs'.")
    if not readable:
        raise RunAccessError(
            f"{db_path}: permission denied. Give your user read access to {db_path.parent} and the "
            f"files in it (chmod u+rx {db_path.parent}; chmod u+r {db_path}), or read the run as the "
            "user who recorded it."
        )
    uri = f"file:{_uri_path(db_path)}?mode=ro"
    conn = None
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("PRAGMA trusted_schema=OFF")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise RunDamagedError(
                f"{db_path}: not a tpu_debug run database (application id {app_id:#x}). "
                "Point at a run directory under tpu_debug_runs/, or re-record the run."
            )
        if not OLDEST_READABLE_SCHEMA <= version <= SCHEMA_VERSION:
            writer = _meta_value(conn, "tpu_debug_version")
            by = f" (written by tpu_debug {writer})" if writer else ""
            if version > SCHEMA_VERSION:
                fix = (
                    "Upgrade tpu_debug (pip install -U tpu-debug) to read it, "
                    "or re-record the run with this one."
                )
            else:
                fix = "Re-record the run, or read it with the tpu_debug that wrote it."
            reads = (
                f"schema {SCHEMA_VERSION}" if OLDEST_READABLE_SCHEMA == SCHEMA_VERSION
                else f"schema {OLDEST_READABLE_SCHEMA} to {SCHEMA_VERSION}"
            )
            raise SchemaVersionError(
                f"{db_path} is schema {version}{by}; this tpu_debug {__version__} reads {reads}. {fix}"
            )
        conn.execute("SELECT count(*) FROM meta").fetchone()
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        raise RunDamagedError(
            f"{db_path}: not a readable tpu_debug run ({exc}). The file is damaged or truncated; "
            "re-record the run."
        ) from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn


def _meta_value(conn: sqlite3.Connection, key: str) -> Any:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None
    except (sqlite3.DatabaseError, ValueError):
        return None


def _uri_path(path: Path) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))
