"""The TUI in a real terminal: tmux runs ``python -m tpu_debug tui`` (and ``tpu-debug run
--tui``) in a detached session of fixed size, keys are sent, and the captured pane must
show the recompile diff. Skipped only when tmux is not installed."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")

WIDTH, HEIGHT = 120, 36
REPO = Path(__file__).resolve().parents[2]


def _synthetic():
    spec = importlib.util.spec_from_file_location(
        "synthetic_run", REPO / "tests" / "tui" / "synthetic_run.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tmux:
    """One private tmux server (its own socket) holding one session."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = f"tpu_debug_e2e_{os.getpid()}_{tmp_path.name}"
        # COLUMNS/LINES (pytest-xdist sets them) would override the pane's size in the TUI
        skip = ("TPU_DEBUG_", "TMUX", "COLUMNS", "LINES")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        # compile from scratch, as every test does (tests/conftest.py): read-backs from a user's
        # compile cache are not compiles, and the storm it records would not be found
        self.env.update(TERM="xterm-256color", COLORTERM="truecolor", PYTHONUNBUFFERED="1",
                        TPU_DEBUG_COMPILE_CACHE="0")

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [TMUX, "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env,
            check=check,
        )

    def start(self, command: str, cwd: Path, size: tuple[int, int] = (WIDTH, HEIGHT)) -> None:
        # the shell stays after the command so an error (and the exit status) can be read
        shell = f"cd {shlex.quote(str(cwd))} && {command}; echo EXIT=$?; sleep 120"
        self("new-session", "-d", "-s", "tui", "-x", str(size[0]), "-y", str(size[1]), shell)

    def pane(self) -> str:
        return self("capture-pane", "-p", "-t", "tui").stdout

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "tui", *keys)

    def wait_for(self, *texts: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            pane = self.pane()
            if all(t in pane for t in texts):
                return pane
            if "EXIT=" in pane and not any("EXIT=" in t for t in texts):
                raise AssertionError(f"the command ended early:\n{pane}")
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout:.0f}s for {texts!r}; the pane shows:\n{pane}")
            time.sleep(0.2)

    def close(self) -> None:
        socket = self("display-message", "-p", "#{socket_path}", check=False).stdout.strip()
        self("kill-server", check=False)
        if socket:  # tmux leaves its socket file behind
            Path(socket).unlink(missing_ok=True)


@pytest.fixture
def tmux(tmp_path):
    session = Tmux(tmp_path)
    yield session
    session.close()


@pytest.mark.quick
def test_tui_shows_the_recompile_diff_in_a_terminal(tmp_path, tmux):
    run_dir = tmp_path / "runs" / "20260131T120000.000Z-synthetic"
    _synthetic().write_synthetic_run(run_dir)
    tmux.start(f"{shlex.quote(sys.executable)} -m tpu_debug tui {shlex.quote(str(run_dir))}", tmp_path)
    # the batch's size is one finding, at the compiled graph it recompiled
    tmux.wait_for("Findings", "of main (train.py) forward takes a new size in steady state")
    tmux.keys("2")
    pane = tmux.wait_for("Compile history: mul.Tensor", "closest key: compile 1", "(1 mismatch)")
    # the diff panel wraps at narrow widths: check its parts
    assert "arg 0 'self'" in pane and "f32[8,128] →" in pane and "f32[9,128]" in pane
    tmux.keys("Down")  # the next op by compiles: the compiled graph, a dynamo guard
    # the detail pane fills in after the history's title: wait for the guard's line too
    pane = tmux.wait_for("Compile history: main (train.py) forward", "L['batch'].size()[0] == 8 → failed")
    assert "tensor 'batch' dim 0: 8 → 9" in pane
    assert "L['batch'].size()[0] == 8 → failed" in pane
    tmux.keys("q")
    tmux.wait_for("EXIT=0", timeout=30)


def test_tui_at_100x30_keeps_counts_locations_and_every_key(tmp_path, tmux):
    """The narrowest terminal the TUI is made for: columns that matter stay, values are whole,
    the footer ends with the help and quit keys."""
    run_dir = tmp_path / "runs" / "20260131T120000.000Z-synthetic"
    _synthetic().write_synthetic_run(run_dir)
    command = f"{shlex.quote(sys.executable)} -m tpu_debug tui {shlex.quote(str(run_dir))}"
    tmux.start(command, tmp_path, size=(100, 30))
    tmux.wait_for("Findings", "1-9 Views", "? Keys", "q Quit")
    tmux.keys("2")
    pane = tmux.wait_for("Compile history: mul.Tensor", "compiles")
    lines = pane.splitlines()
    # mul.Tensor compiled for 6 lengths (5 recompiles): both counts on its row
    assert any(line.split()[1:4] == ["mul.Tensor", "6", "5"] for line in lines if line.startswith("│")), pane
    assert "f32[8,128] →" in pane and "f32[9,128]" in pane
    tmux.keys("8")
    pane = tmux.wait_for("Collectives of", "72.00 MiB")
    assert "train.py:11" in pane and "train.py:13" in pane
    tmux.keys("q")
    tmux.wait_for("EXIT=0", timeout=30)


def test_run_with_tui_on_the_recompile_storm_example(tmp_path, tmux):
    """``tpu-debug run --tui`` records the recompile-storm example, then opens the TUI on it."""
    example = REPO / "examples" / "pitfalls" / "recompile_storm.py"
    logdir = tmp_path / "runs"
    tmux.start(
        f"{shlex.quote(sys.executable)} -m tpu_debug run --tui --logdir {shlex.quote(str(logdir))} "
        f"{shlex.quote(str(example))} --steps 4",
        tmp_path,
    )
    # the first steps compile as warm-up; the lengths that keep coming after are the finding
    tmux.wait_for("Findings", "takes a new size in steady state", timeout=120)
    tmux.keys("2")
    pane = tmux.wait_for("Compile history:", "Why it compiled", "compile 2 of")
    assert "first compile" in pane and "arg 0 'self': f32[" in pane  # the history's diff column
    tmux.keys("q")
    pane = tmux.wait_for("EXIT=0", timeout=30)
    assert "run saved in" in pane
