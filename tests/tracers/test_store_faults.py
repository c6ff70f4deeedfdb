"""Faults of the run store: each gives one line naming the problem and the fix, the traced
program goes on, and nothing already committed is lost. And the writer's bounded queue."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from tpu_debug.core.errors import RunAccessError, RunDamagedError, RunWriteError
from tpu_debug.core.records import TransferInfo
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import DB_NAME

from tpu_debug.cli import main

LOC = ev.SourceLocation("/work/user/train.py", 12, "step")


def _error(writer: RunWriter, where: str, message: str = "boom") -> ev.InternalErrorEvent:
    return ev.InternalErrorEvent(writer.new_id(), 0.0, None, 1, LOC, where, message)


def _op(writer: RunWriter, i: int = 0) -> ev.OpEvent:
    return ev.OpEvent(writer.new_id(), i * 1e-6, "eager", 1, LOC, "mul.Tensor", 1e-5, None)


def _small_disk(pages: int):
    """A ``RunWriter._connect`` whose database may grow by ``pages`` pages only: past that,
    SQLite's own SQLITE_FULL ("database or disk is full"), the error a full disk gives."""
    real = RunWriter._connect

    def connect(self):
        conn = real(self)
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={count + pages}")
        return conn

    return connect


# -- a disk that fills --------------------------------------------------------------------------


def test_full_disk_stops_recording_keeps_what_was_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(RunWriter, "_connect", _small_disk(4))
    db = tmp_path / DB_NAME
    writer = RunWriter(db, {"name": "demo"})
    kept = [_error(writer, f"early {i}") for i in range(5)]
    for e in kept:
        writer.put(e)
    assert writer.flush() and writer.error is None  # committed before the disk fills
    for i in range(2000):  # ~300 bytes each: far more than 4 pages of 16 KiB
        writer.put(_error(writer, f"late {i}", "x" * 300))
    assert writer.flush(timeout=30) is False
    assert isinstance(writer.error, RunWriteError)
    assert str(writer.error) == (
        f"recording to {db} stopped: the disk is full (database or disk is full). Free disk space, or "
        "choose another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR); the run keeps what was recorded "
        "before."
    )
    # after the error put() drops (and counts) instead of queueing without end
    dropped = writer.dropped
    for i in range(1000):
        writer.put(_op(writer, i))
    assert writer.dropped == dropped + 1000 and len(writer._queue) == 0
    writer.close({"status": "finished", "exit_status": 0})

    q = RunQuery(db)
    assert q.internal_errors() == kept  # the failed batch was rolled back whole, earlier commits stay
    meta = q.metadata()
    # the final metadata went in on a fresh connection (this "disk" refuses only the writer's)
    assert (meta.status, meta.dropped_events) == ("finished", writer.dropped)
    assert meta.recording_error == f"RunWriteError: {writer.error}"
    q.close()


def test_a_misuse_code_once_costs_nothing_the_batch_is_written_again(tmp_path, monkeypatch):
    """SQLite's SQLITE_MISUSE (InterfaceError) raised by a commit: the batch is written once
    more on a fresh connection, each event exactly once; a second one in a row is the run's
    error."""
    real = RunWriter._commit
    fails = {"left": 1}

    def commit(conn, batch, stats, prog_ids):
        if batch.events and fails["left"]:
            fails["left"] -= 1
            conn.execute("BEGIN")  # the transaction the failure leaves open
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch.events[:1])
            raise sqlite3.InterfaceError("bad parameter or other API misuse")
        real(conn, batch, stats, prog_ids)

    monkeypatch.setattr(RunWriter, "_commit", staticmethod(commit))
    db = tmp_path / DB_NAME
    writer = RunWriter(db, {"name": "demo"})
    sent = [_error(writer, f"e {i}") for i in range(5)]
    for e in sent:
        writer.put(e)
    assert writer.flush() and writer.error is None and fails["left"] == 0
    fails["left"] = 2
    writer.put(_error(writer, "late"))
    assert writer.flush() is False
    assert "InterfaceError: bad parameter or other API misuse" in str(writer.error)
    writer.close({"status": "finished", "exit_status": 0})
    q = RunQuery(db)
    assert q.internal_errors() == sent
    q.close()


def test_full_disk_under_a_trace_the_program_goes_on_and_exit_says_the_fix(tmp_path, monkeypatch, capsys):
    import torch

    import tpu_debug

    monkeypatch.setattr(RunWriter, "_connect", _small_disk(2))
    logdir = tmp_path / "runs"
    x = torch.arange(6.0).to("tpu")
    with tpu_debug.trace(logdir=logdir, op_events=True) as session:
        for i in range(3000):  # one executions row each: ~100 KiB, more than 2 pages
            x = x + 1
    assert x.cpu().tolist() == [3000.0 + i for i in range(6)]  # the program's work all happened
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tpu_debug:")]
    assert len(lines) == 1
    assert "stopped: the disk is full" in lines[0] and "Free disk space, or choose another logdir" in lines[0]
    meta = session.metadata()
    assert meta.status == "finished" and meta.recording_error.startswith("RunWriteError: recording to ")
    session.close()


# -- a damaged file ------------------------------------------------------------------------------


def _recorded_run(tmp_path: Path) -> Path:
    run = tmp_path / "20260101T000000.000Z-demo"
    run.mkdir()
    writer = RunWriter(run / DB_NAME, {"name": "demo"})
    for i in range(4000):
        writer.put(
            ev.TransferEvent(writer.new_id(), i * 1e-3, None, 1, LOC, TransferInfo("d2h", 4, (i % 7, 3), "float32", "item", 1e-5), op="item", implicit=True)
        )
        if i % 10 == 0:
            writer.put(_error(writer, f"site {i % 50}", "y" * 200))
    writer.close({"status": "finished", "exit_status": 0})
    assert writer.error is None
    return run


def _report_lines(run: Path, capsys) -> tuple[int, list[str], str]:
    code = main(["report", str(run)])
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


def test_truncated_database_one_line_no_traceback(tmp_path, capsys):
    run = _recorded_run(tmp_path)
    db = run / DB_NAME
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    code, err, _out = _report_lines(run, capsys)
    assert code == 1 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"tpu-debug report: {db}: not a readable tpu_debug run (")
    assert err[0].endswith("The file is damaged or truncated; re-record the run.")
    with pytest.raises(RunDamagedError, match="not a readable tpu_debug run"):
        RunQuery(db).transfers()


def test_bytes_overwritten_in_the_middle_one_line_no_traceback(tmp_path, capsys):
    run = _recorded_run(tmp_path)
    db = run / DB_NAME
    data = bytearray(db.read_bytes())
    rng = random.Random(1234)
    start, stop = len(data) // 3, 2 * len(data) // 3  # a third of the pages, headers and cells alike
    data[start:stop] = bytes(rng.randrange(256) for _ in range(stop - start))
    db.write_bytes(bytes(data))
    code, err, _out = _report_lines(run, capsys)
    assert code == 1 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"tpu-debug report: {db}: not a readable tpu_debug run (")
    assert err[0].endswith("The file is damaged or truncated; re-record the run.")
    q = RunQuery(db)
    with pytest.raises(RunDamagedError, match="not a readable tpu_debug run"):
        q.transfers()
        q.internal_errors()
    q.close()


def test_a_damaged_json_value_costs_its_event_and_is_named(tmp_path):
    run = _recorded_run(tmp_path)
    db = run / DB_NAME
    whole = RunQuery(db).events("transfer")
    conn = sqlite3.connect(db)
    (event_id,) = conn.execute("SELECT min(event_id) FROM transfers").fetchone()
    conn.execute("UPDATE transfers SET shape = '[3, ' WHERE event_id = ?", (event_id,))
    conn.commit()
    conn.close()
    q = RunQuery(db)
    # the damaged event is left out; every other one reads back as recorded
    assert [e.id for e in q.events("transfer")] == [e.id for e in whole if e.id != event_id]
    (damaged,) = q.damaged_rows()
    assert (damaged.kind, damaged.table, damaged.event_id) == ("transfer", "transfers", event_id)
    assert damaged.detail.startswith("JSONDecodeError: ")


# -- permissions ------------------------------------------------------------------------------------

_AS_USER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from tpu_debug.core.errors import TpuDebugError
    from tpu_debug.tracers.reading import RunQuery
    from tpu_debug.tracers.recording.run_writer import RunWriter

    what, run = sys.argv[1], Path(sys.argv[2])
    if os.access(run, os.W_OK if what == "write" else os.R_OK):
        print(json.dumps({"unrestricted": True}))
        sys.exit(0)
    try:
        if what == "write":
            RunWriter(run / "run.db", {"name": "demo"}).close()
        else:
            RunQuery(run / "run.db").events()
        print(json.dumps({"error": None}))
    except TpuDebugError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    """
)


def _as_restricted_user(tmp_path: Path, what: str, run: Path) -> dict:
    """Run the check in a child whose permission checks apply. As root, the child drops the
    capabilities that bypass file permissions (setpriv), since chmod does not restrict root."""
    script = tmp_path / "as_user.py"
    script.write_text(_AS_USER)
    cmd = [sys.executable, str(script), what, str(run)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root, where chmod does not restrict, and setpriv is missing to drop that")
        cmd = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result.get("unrestricted"):
        pytest.skip("chmod does not restrict this user here (os.access still grants it)")
    return result


def test_run_directory_without_permissions_one_line(tmp_path):
    run = _recorded_run(tmp_path)
    run.chmod(0)
    try:
        result = _as_restricted_user(tmp_path, "read", run)
    finally:
        run.chmod(0o755)
    db = run / DB_NAME
    assert result == {
        "error": RunAccessError.__name__,
        "message": f"{db}: permission denied. Give your user read access to {run} and the files in it "
        f"(chmod u+rx {run}; chmod u+r {db}), or read the run as the user who recorded it.",
    }


def test_read_only_run_directory_when_recording_one_line(tmp_path):
    run = tmp_path / "20260101T000000.000Z-ro"
    run.mkdir()
    run.chmod(0o555)
    try:
        result = _as_restricted_user(tmp_path, "write", run)
    finally:
        run.chmod(0o755)
    assert result["error"] == RunWriteError.__name__
    assert result["message"] == (
        f"cannot write the run database {run / DB_NAME}: permission denied. Give your user write access "
        f"to {run}, or choose another logdir (logdir= / --logdir / TPU_DEBUG_LOGDIR)."
    )


# -- a tracer that fails on every event -------------------------------------------------------------


def test_internal_errors_are_kept_bounded_per_where_with_a_count(tmp_path):
    db = tmp_path / DB_NAME
    writer = RunWriter(db, {"name": "demo"})
    for i in range(3 * ev.INTERNAL_ERRORS_KEPT):
        writer.put(_error(writer, "Recorder.on_execute", f"ValueError: {i}"))
    writer.put(_error(writer, "Recorder.on_transfer"))
    writer.close()
    q = RunQuery(db)
    errors = q.internal_errors()
    on_execute = [e for e in errors if e.where == "Recorder.on_execute"]
    assert [e.message for e in on_execute] == [f"ValueError: {i}" for i in range(ev.INTERNAL_ERRORS_KEPT)]
    assert [e.where for e in errors if e.where != "Recorder.on_execute"] == ["Recorder.on_transfer"]
    assert q.capped_counts("internal_error") == {"Recorder.on_execute": 3 * ev.INTERNAL_ERRORS_KEPT}
    assert q.counts()["internal_error"] == ev.INTERNAL_ERRORS_KEPT + 1
    q.close()


def test_a_recorder_failing_on_every_op_the_program_runs_to_the_end(tmp_path, monkeypatch):
    import torch
    from tpu_debug.tracers.recording.recorder import Recorder

    import tpu_debug

    def broken(self, *args):
        raise ValueError("tracer bug")

    monkeypatch.setattr(Recorder, "on_execute", broken)
    x = torch.zeros(4).to("tpu")
    n = 3 * ev.INTERNAL_ERRORS_KEPT
    with tpu_debug.trace(logdir=tmp_path / "runs") as session:
        for _ in range(n):
            x = x + 1
    assert x.cpu().tolist() == [float(n)] * 4
    errors = [e for e in session.internal_errors() if e.where == "Recorder.on_execute"]
    assert len(errors) == ev.INTERNAL_ERRORS_KEPT and errors[0].message == "ValueError: tracer bug"
    # every failing report counted, though only the first ones are rows
    total = session.capped_counts("internal_error")["Recorder.on_execute"]
    assert total >= n
    report = session.summary()
    assert f"{total:,} tracer error(s); the program was not affected" in report
    assert "Recorder.on_execute" in report and "ValueError: tracer bug" in report
    session.close()


# -- the writer's queue is bounded -------------------------------------------------------------------


class _Stall:
    """Holds the writer thread inside its next write until released."""

    def __init__(self, monkeypatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = RunWriter._write

        def write(writer, conn, state, items):
            if items:
                self.entered.set()
                self.release.wait(60)
            return real(writer, conn, state, items)

        monkeypatch.setattr(RunWriter, "_write", write)


def test_put_waits_then_drops_when_the_writer_is_stalled_and_the_count_is_recorded(tmp_path, monkeypatch):
    stall = _Stall(monkeypatch)
    db = tmp_path / DB_NAME
    writer = RunWriter(db, {"name": "demo"}, max_queue=100)
    writer.BACKPRESSURE_WAIT = 0.05
    first = _op(writer)
    writer.put(first)
    writer._wake.set()
    assert stall.entered.wait(30)  # the writer holds the first batch
    for i in range(1000):
        writer.put(_op(writer, i))
    assert len(writer._queue) <= 100  # bounded, however many were put
    assert writer.dropped == 1000 - 100
    stall.release.set()
    assert writer.flush(timeout=60) and writer.error is None
    # the writer moved again: puts queue again
    later = _op(writer)
    writer.put(later)
    writer.close({"status": "finished"})
    q = RunQuery(db)
    assert q.metadata().dropped_events == 900
    assert q.counts()["op"] == 1 + 100 + 1
    q.close()


def test_backpressure_waits_for_the_writer_rather_than_dropping(tmp_path):
    db = tmp_path / DB_NAME
    writer = RunWriter(db, {"name": "demo"}, max_queue=50)
    # a live writer takes each batch long before this: no drop, however slow the machine
    writer.BACKPRESSURE_WAIT = 60.0
    n = 20_000
    for i in range(n):
        writer.put(_op(writer, i))
        assert len(writer._queue) <= 50 + 1  # one flush marker or stop may pass the bound
    writer.close()
    assert writer.error is None and writer.dropped == 0
    q = RunQuery(db)
    assert q.counts()["op"] == n
    q.close()


def test_put_from_the_writer_thread_never_waits_for_itself(tmp_path, monkeypatch):
    real = RunWriter._write
    calls = []

    def write(writer, conn, state, items):
        if items and not calls:
            calls.append(1)
            for _ in range(10):  # the queue is full: a producer would wait, the writer must not
                writer.put(ev.InternalErrorEvent(writer.new_id(), 0.0, None, 1, None, "writer", "x"))
        return real(writer, conn, state, items)

    monkeypatch.setattr(RunWriter, "_write", write)
    writer = RunWriter(tmp_path / DB_NAME, {"name": "demo"}, max_queue=1)
    writer.BACKPRESSURE_WAIT = 30.0  # a wait would be seen: the test would take minutes
    writer.put(_op(writer))
    assert writer.flush(timeout=60)
    writer.close()
    assert writer.error is None and writer.dropped == 0
    assert len(RunQuery(tmp_path / DB_NAME).internal_errors()) == 10


def test_close_gives_up_on_a_stuck_writer(tmp_path, monkeypatch):
    stall = _Stall(monkeypatch)
    writer = RunWriter(tmp_path / DB_NAME, {"name": "demo"})
    writer.put(_op(writer))
    writer._wake.set()
    assert stall.entered.wait(30)
    writer.close({"status": "finished"}, timeout=0.2)
    assert isinstance(writer.error, RunWriteError)
    assert str(writer.error).startswith(
        f"the run writer did not finish writing {tmp_path / DB_NAME} within 0.2 s"
    )
    before = writer.dropped
    writer.put(_op(writer))  # closed: dropped, never queued
    assert writer.dropped == before + 1
    stall.release.set()


_SHUTDOWN = textwrap.dedent(
    """
    import atexit, sys, threading
    from pathlib import Path
    from tpu_debug.tracers import events as ev
    from tpu_debug.tracers.recording.run_writer import RunWriter

    release = threading.Event()
    real = RunWriter._write

    def write(writer, conn, state, items):
        if items:
            release.wait()  # stuck for good: the interpreter exits with it stuck
        return real(writer, conn, state, items)

    RunWriter._write = write
    writer = RunWriter(Path(sys.argv[1]), {"name": "demo"}, max_queue=10)

    def at_exit():
        for i in range(1000):
            writer.put(ev.OpEvent(writer.new_id(), 0.0, None, 1, None, "mul.Tensor", 1e-5))
        writer.close(timeout=0.5)
        print("dropped", writer.dropped, flush=True)

    atexit.register(at_exit)
    for i in range(5):
        writer.put(ev.OpEvent(writer.new_id(), 0.0, None, 1, None, "mul.Tensor", 1e-5))
    writer._wake.set()
    """
)


def test_puts_at_interpreter_exit_with_a_stuck_writer_do_not_hang(tmp_path):
    script = tmp_path / "shutdown.py"
    script.write_text(_SHUTDOWN)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / DB_NAME)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # kept: at most 10 queued, and what the writer's one batch took before it got stuck (the
    # 5 put before exit and at most 5 more, while the queue was below its bound)
    dropped = int(out.stdout.split()[-1])
    assert 1000 - 10 - 5 <= dropped <= 1000
