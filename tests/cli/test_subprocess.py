"""``python -m tpu_debug run script.py`` as a user runs it: a real process, killed or interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tpu_debug

STEPS = textwrap.dedent(
    """
    import sys
    import torch
    import tpu_debug

    x = torch.randn(8, 8).to("tpu")
    print("argv", sys.argv[1:], flush=True)
    i = 0
    while True:
        y = x * 2.0 + 1.0
        y.sum().item()
        i += 1
        print(i, flush=True)
        if sys.argv[1:] == ["finite"] and i == 3:
            raise RuntimeError("stop at " + str(i))
    """
)


@pytest.fixture(autouse=True)
def sigint_not_ignored():
    """Children start with SIGINT at its default even when pytest was started with it ignored
    (a background job of a shell without job control): an ignored signal stays ignored across
    exec, and a program that ignores SIGINT keeps ignoring it under tpu-debug run."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # exec'd children get SIG_DFL
    yield
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    env["PYTHONUNBUFFERED"] = "1"
    # XLA on CPU even where a libtpu wheel is installed: loading it prints warnings on stderr
    # (compared with plain python's below), and its failure handler aborts the process when a
    # Ctrl-C lands in the backward pass
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _start(tmp_path, *args):
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    return subprocess.Popen(
        [sys.executable, "-m", "tpu_debug", "run", "steps.py", *args],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Lines:
    """Reads a child's stdout in a thread, stamping each line with the time it arrived."""

    def __init__(self, stream):
        self.lines: list[tuple[float, str]] = []
        self.first_step = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            if line.strip().isdigit():
                self.first_step.set()

    def steps_before(self, moment: float) -> int:
        return max((int(s) for t, s in self.lines if s.isdigit() and t <= moment), default=0)

    def join(self):
        self._thread.join(timeout=30)


@pytest.mark.quick
def test_same_output_and_traceback_as_python(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    plain = subprocess.run(
        [sys.executable, "steps.py", "finite"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    traced = subprocess.run(
        [sys.executable, "-m", "tpu_debug", "run", "steps.py", "finite"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == traced.returncode == 1
    assert traced.stdout == plain.stdout == "argv ['finite']\n1\n2\n3\n"
    traceback = plain.stderr.strip()
    assert traceback.endswith("RuntimeError: stop at 3")
    assert traced.stderr.startswith(traceback + "\n")
    assert "Top ops by time" in traced.stderr
    session = tpu_debug.open_run(logdir=tmp_path / "tpu_debug_runs")
    meta = session.metadata()
    assert (meta.status, meta.exit_status, meta.argv) == ("failed", 1, ("steps.py", "finite"))
    assert session.ops(name="mul.Tensor")[0].count == 3
    assert len(session.transfers(direction="d2h")) == 3


def test_sigkill_leaves_a_readable_run(tmp_path):
    proc = _start(tmp_path)
    lines = _Lines(proc.stdout)
    try:
        assert lines.first_step.wait(120), proc.stderr.read()
        time.sleep(2.0)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.join()
    assert proc.returncode == -signal.SIGKILL
    expected = lines.steps_before(killed_at - 1.0)
    assert expected > 0
    session = tpu_debug.open_run(logdir=tmp_path / "tpu_debug_runs")
    meta = session.metadata()
    assert meta.status == "killed" and meta.end_time is None
    items = len(session.transfers(op="item"))
    assert items >= expected
    assert session.ops(name="mul.Tensor")[0].count >= expected
    assert session.compiles(name="mul.Tensor")[0].location.file == str(tmp_path / "steps.py")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery is POSIX")
def test_sigint_flushes_everything(tmp_path):
    proc = _start(tmp_path)
    lines = _Lines(proc.stdout)
    try:
        assert lines.first_step.wait(120), proc.stderr.read()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.join()
    stderr = proc.stderr.read()
    assert proc.returncode == 130, stderr
    assert "KeyboardInterrupt" in stderr and "Top ops by time" in stderr
    printed = lines.steps_before(time.monotonic())
    session = tpu_debug.open_run(logdir=tmp_path / "tpu_debug_runs")
    meta = session.metadata()
    assert (meta.status, meta.exit_status) == ("interrupted", 130)
    items = len(session.transfers(op="item"))
    assert printed <= items <= printed + 1
    mul = session.ops(name="mul.Tensor")[0].count
    assert printed <= mul <= printed + 1


STUCK_CLOSE = textwrap.dedent(
    """
    import threading
    import torch
    from tpu_debug.tracers.recording import run_writer as store
    from tpu_debug.tracing import active_trace

    # the run's final write never ends (a disk that stopped answering), and close() would wait
    # for it without end: only giving up can end this program
    never = threading.Event()
    write, close = store.RunWriter._write, store.RunWriter.close
    def stuck_write(self, conn, state, items):
        if any(item is store._STOP for item in items):
            print("stuck", flush=True)  # close() has begun: the main thread waits for this write
            never.wait()
        return write(self, conn, state, items)
    store.RunWriter._write = stuck_write
    store.RunWriter.close = lambda self, metadata=None, timeout=None: close(self, metadata, timeout=None)

    x = torch.ones(4).to("tpu")
    x.sum().item()
    assert len(active_trace().session.transfers(op="item")) == 1  # a live query commits first
    print("closing", flush=True)
    """
)


class _Stderr:
    """Reads a child's stderr in a thread; ``wait_for(text)`` until a line holds it."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, text: str, proc, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(text in line for line in self.lines):
                assert proc.poll() is None and time.monotonic() < deadline, "\n".join(self.lines)
                self._changed.wait(0.1)
            return next(line for line in self.lines if text in line)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery is POSIX")
def test_second_ctrl_c_during_the_close_stops_waiting(tmp_path):
    (tmp_path / "stuck.py").write_text(STUCK_CLOSE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_debug", "run", "stuck.py"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr = _Stderr(proc.stderr)
    try:
        assert proc.stdout.readline() == "closing\n", "\n".join(stderr.lines)
        assert proc.stdout.readline() == "stuck\n", "\n".join(stderr.lines)
        proc.send_signal(signal.SIGINT)  # held: the run is being closed
        note = stderr.wait_for("SIGINT received", proc)
        (run_dir,) = (tmp_path / "tpu_debug_runs").iterdir()
        run_db = Path("tpu_debug_runs") / run_dir.name / "run.db"  # as the writer names it
        assert note == (
            f"tpu_debug: SIGINT received; writing the end of the run to {run_db} first "
            "(Ctrl-C again to stop waiting)"
        )
        proc.send_signal(signal.SIGINT)
        proc.wait(300)  # without giving up it would wait for ever: a hang fails here
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr._thread.join(30)
    assert proc.returncode == 130, "\n".join(stderr.lines)
    assert (
        f"tpu_debug: stopped waiting for the run to be written; {run_db} keeps what was committed "
        "before, and without its end it reads as 'killed'."
    ) in stderr.lines
    assert not any("Traceback" in line for line in stderr.lines), "\n".join(stderr.lines)
    session = tpu_debug.open_run(logdir=tmp_path / "tpu_debug_runs")
    assert session.metadata().status == "killed"
    assert len(session.transfers(op="item")) == 1  # committed before the close began
    session.close()


SIGTERM_HANDLED = textwrap.dedent(
    """
    import signal
    import sys
    import torch

    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    x = torch.ones(4).to("tpu")
    steps = 0
    while not stop:
        x.sum().item()
        steps += 1
        print(steps, flush=True)
    print("stopped cleanly after", steps, "steps", flush=True)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM handlers are POSIX")
def test_a_scripts_own_sigterm_handler_decides(tmp_path):
    (tmp_path / "graceful.py").write_text(SIGTERM_HANDLED)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_debug", "run", "--no-report", "graceful.py"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _Lines(proc.stdout)
    try:
        assert lines.first_step.wait(300), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.join()
    assert proc.returncode == 0, proc.stderr.read()
    last = lines.lines[-1][1]
    assert last.startswith("stopped cleanly after ")
    steps = int(last.split()[-2])
    session = tpu_debug.open_run(logdir=tmp_path / "tpu_debug_runs")
    assert session.metadata().status == "finished"
    assert len(session.transfers(op="item")) == steps
    session.close()
