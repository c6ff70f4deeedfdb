"""The processes a serving verb starts end with it, however it ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter

LAUNCHER = "import sys; from tpu_debug.cli import main; sys.exit(main())"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _tiny_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "20260131T120000.000Z-tiny"
    run_dir.mkdir(parents=True)
    meta = {
        "name": "tiny",
        "platform": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "argv": ["tiny.py"],
        "cwd": str(tmp_path),
        "start_time": "2026-01-31T12:00:00.000+00:00",
    }
    RunWriter(run_dir / DB_NAME, meta).close({"status": "finished", "exit_status": 0, "duration": 1.0})
    (run_dir / "tensorboard").mkdir()
    return run_dir


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # reparented and not reaped: it ended all the same


def _wait(ready, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.1)
    return value


def _kill(pid: int | None) -> None:
    # a child left running (the failure this file looks for) is not left behind by the test
    if pid is not None and not _ended(pid):
        os.kill(pid, signal.SIGKILL)


def _signals_as_a_terminal_leaves_them() -> None:
    # a runner started under nohup (or any that ignores SIGHUP) passes the ignoring on through
    # exec; the verb is then right to keep serving after SIGHUP, which is not the case tested here
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _child_running(parent: subprocess.Popen, marker: str) -> int:
    def found() -> int | None:
        assert parent.poll() is None, f"the parent exited with {parent.returncode}"
        return next((c for c in _children(parent.pid) if marker in _cmdline(c)), None)

    return _wait(found, f"a child running {marker}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_tensorboard_stopped_with_sigterm_leaves_its_child_serving(tmp_path, sig):
    run_dir = _tiny_run(tmp_path)
    argv = [sys.executable, "-c", LAUNCHER, "tensorboard", str(run_dir), "--port", str(_free_port())]
    parent = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_signals_as_a_terminal_leaves_them
    )
    child = None
    try:
        child = _child_running(parent, "tensorboard.main")
        parent.send_signal(sig)
        parent.wait(timeout=60)
        _wait(lambda: _ended(child), f"TensorBoard (pid {child}) to end with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        _kill(child)


def test_tui_serve_stopped_with_sigterm_leaves_its_ui_running(tmp_path):
    # what textual-serve does for each browser tab, in a parent the test then stops: the UI's
    # input stays open (the test holds it), so only its parent's end can end it
    run_dir = _tiny_run(tmp_path)
    read_end, write_end = os.pipe()
    server = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from tpu_debug.cli.tui_serve import tui_command
        env = dict(os.environ, TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver")
        subprocess.Popen(tui_command([{str(run_dir)!r}]), shell=True, stdin={read_end},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", server], pass_fds=[read_end], preexec_fn=_signals_as_a_terminal_leaves_them
    )
    os.close(read_end)
    ui = None
    try:
        ui = _child_running(parent, "tpu_debug.cli")
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=60)
        _wait(lambda: _ended(ui), f"the UI (pid {ui}) to end with its server")
    finally:
        os.close(write_end)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        _kill(ui)
