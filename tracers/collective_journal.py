"""A rank's last collective calls, written before it enters them, so that they outlive a SIGKILL.

The run store commits its events from a writer thread every quarter of a second: a rank
killed while it hangs in a collective (by a launcher, the out-of-memory killer, a user's
``kill -9``) loses the calls of its last moments, which are the ones that say where the
ranks parted. So the recorder also writes each ``collective_call`` and ``collective_done``
to a small file beside the run's database, ``collectives.journal``, on the calling thread
before the call proceeds: one ``pwrite`` into a ring of fixed-size slots, which the kernel
keeps once the call returns, whatever happens to the process next. The reader
(:func:`read_journal`) gives back the records the database does not hold;
``tracers/reading/collective_calls.py`` merges them into the rank's calls.

Each slot holds one JSON object padded with spaces to :data:`SLOT` bytes and a newline;
the ring holds the last :data:`SLOTS` records (a record too long for a slot keeps its first
tensor shapes only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

from tpu_debug.core.records import CollectiveDone, CollectiveInfo
from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDoneEvent, SourceLocation

__all__ = [
    "JOURNAL_NAME",
    "SLOT",
    "SLOTS",
    "CollectiveJournal",
    "call_record",
    "done_record",
    "journal_events",
    "read_journal",
]

JOURNAL_NAME = "collectives.journal"
SLOT = 1024
SLOTS = 256


class CollectiveJournal:
    """The ring file of one run (created at the first record; ``run_dir`` None: none kept)."""

    def __init__(self, run_dir: Path | None) -> None:
        self.path = Path(run_dir) / JOURNAL_NAME if run_dir is not None else None
        self._fd: int | None = None
        self._n = 0
        self._lock = threading.Lock()
        self.failed = run_dir is None

    def write(self, record: dict[str, Any]) -> None:
        """Write ``record`` into the next slot (a no-op once writing failed: the run store
        still records the call)."""
        if self.failed:
            return
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                n = self._n
                self._n += 1
                os.pwrite(self._fd, _slot({"n": n, **record}), (n % SLOTS) * SLOT)
            except OSError:
                self.failed = True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _slot(record: dict[str, Any]) -> bytes:
    data = json.dumps(record, separators=(",", ":")).encode()
    if len(data) >= SLOT and record.get("shapes"):
        shapes = list(record["shapes"])
        while len(data) >= SLOT and len(shapes) > 1:
            shapes = shapes[: len(shapes) // 2]
            data = json.dumps({**record, "shapes": shapes, "shapes_cut": True}, separators=(",", ":")).encode()
    if len(data) >= SLOT:
        data = json.dumps({"n": record["n"], "kind": record.get("kind"), "cut": True}).encode()
    return data.ljust(SLOT - 1) + b"\n"


def read_journal(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's journal, oldest first (empty when it has none)."""
    try:
        raw = (Path(run_dir) / JOURNAL_NAME).read_bytes()
    except OSError:
        return []
    records = []
    for i in range(0, len(raw) - SLOT + 1, SLOT):
        try:
            record = json.loads(raw[i:i + SLOT])
        except ValueError:  # a slot the kernel had not written when the machine went down
            continue
        if isinstance(record, dict) and "n" in record and not record.get("cut"):
            records.append(record)
    return sorted(records, key=lambda r: r["n"])


def call_record(e: CollectiveCallEvent) -> dict[str, Any]:
    """A ``collective_call`` event as a journal record."""
    loc = e.location
    return {"kind": "call", "ts": e.ts, "thread": e.thread, **dataclasses.asdict(e.call),
            "where": [loc.file, loc.line, loc.function] if loc is not None else None}


def done_record(e: CollectiveDoneEvent) -> dict[str, Any]:
    """A ``collective_done`` event as a journal record."""
    return {"kind": "done", "ts": e.ts, "thread": e.thread, **dataclasses.asdict(e.done)}


def journal_events(run_dir: Path) -> tuple[list[CollectiveCallEvent], list[CollectiveDoneEvent]]:
    """The calls and returns a run's journal holds, as events (their ids are negative: the
    run store never gave them one)."""
    calls: list[CollectiveCallEvent] = []
    dones: list[CollectiveDoneEvent] = []
    for r in read_journal(run_dir):
        try:
            if r.get("kind") == "call":
                where = r.get("where")
                calls.append(CollectiveCallEvent(
                    -1 - r["n"], float(r["ts"]), None, int(r["thread"]),
                    SourceLocation(where[0], int(where[1]), where[2]) if where else None,
                    CollectiveInfo(r["op"], r["group"], tuple(r["ranks"]), int(r["rank"]), int(r["seq"]),
                                   tuple(tuple(s) for s in r["shapes"]), r["dtype"], int(r["nbytes"]),
                                   r.get("reduce_op"), r.get("peer")),
                ))
            elif r.get("kind") == "done":
                dones.append(CollectiveDoneEvent(
                    -1 - r["n"], float(r["ts"]), None, int(r["thread"]), None,
                    CollectiveDone(r["op"], r["group"], int(r["rank"]), int(r["seq"]), float(r["seconds"]),
                                   r.get("last_rank"), r.get("waited")),
                ))
        except (KeyError, TypeError, ValueError, IndexError):  # a record of another layout
            continue
    return calls, dones
