"""``python -m tpu_debug run script.py`` as a user runs it: a real process, killed or interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

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


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_")}
    env["PYTHONUNBUFFERED"] = "1"
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
