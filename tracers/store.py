"""The run store: one SQLite database per run, written by a background thread.

The traced program only appends to an in-memory queue (``RunWriter.put``);
a writer thread drains it, inserts in batches and commits at least every
``commit_interval`` seconds in WAL mode, so a run killed with SIGKILL keeps
everything recorded up to a fraction of a second before the kill. HLO text is
stored once per distinct program (content hash); events refer to it by id.

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
- one detail table per kind with more fields, keyed by ``event_id``:
  ``compiles`` (+ ``key_diffs``), ``transfers``, ``fallbacks``,
  ``graph_breaks``, ``guard_failures``, ``recompile_limits``, ``divergences``,
  ``internal_errors``.
- ``locations``, ``programs`` (StableHLO + optimized HLO, deduplicated),
  ``fx_nodes`` and ``node_instructions`` (FX node -> HLO instructions).
- ``op_stats``: per executable (mode, op, signature, program) execution count
  and total seconds, updated in place at every commit.

Nothing is pickled; structured values are JSON.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tpu_debug.tracers.events import (
    SCHEMA_VERSION,
    CompileEvent,
    DivergenceEvent,
    Event,
    FallbackEvent,
    GraphBreakEvent,
    GuardFailureEvent,
    InternalErrorEvent,
    OpEvent,
    RecompileLimitEvent,
    SourceLocation,
    TransferEvent,
)
from tpu_debug.tracers.hlo import Program
from tpu_debug.tracers.liveness import WriterLock

from tpu_debug.errors import RunDamagedError, RunNotFoundError, SchemaVersionError

__all__ = [
    "APPLICATION_ID",
    "DB_NAME",
    "SCHEMA",
    "RunWriter",
    "StatRow",
    "connect",
    "args_to_json",
]

DB_NAME = "run.db"
APPLICATION_ID = 0x54504442  # "TPDB"

SCHEMA = """
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
CREATE TABLE compiles (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    signature TEXT NOT NULL,
    args TEXT NOT NULL,
    previous_id INTEGER REFERENCES events(id),
    identity TEXT
);
CREATE TABLE key_diffs (
    event_id INTEGER NOT NULL REFERENCES events(id),
    position INTEGER NOT NULL,
    field TEXT NOT NULL,
    before TEXT NOT NULL,
    now TEXT NOT NULL,
    PRIMARY KEY (event_id, position)
) WITHOUT ROWID;
CREATE TABLE transfers (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    direction TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    shape TEXT NOT NULL,
    dtype TEXT NOT NULL,
    implicit INTEGER NOT NULL
);
CREATE TABLE fallbacks (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    args TEXT NOT NULL
);
CREATE TABLE graph_breaks (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    reason TEXT NOT NULL
);
CREATE TABLE guard_failures (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    compile_id TEXT NOT NULL,
    guards TEXT NOT NULL
);
CREATE TABLE recompile_limits (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    limit_type TEXT NOT NULL,
    limit_value INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE divergences (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    measure TEXT NOT NULL,
    max_abs REAL NOT NULL,
    max_rel REAL NOT NULL,
    ulp REAL,
    mismatched INTEGER NOT NULL,
    nan_origin INTEGER NOT NULL,
    tolerance REAL NOT NULL,
    first INTEGER NOT NULL,
    rtol REAL NOT NULL DEFAULT 0,
    atol REAL NOT NULL DEFAULT 0,
    ratio REAL NOT NULL DEFAULT 0,
    numel INTEGER NOT NULL DEFAULT 0,
    shape TEXT NOT NULL DEFAULT '[]',
    dtype TEXT NOT NULL DEFAULT '',
    device_dtype TEXT NOT NULL DEFAULT '',
    device_nonfinite INTEGER NOT NULL DEFAULT 0,
    cpu_nonfinite INTEGER NOT NULL DEFAULT 0,
    phase TEXT NOT NULL DEFAULT 'forward',
    graph TEXT,
    target TEXT NOT NULL DEFAULT '',
    autograd_node TEXT NOT NULL DEFAULT '',
    highest INTEGER
);
CREATE TABLE internal_errors (
    event_id INTEGER PRIMARY KEY REFERENCES events(id),
    message TEXT NOT NULL
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

# (id, mode, name, signature, program hash or None, count, total seconds)
StatRow = tuple[int, str, str, str, "str | None", int, float]


def args_to_json(args: Iterable[Any]) -> str:
    return json.dumps(
        [[a.name, list(a.shape) if a.shape is not None else None, a.dtype, a.static] for a in args]
    )


class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _Meta:
    __slots__ = ("items",)

    def __init__(self, items: dict[str, Any]) -> None:
        self.items = items


_STOP = object()


class RunWriter:
    """Appends a run's events to its database from a background thread.

    ``put`` never blocks on disk. ``flush`` waits until everything put so far
    is committed; ``close`` flushes, writes the final metadata and stops the
    thread. An error inside the writer never reaches the traced program: it is
    kept in ``error`` and recording stops.

    Example:
        >>> writer = RunWriter(Path("run.db"), {"name": "demo"})
        >>> writer.put(event)
        >>> writer.close({"exit_status": 0})
    """

    MAX_BATCH = 50_000

    def __init__(self, db_path: Path, metadata: dict[str, Any], *, commit_interval: float = 0.25) -> None:
        self.path = Path(db_path)
        self.commit_interval = commit_interval
        self.error: BaseException | None = None
        # a deque, not a queue.Queue: append never blocks and never wakes the writer, so a
        # busy traced thread does not hand the GIL to the writer on every event
        self._queue: collections.deque = collections.deque()
        self._put = self._queue.append
        self._wake = threading.Event()
        self._ids = itertools.count(1)
        self.new_id: Callable[[], int] = self._ids.__next__
        self._programs_seen: set[str] = set()
        self._programs_lock = threading.Lock()
        self._stats_source: Callable[[], list[StatRow]] | None = None
        self._listeners: tuple[Callable[[Event], None], ...] = ()
        self._closed = False
        # the lock before the file: from the moment run.db exists a reader can ask if its writer lives
        self._writer_lock = WriterLock(self.path)
        self._writer_lock.acquire()
        try:
            self._create(metadata)
        except BaseException:
            self._writer_lock.release()
            raise
        self._thread = threading.Thread(target=self._run, name="tpu_debug-run-writer", daemon=True)
        self._thread.start()

    # -- producer side (any thread) -------------------------------------------------

    def put(self, event: Event) -> None:
        """Queue ``event`` for writing (never blocks)."""
        self._put(event)
        if self._listeners:
            for listener in self._listeners:
                listener(event)

    # issue 9: exporters (TensorBoard) hear each event as it is recorded, on the
    # recording thread; a listener must not raise.
    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener(event)`` for every event put from now on."""
        self._listeners = self._listeners + (listener,)

    def remove_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners = tuple(fn for fn in self._listeners if fn is not listener)

    def add_program(self, program: Program) -> str:
        """Queue ``program`` unless a program with the same hash was added; returns the hash."""
        with self._programs_lock:
            if program.hash in self._programs_seen:
                return program.hash
            self._programs_seen.add(program.hash)
        self._put(program)
        return program.hash

    def has_program(self, content_hash: str) -> bool:
        return content_hash in self._programs_seen

    def set_meta(self, **items: Any) -> None:
        """Queue metadata updates (JSON-encodable values)."""
        self._put(_Meta(items))

    def set_stats_source(self, source: Callable[[], list[StatRow]] | None) -> None:
        """``source()`` is called at each commit and returns the op_stats rows changed since the last call."""
        self._stats_source = source

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued so far is committed. Returns False on timeout or writer error."""
        if self.error is not None:
            return False
        if self._closed or not self._thread.is_alive():
            return True
        marker = _Flush()
        self._put(marker)
        self._wake.set()
        return marker.done.wait(timeout) and self.error is None

    def close(self, metadata: dict[str, Any] | None = None, *, timeout: float | None = 120.0) -> None:
        """Flush, record ``metadata``, checkpoint the WAL and stop the writer thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if metadata:
            self._put(_Meta(metadata))
        self._put(_STOP)
        self._wake.set()
        # joined in slices: Python acts on a signal between bytecodes, and one that lands just
        # before a long blocking join would wait for all of it (Ctrl-C during the close)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread.is_alive():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                break
            self._thread.join(left)

    # -- writer thread --------------------------------------------------------------

    def _create(self, metadata: dict[str, Any]) -> None:
        if self.path.exists():
            raise FileExistsError(f"{self.path}: a run database is already there")
        # built under another name and renamed once committed: a process killed half-way
        # leaves no run.db that a reader would find empty
        new = self.path.with_name(self.path.name + ".new")
        new.unlink(missing_ok=True)
        conn = sqlite3.connect(new, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=OFF")  # no fsync while the file is built
            conn.execute("PRAGMA page_size=16384")  # fewer page splits for append-heavy tables
            conn.execute("BEGIN")
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            # pid and host: what a reader falls back to where the writer lock is unavailable
            meta = {
                "status": "running",
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
                **metadata,
                "schema_version": SCHEMA_VERSION,
            }
            conn.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()]
            )
            conn.execute("COMMIT")
            # WAL once committed: the main file then holds everything, and renaming it moves it all
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        os.replace(new, self.path)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        state = _WriteState()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            # OFF: a killed process loses nothing the OS already has; only a machine crash
            # could damage the run, and then the run is not what matters (no fsync stalls)
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA cache_size=-65536")  # up to 64 MiB: index pages stay in memory
            stop = False
            pop = self._queue.popleft
            while not stop:
                if not self._queue:
                    self._wake.wait(self.commit_interval)
                self._wake.clear()
                items: list = []
                try:
                    for _ in range(self.MAX_BATCH):
                        items.append(pop())
                except IndexError:
                    pass
                try:
                    flushes, stop = self._write(conn, state, items)
                except BaseException:
                    for item in items:
                        if isinstance(item, _Flush):
                            item.done.set()
                    raise
                for marker in flushes:
                    marker.done.set()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except BaseException as exc:  # noqa: BLE001 - the traced program must go on; the error is reported
            self.error = exc
            self._drain_after_error()
        finally:
            if conn is not None:
                conn.close()
            self._writer_lock.release()  # after the final commit: readers now see how the run ended

    def _drain_after_error(self) -> None:
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                if self._closed and not self._queue:
                    return
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            if isinstance(item, _Flush):
                item.done.set()
            elif item is _STOP:
                return

    def _write(self, conn: sqlite3.Connection, st: _WriteState, items: list) -> tuple[list[_Flush], bool]:
        flushes: list[_Flush] = []
        stop = False
        events: list[tuple] = []
        executions: list[tuple] = []
        compiles: list[tuple] = []
        diffs: list[tuple] = []
        transfers: list[tuple] = []
        fallbacks: list[tuple] = []
        graph_breaks: list[tuple] = []
        guard_failures: list[tuple] = []  # issue 5
        recompile_limits: list[tuple] = []
        divergences: list[tuple] = []
        errors: list[tuple] = []
        programs: list[tuple] = []
        fx_nodes: list[tuple] = []
        node_ins: list[tuple] = []
        meta: list[tuple] = []
        new_locations: list[tuple] = []
        shapes = st.shapes
        loc_ids = st.locations
        by_object = st.location_objects
        prog_ids = st.programs

        def loc(location: SourceLocation | None) -> int | None:
            if location is None:
                return None
            # locations are interned by the finder: an identity hit skips hashing the dataclass
            hit = by_object.get(id(location))
            if hit is not None and hit[0] is location:
                return hit[1]
            lid = loc_ids.get(location)
            if lid is None:
                lid = loc_ids[location] = len(loc_ids) + 1
                new_locations.append((lid, location.file, location.line, location.function))
            by_object[id(location)] = (location, lid)
            return lid

        for item in items:
            t = type(item)
            if t is OpEvent:  # the high-volume kind: location lookup inlined
                location = item.location
                hit = by_object.get(id(location))
                lid = hit[1] if hit is not None and hit[0] is location else loc(location)
                executions.append(
                    (
                        item.id,
                        item.ts,
                        item.mode,
                        item.thread,
                        lid,
                        item.name,
                        item.seconds,
                        prog_ids.get(item.program),
                    )
                )
            elif t is TransferEvent:
                events.append(
                    (
                        item.id,
                        "transfer",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.op,
                        item.seconds,
                        None,
                    )
                )
                shape = shapes.get(item.shape)
                if shape is None:
                    shape = shapes[item.shape] = json.dumps(list(item.shape))
                transfers.append(
                    (item.id, item.direction, item.nbytes, shape, item.dtype, int(item.implicit))
                )
            elif t is CompileEvent:
                events.append(
                    (
                        item.id,
                        "compile",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.name,
                        item.seconds,
                        prog_ids.get(item.program),
                    )
                )
                compiles.append((item.id, item.signature, args_to_json(item.args), item.previous, item.identity))
                diffs.extend((item.id, i, d.field, d.before, d.now) for i, d in enumerate(item.diffs))
            elif t is Program:
                pid = prog_ids.get(item.hash)
                if pid is None:
                    pid = prog_ids[item.hash] = len(prog_ids) + 1
                    programs.append(
                        (pid, item.hash, item.mode, item.name, item.stablehlo, item.hlo, item.instructions)
                    )
                    fx_nodes.extend(
                        (pid, n.name, i, n.target, loc(n.location)) for i, n in enumerate(item.fx_nodes)
                    )
                    node_ins.extend((pid, node, ins) for node, ins in item.node_instructions)
            elif t is FallbackEvent:
                events.append(
                    (
                        item.id,
                        "fallback",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.name,
                        item.seconds,
                        None,
                    )
                )
                fallbacks.append((item.id, args_to_json(item.args)))
            elif t is GraphBreakEvent:
                events.append(
                    (
                        item.id,
                        "graph_break",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.name,
                        None,
                        None,
                    )
                )
                graph_breaks.append((item.id, item.reason))
            elif t is GuardFailureEvent or t is RecompileLimitEvent:  # issue 5
                events.append(
                    (item.id, item.kind, item.ts, item.mode, item.thread, loc(item.location), item.name, None, None)
                )
                if t is GuardFailureEvent:
                    guard_failures.append((item.id, item.compile_id, json.dumps(list(item.guards))))
                else:
                    recompile_limits.append((item.id, item.limit_type, item.limit, item.reason))
            elif t is DivergenceEvent:
                events.append(
                    (
                        item.id,
                        "divergence",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.name,
                        None,
                        None,
                    )
                )
                divergences.append(
                    (
                        item.id,
                        item.measure,
                        item.max_abs,
                        item.max_rel,
                        item.ulp,
                        item.mismatched,
                        int(item.nan_origin),
                        item.tolerance,
                        int(item.first),
                        # issue 8
                        item.rtol,
                        item.atol,
                        item.ratio,
                        item.numel,
                        json.dumps(list(item.shape)),
                        item.dtype,
                        item.device_dtype,
                        item.device_nonfinite,
                        item.cpu_nonfinite,
                        item.phase,
                        item.graph,
                        item.target,
                        item.autograd_node,
                        None if item.highest is None else int(item.highest),
                    )
                )
            elif t is InternalErrorEvent:
                events.append(
                    (
                        item.id,
                        "internal_error",
                        item.ts,
                        item.mode,
                        item.thread,
                        loc(item.location),
                        item.where,
                        None,
                        None,
                    )
                )
                errors.append((item.id, item.message))
            elif t is _Meta:
                meta.extend((k, json.dumps(v)) for k, v in item.items.items())
            elif t is _Flush:
                flushes.append(item)
            elif item is _STOP:
                stop = True
            else:
                raise TypeError(f"the run writer cannot store {t.__name__} objects")

        stats = self._stats_source() if self._stats_source is not None else []
        if not (events or executions or programs or meta or stats):
            return flushes, stop
        conn.execute("BEGIN")
        if new_locations:
            conn.executemany("INSERT INTO locations VALUES (?, ?, ?, ?)", new_locations)
        if programs:
            conn.executemany("INSERT INTO programs VALUES (?, ?, ?, ?, ?, ?, ?)", programs)
            conn.executemany("INSERT OR IGNORE INTO fx_nodes VALUES (?, ?, ?, ?, ?)", fx_nodes)
            conn.executemany("INSERT OR IGNORE INTO node_instructions VALUES (?, ?, ?)", node_ins)
        if events:
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
        if executions:
            conn.executemany("INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", executions)
        for sql, rows in (
            ("INSERT INTO compiles VALUES (?, ?, ?, ?, ?)", compiles),
            ("INSERT INTO key_diffs VALUES (?, ?, ?, ?, ?)", diffs),
            ("INSERT INTO transfers VALUES (?, ?, ?, ?, ?, ?)", transfers),
            ("INSERT INTO fallbacks VALUES (?, ?)", fallbacks),
            ("INSERT INTO graph_breaks VALUES (?, ?)", graph_breaks),
            ("INSERT INTO guard_failures VALUES (?, ?, ?)", guard_failures),
            ("INSERT INTO recompile_limits VALUES (?, ?, ?, ?)", recompile_limits),
            ("INSERT INTO divergences VALUES (" + ", ".join("?" * 23) + ")", divergences),
            ("INSERT INTO internal_errors VALUES (?, ?)", errors),
        ):
            if rows:
                conn.executemany(sql, rows)
        if stats:
            conn.executemany(
                "INSERT OR REPLACE INTO op_stats VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (i, mode, name, sig, prog_ids.get(h) if h else None, n, s)
                    for i, mode, name, sig, h, n, s in stats
                ],
            )
        if meta:
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta)
        conn.execute("COMMIT")
        return flushes, stop


class _WriteState:
    __slots__ = ("locations", "location_objects", "programs", "shapes")

    def __init__(self) -> None:
        self.locations: dict[SourceLocation, int] = {}
        self.location_objects: dict[int, tuple[SourceLocation, int]] = {}
        self.shapes: dict[tuple[int, ...], str] = {}
        self.programs: dict[str | None, int] = {}


# ---------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------


def connect(db_path: Path) -> sqlite3.Connection:
    """Open a run database read-only after checking it is a run this version reads.

    Raises:
        RunNotFoundError: there is no file at ``db_path``.
        RunDamagedError: the file is not a readable tpu_debug run database.
        SchemaVersionError: the run was written with another store layout.
    """
    db_path = Path(db_path)
    if not db_path.is_file():
        raise RunNotFoundError(f"{db_path}: no such run database. List recorded runs with 'tpu-debug runs'.")
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
        if version != SCHEMA_VERSION:
            from tpu_debug._version import __version__

            writer = _meta_value(conn, "tpu_debug_version")
            by = f" (written by tpu_debug {writer})" if writer else ""
            raise SchemaVersionError(
                f"{db_path} is schema {version}{by}; this tpu_debug {__version__} reads schema "
                f"{SCHEMA_VERSION}. Re-record the run, or read it with the tpu_debug that wrote it."
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
