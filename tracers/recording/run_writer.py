"""The run writer: events into a run's SQLite database, from a background thread.

The traced program only appends to an in-memory queue (:meth:`RunWriter.put`); a
writer thread drains it, inserts in batches and commits at least every
``commit_interval`` seconds in WAL mode, so a run killed with SIGKILL keeps everything
recorded up to a fraction of a second before the kill. HLO text is stored once per
distinct program (content hash); events refer to it by id. The tables follow from each
event kind's declaration (``tracers/store.py``'s :class:`~tpu_debug.tracers.store.KindLayout`).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_debug.core.errors import RunBusyError, RunWriteError
from tpu_debug.tracers import events as _events
from tpu_debug.tracers.events import SCHEMA_VERSION, Event, SourceLocation
from tpu_debug.tracers.hlo import Program
from tpu_debug.tracers.liveness import WriterLock
from tpu_debug.tracers.store import (
    APPLICATION_ID,
    META_CAPPED,
    META_DROPPED,
    META_RECORDING_ERROR,
    KindLayout,
    layout,
    schema_statements,
)

__all__ = ["RunWriter", "StatRow"]

# (id, mode, name, signature, program hash or None, count, total seconds)
StatRow = tuple[int, str, str, str, "str | None", int, float]

def _write_error(path: Path, exc: BaseException, *, creating: bool = False) -> BaseException:
    """The one-line error a failed write becomes: what happened to which file, and what to do.
    Errors that are not the disk's or the file's (a bug) stay as they are."""
    if isinstance(exc, OSError) and not isinstance(exc, sqlite3.Error):
        if isinstance(exc, PermissionError):
            return RunWriteError(
                f"cannot write the run database {path}: permission denied. Give your user write access "
                f"to {path.parent}, or choose another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR)."
            )
        return RunWriteError(
            f"cannot write the run database {path}: {exc.strerror or exc}. "
            "Choose another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR)."
        )
    if not isinstance(exc, sqlite3.Error):
        return exc
    code = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    lowered = text.lower()
    if code == "SQLITE_FULL" or "disk is full" in lowered:
        return RunWriteError(
            f"recording to {path} stopped: the disk is full ({text}). Free disk space, or choose "
            "another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR); the run keeps what was recorded before."
        )
    if (
        code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"))
        or "readonly" in lowered
        or "unable to open" in lowered
    ):
        return RunWriteError(
            f"cannot write the run database {path} ({text}): no permission, or a read-only file system. "
            f"Give your user write access to {path.parent}, or choose another logdir "
            "(logdir= / --logdir / TPU_DEBUG_LOGDIR)."
        )
    if code.startswith("SQLITE_IOERR") or "disk i/o error" in lowered:
        return RunWriteError(
            f"recording to {path} stopped: the disk failed a write ({text}). Check the disk, or choose "
            "another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR); the run keeps what was recorded before."
        )
    what = "creating" if creating else "recording to"
    return RunWriteError(
        f"{what} {path} failed ({type(exc).__name__}: {text}). Choose another logdir "
        "(logdir= / --logdir / TPU_DEBUG_LOGDIR); the run keeps what was recorded before."
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

    ``put`` does not wait for the disk: it appends to a queue the writer thread
    drains. When the queue holds ``max_queue`` items (the writer has fallen far
    behind), ``put`` waits for the writer to take a batch, at most
    ``BACKPRESSURE_WAIT`` seconds, and drops the event when it does not; after a
    writer error, or after ``close``, ``put`` drops events. Dropped events are
    counted (``dropped``) and the count is recorded in the run's meta when the
    database still takes writes. ``flush`` waits until everything put so far is
    committed; ``close`` flushes, writes the final metadata and stops the thread,
    waiting at most ``timeout`` seconds. An error inside the writer never
    reaches the traced program: it is kept in ``error`` (a
    :class:`~tpu_debug.core.errors.RunWriteError` saying what to do, when the disk or
    the file failed) and recording stops; everything committed before stays.

    Raises (from the constructor):
        RunWriteError: the database cannot be created (no permission, no space).

    Example::

        writer = RunWriter(Path("run.db"), {"name": "demo"})
        writer.put(event)
        writer.close({"exit_status": 0})
    """

    MAX_BATCH = 50_000
    MAX_QUEUE = 200_000
    BACKPRESSURE_WAIT = 1.0

    def __init__(
        self,
        db_path: Path,
        metadata: dict[str, Any],
        *,
        commit_interval: float = 0.25,
        max_queue: int | None = None,
    ) -> None:
        self.path = Path(db_path)
        self.commit_interval = commit_interval
        self.error: BaseException | None = None
        self.dropped = 0
        self._drop_lock = threading.Lock()
        # a deque, not a queue.Queue: append never blocks and never wakes the writer, so a
        # busy traced thread does not hand the GIL to the writer on every event
        self._queue: collections.deque = collections.deque()
        self._max_queue = max_queue if max_queue is not None else self.MAX_QUEUE
        # put() appends while the queue is shorter than this; 0 sends every put to the slow path
        self._open_below = self._max_queue
        self._space = threading.Condition(threading.Lock())
        self._batches = 0  # batches the writer took; a producer that timed out waits again only on progress
        self._stalled_at = -1
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
        try:
            self._writer_lock.acquire()
            self._create(metadata)
        except RunBusyError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self._writer_lock.release()
            raise _write_error(self.path, exc, creating=True) from None
        except BaseException:
            self._writer_lock.release()
            raise
        self._thread = threading.Thread(target=self._run, name="tpu_debug-run-writer", daemon=True)
        self._thread.start()

    # -- producer side (any thread) -------------------------------------------------

    def put(self, event: Event) -> None:
        """Queue ``event`` for writing (waits only when the writer is far behind, see the class)."""
        queue = self._queue
        if len(queue) < self._open_below:
            queue.append(event)
        else:
            self._put_slow(event)
        if self._listeners:
            for listener in self._listeners:
                listener(event)

    def _put_slow(self, item: Any) -> None:
        if self.error is not None or self._closed:
            self._drop(item)
            return
        thread = self._thread
        if threading.get_ident() == thread.ident:
            self._queue.append(item)  # the writer cannot wait for itself; it drains this batch next
            return
        if sys.is_finalizing() or not thread.is_alive():
            self._drop(item)  # nothing will drain the queue any more
            return
        if self._stalled_at == self._batches:
            self._drop(item)  # an earlier put waited in vain and the writer has not moved since
            return
        self._wake.set()
        deadline = time.monotonic() + self.BACKPRESSURE_WAIT
        with self._space:
            while len(self._queue) >= self._max_queue:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.error is not None or not thread.is_alive():
                    self._stalled_at = self._batches
                    break
                self._space.wait(min(remaining, 0.1))
            else:
                self._queue.append(item)
                return
        self._drop(item)

    def _drop(self, item: Any) -> None:
        if isinstance(item, Event):
            with self._drop_lock:  # producers on several threads may drop at once
                self.dropped += 1

    def _enqueue(self, item: Any) -> None:
        if len(self._queue) < self._open_below:
            self._queue.append(item)
        else:
            self._put_slow(item)

    # exporters (TensorBoard) hear each event as it is recorded, on the recording
    # thread; a listener must not raise.
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
        self._enqueue(program)
        return program.hash

    def has_program(self, content_hash: str) -> bool:
        return content_hash in self._programs_seen

    def set_meta(self, **items: Any) -> None:
        """Queue metadata updates (JSON-encodable values)."""
        self._enqueue(_Meta(items))

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
        self._queue.append(marker)  # past the bound: a marker is tiny, and waiting for room could deadlock
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not marker.done.wait(0.1):
            if self.error is not None or not self._thread.is_alive():
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return self.error is None

    def close(self, metadata: dict[str, Any] | None = None, *, timeout: float | None = 120.0) -> None:
        """Flush, record ``metadata``, checkpoint the WAL and stop the writer thread (idempotent).

        Waits at most ``timeout`` seconds for the writer; a writer still busy then
        is left behind (a daemon thread) and ``error`` says so.
        """
        if self._closed:
            return
        self._closed = True
        self._open_below = 0  # from now on put() drops
        if metadata:
            self._queue.append(_Meta(metadata))
        self._queue.append(_STOP)
        self._wake.set()
        # joined in slices: Python acts on a signal between bytecodes, and one that lands just
        # before a long blocking join would wait for all of it (Ctrl-C during the close)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread.is_alive():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                break
            self._thread.join(left)
        if self._thread.is_alive():
            if self.error is None:
                self.error = RunWriteError(
                    f"the run writer did not finish writing {self.path} within {timeout} s; the run "
                    "keeps what was committed before. Check the disk holding the logdir."
                )
            return
        if self.error is not None:
            for item in self._queue:  # put in the instant the writer failed, never written
                self._drop(item)
            self._queue.clear()
            self._note_after_error(metadata or {})

    def _note_after_error(self, metadata: dict[str, Any]) -> None:
        """After a writer error, try once to record the final metadata, the error and the drops
        on a fresh connection (a transient fault may have passed; a full disk may refuse it)."""
        items = {
            **metadata,
            META_RECORDING_ERROR: f"{type(self.error).__name__}: {self.error}",
            META_DROPPED: self.dropped,
        }
        conn = None
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=1.0)
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in items.items()]
            )
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError, TypeError, ValueError):
            pass  # the error itself is in self.error, which the trace reports
        finally:
            if conn is not None:
                conn.close()

    # -- writer thread --------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """The writer thread's connection."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        # OFF: a killed process loses nothing the OS already has; only a machine crash
        # could damage the run, and then the run is not what matters (no fsync stalls)
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-65536")  # up to 64 MiB: index pages stay in memory
        return conn

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
            for statement in schema_statements():
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
        items: list = []
        try:
            conn = self._connect()
            stop = False
            pop = self._queue.popleft
            while not stop:
                if not self._queue:
                    self._wake.wait(self.commit_interval)
                self._wake.clear()
                items = []
                try:
                    for _ in range(self.MAX_BATCH):
                        items.append(pop())
                except IndexError:
                    pass
                self._batches += 1
                if len(self._queue) < self._max_queue:
                    with self._space:
                        self._space.notify_all()
                try:
                    flushes, stop = self._write(conn, state, items)
                except sqlite3.InterfaceError:
                    # SQLite's "API misuse" code comes from the state of the interpreter's
                    # per-connection statement cache, not from the rows (a commit that failed so
                    # once has been seen to pass on its next try): the batch is rolled back with
                    # the connection and written once more on a fresh one; a second failure is
                    # the run's error as any other
                    conn.close()
                    conn = None
                    conn = self._connect()
                    flushes, stop = self._write(conn, state, items, again=True)
                items = []
                for marker in flushes:
                    marker.done.set()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except BaseException as exc:  # noqa: BLE001 - the traced program must go on; the error is reported
            self.error = _write_error(self.path, exc)
            self._open_below = 0  # from now on put() drops
            self._discard(items)
        finally:
            if conn is not None:
                conn.close()  # rolls back the batch that failed; every earlier commit stays
            self._writer_lock.release()  # after the final commit: readers now see how the run ended
            with self._space:
                self._space.notify_all()

    def _discard(self, items: list) -> None:
        """After an error: count what will never be written, release whoever waits on a flush."""
        queued: list = []
        while True:
            try:
                queued.append(self._queue.popleft())
            except IndexError:
                break
        for item in itertools.chain(items, queued):
            if isinstance(item, _Flush):
                item.done.set()
            else:
                self._drop(item)

    def _write(
        self, conn: sqlite3.Connection, st: _WriteState, items: list, *, again: bool = False
    ) -> tuple[list[_Flush], bool]:
        """Store one batch of queued items in one transaction; returns the flush markers it
        passed and whether it met the stop marker. ``again``: the same items after a failed
        commit, whose rows the state already holds."""
        if again:
            batch, stats = st.last_batch
        else:
            batch = self._collect(st, items)
            self._note_counts(st, batch)
            stats = self._stats_source() if self._stats_source is not None else []
            if stats or st.waiting_stats:
                stats = st.stats_to_store(stats, final=batch.stop)
            st.last_batch = (batch, stats)
        if batch.has_rows() or stats:
            self._commit(conn, batch, stats, st.programs)
        st.last_batch = None
        return batch.flushes, batch.stop

    def _collect(self, st: _WriteState, items: list) -> _Batch:
        """The rows of ``items``, table by table."""
        batch = _Batch()
        executions = batch.executions
        executions_kinds = st.executions_kinds
        busiest = st.busiest  # an identity test is cheaper than the set lookup
        by_object = st.location_objects
        prog_ids = st.programs
        for item in items:
            t = type(item)
            kind = None
            if t is not busiest and t not in executions_kinds:
                kind = st.layouts.get(t)
                if kind is None and isinstance(item, Event):
                    kind = self._layout_for(st, t, batch.new_tables)
                if kind is None:
                    self._collect_other(st, batch, item)
                    continue
            # locations are interned by the finder: an identity hit skips hashing the dataclass
            location = item.location
            hit = by_object.get(id(location))
            lid = hit[1] if hit is not None and hit[0] is location else st.location_id(location, batch)
            if kind is None or kind.executions:  # the high-volume kinds: plain attribute reads, one row
                executions.append(
                    (item.id, item.ts, item.mode, item.thread, lid, item.name, item.seconds, prog_ids.get(item.program))
                )
            elif kind.cap is None or st.admit(kind, item):
                self._collect_event(st, batch, kind, item, lid)
        return batch

    @staticmethod
    def _collect_event(st: _WriteState, batch: _Batch, kind: KindLayout, item: Any, lid: int | None) -> None:
        """An event's header row, its detail row and its child records' rows."""
        name, seconds, program = kind.header_of(item)
        batch.events.append(
            (item.id, kind.kind, item.ts, item.mode, item.thread, lid, name, seconds, st.programs.get(program))
        )
        if kind.table is not None:
            batch.details.setdefault(kind.insert_sql, []).append(kind.row(item))
        for child, sql in zip(kind.children, kind.child_insert_sql):
            records = child.records(item)
            if records:
                batch.details.setdefault(sql, []).extend((item.id, i, *child.row(r)) for i, r in enumerate(records))

    @staticmethod
    def _collect_other(st: _WriteState, batch: _Batch, item: Any) -> None:
        """What the queue holds besides events: programs, metadata and the writer's markers."""
        t = type(item)
        if t is Program:
            if item.hash in st.programs:
                return
            pid = st.programs[item.hash] = len(st.programs) + 1
            batch.programs.append((pid, item.hash, item.mode, item.name, item.stablehlo, item.hlo, item.instructions))
            batch.fx_nodes.extend(
                (pid, n.name, i, n.target, st.location_id(n.location, batch)) for i, n in enumerate(item.fx_nodes)
            )
            batch.node_ins.extend((pid, node, ins) for node, ins in item.node_instructions)
        elif t is _Meta:
            batch.meta.extend((k, json.dumps(v)) for k, v in item.items.items())
        elif t is _Flush:
            batch.flushes.append(item)
        elif item is _STOP:
            batch.stop = True
        else:
            raise TypeError(f"the run writer cannot store {t.__name__} objects")

    def _note_counts(self, st: _WriteState, batch: _Batch) -> None:
        """Metadata rows for the counts that changed: events over a kind's cap, events dropped."""
        if st.capped_changed:
            batch.meta.append((META_CAPPED, json.dumps(st.capped_meta())))
            st.capped_changed = False
        if self.dropped != st.dropped_recorded:
            st.dropped_recorded = self.dropped
            batch.meta.append((META_DROPPED, json.dumps(self.dropped)))

    @staticmethod
    def _commit(conn: sqlite3.Connection, batch: _Batch, stats: list[StatRow], prog_ids: dict) -> None:
        conn.execute("BEGIN")
        for statement in batch.new_tables:
            conn.execute(statement)
        if batch.new_locations:
            conn.executemany("INSERT INTO locations VALUES (?, ?, ?, ?)", batch.new_locations)
        if batch.programs:
            conn.executemany("INSERT INTO programs VALUES (?, ?, ?, ?, ?, ?, ?)", batch.programs)
            conn.executemany("INSERT OR IGNORE INTO fx_nodes VALUES (?, ?, ?, ?, ?)", batch.fx_nodes)
            conn.executemany("INSERT OR IGNORE INTO node_instructions VALUES (?, ?, ?)", batch.node_ins)
        if batch.events:
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch.events)
        if batch.executions:
            conn.executemany("INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch.executions)
        for sql, rows in batch.details.items():
            conn.executemany(sql, rows)
        if stats:
            conn.executemany(
                "INSERT OR REPLACE INTO op_stats VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(i, mode, name, sig, prog_ids.get(h) if h else None, n, sec) for i, mode, name, sig, h, n, sec in stats],
            )
        if batch.meta:
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", batch.meta)
        conn.execute("COMMIT")

    @staticmethod
    def _layout_for(st: _WriteState, cls: type, new_tables: list[str]) -> KindLayout:
        """The layout of an event class first seen in this run; a kind registered after the
        run's database was created gets its tables now."""
        if _events.EVENT_TYPES.get(getattr(cls, "kind", None)) is not cls:
            raise TypeError(
                f"the run writer cannot store {cls.__name__} objects: register the class with "
                "@register_event (tpu_debug.tracers.events)"
            )
        kind = st.layouts[cls] = layout(cls)
        if kind.executions:
            st.executions_kinds.add(cls)
            if st.busiest is None:
                st.busiest = cls
        new_tables.extend(kind.create_statements())  # IF NOT EXISTS: a no-op for the kinds of _create
        return kind


class _Batch:
    """The rows one write of the queue produces, table by table."""

    __slots__ = (
        "details",
        "events",
        "executions",
        "flushes",
        "fx_nodes",
        "meta",
        "new_locations",
        "new_tables",
        "node_ins",
        "programs",
        "stop",
    )

    def __init__(self) -> None:
        self.flushes: list[_Flush] = []
        self.stop = False
        self.events: list[tuple] = []
        self.executions: list[tuple] = []
        self.details: dict[str, list[tuple]] = {}  # insert statement -> rows
        self.programs: list[tuple] = []
        self.fx_nodes: list[tuple] = []
        self.node_ins: list[tuple] = []
        self.meta: list[tuple] = []
        self.new_locations: list[tuple] = []
        self.new_tables: list[str] = []

    def has_rows(self) -> bool:
        return bool(self.events or self.executions or self.programs or self.meta or self.new_tables)


class _WriteState:
    __slots__ = (
        "busiest",
        "capped",
        "capped_changed",
        "dropped_recorded",
        "executions_kinds",
        "last_batch",
        "layouts",
        "location_objects",
        "locations",
        "programs",
        "waiting_stats",
    )

    def __init__(self) -> None:
        self.locations: dict[SourceLocation, int] = {}
        self.location_objects: dict[int, tuple[SourceLocation, int]] = {}
        self.programs: dict[str | None, int] = {}
        self.layouts: dict[type, KindLayout] = {}
        self.executions_kinds: set[type] = set()
        self.busiest: type | None = None  # the first "executions" kind seen
        self.capped: dict[str, dict[Any, int]] = {}  # per capped kind: events seen per value
        self.capped_changed = False
        self.dropped_recorded = 0
        self.waiting_stats: dict[int, StatRow] = {}  # op_stats rows whose program is not stored yet
        self.last_batch: tuple[_Batch, list[StatRow]] | None = None  # collected, not yet committed

    def stats_to_store(self, stats: list[StatRow], *, final: bool) -> list[StatRow]:
        """The op_stats rows to store with this batch.

        The counters are read after the batch was taken from the queue: an executable
        compiled and run in between has counts but its program is still queued. Its row
        waits for the batch that stores the program (stored now it would keep no program
        id: a row is written again only when its counts change). The last batch stores
        whatever is left.
        """
        if self.waiting_stats:
            merged = self.waiting_stats
            self.waiting_stats = {}
            merged.update((row[0], row) for row in stats)  # a newer reading replaces an older one
            stats = list(merged.values())
        if final:
            return stats
        ready = []
        for row in stats:
            if row[4] and row[4] not in self.programs:
                self.waiting_stats[row[0]] = row
            else:
                ready.append(row)
        return ready

    def location_id(self, location: SourceLocation | None, batch: _Batch) -> int | None:
        """The id of ``location`` in this run, a new row in ``batch`` the first time."""
        if location is None:
            return None
        lid = self.locations.get(location)
        if lid is None:
            lid = self.locations[location] = len(self.locations) + 1
            batch.new_locations.append((lid, location.file, location.line, location.function))
        self.location_objects[id(location)] = (location, lid)
        return lid

    def admit(self, kind: KindLayout, event: Any) -> bool:
        """Count ``event`` under its kind's cap; False once its value has had its share of rows."""
        field, limit = kind.cap  # type: ignore[misc]
        counts = self.capped.setdefault(kind.kind, {})
        value = getattr(event, field)
        n = counts[value] = counts.get(value, 0) + 1
        if n > limit:
            self.capped_changed = True
            return False
        return True

    def capped_meta(self) -> dict[str, dict[str, int]]:
        limits = {k.kind: k.cap[1] for k in self.layouts.values() if k.cap is not None}
        return {
            kind: {str(value): n for value, n in counts.items() if n > limits[kind]}
            for kind, counts in self.capped.items()
            if any(n > limits[kind] for n in counts.values())
        }


