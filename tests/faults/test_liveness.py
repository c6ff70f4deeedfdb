"""Telling a live run from a dead one by the writer's lock (tracers/liveness.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from tpu_debug.tracers import liveness
from tpu_debug.tracers.liveness import WriterLock, lock_path, writer_alive
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter

from tpu_debug.core.errors import RunBusyError

pytestmark = pytest.mark.skipif(liveness.fcntl is None, reason="flock is POSIX")

HOLD = textwrap.dedent(
    """
    import os, sys, time
    from tpu_debug.tracers.liveness import WriterLock
    lock = WriterLock(sys.argv[1])
    lock.acquire()
    if sys.argv[2] == "fork":
        if os.fork() == 0:  # a child the writer forked, e.g. a DataLoader worker
            print(os.getpid(), flush=True)
            time.sleep(600)
            os._exit(0)
    else:
        print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(db, mode: str = "plain") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(db), mode], stdout=subprocess.PIPE, text=True)


def test_lock_held_in_this_process(tmp_path):
    db = tmp_path / "run.db"
    lock = WriterLock(db)
    assert lock.acquire()
    assert writer_alive(db)
    lock.release()
    assert not writer_alive(db)
    assert lock_path(db).exists()  # left in place: removing it could race a reader


def test_a_killed_writer_is_dead_whatever_its_pid(tmp_path):
    db = tmp_path / "run.db"
    proc = _holder(db)
    try:
        assert proc.stdout.readline() == "held\n"
        # the pid is alive and on this host, and the lock says so too
        assert writer_alive(db, pid=proc.pid, hostname=socket.gethostname())
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        # the pid is dead now; what matters is that the lock is free, even if the pid came back
        assert not writer_alive(db, pid=os.getpid(), hostname=socket.gethostname())
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_forked_child_does_not_keep_a_dead_writer_alive(tmp_path):
    db = tmp_path / "run.db"
    proc = _holder(db, "fork")
    child = int(proc.stdout.readline())
    try:
        assert writer_alive(db)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        os.kill(child, 0)  # the forked child still runs
        assert not writer_alive(db)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.kill(child, signal.SIGKILL)


def test_without_a_lock_file_the_pid_decides(tmp_path):
    db = tmp_path / "run.db"
    here = socket.gethostname()
    assert writer_alive(db, pid=os.getpid(), hostname=here)
    assert not writer_alive(db, pid=os.getpid(), hostname=here + "-elsewhere")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not writer_alive(db, pid=dead.pid, hostname=here)


@pytest.mark.quick
def test_a_second_writer_of_the_same_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(liveness, "_ACQUIRE_WAIT", 0.05)
    db = tmp_path / "run.db"
    first = RunWriter(db, {"name": "first"})
    try:
        with pytest.raises(
            RunBusyError,
            match=re.escape(
                f"{tmp_path}: another process is writing this run (it holds run.db-writer.lock). "
                "Record into a new run directory."
            ),
        ):
            WriterLock(db).acquire()
        assert RunQuery(db).metadata().status == "running"
    finally:
        first.close({"status": "finished"})
    assert RunQuery(db).metadata().status == "finished"
    assert not writer_alive(db)
