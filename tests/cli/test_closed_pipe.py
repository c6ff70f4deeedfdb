"""A reader that goes away (``tpu-debug report --json | head``) ends every verb quietly: status 0,
nothing on stderr, as a Unix tool ends.

Each command runs in a process of its own whose stdout is a pipe closed before the command
writes anything (it is still importing), so its first write meets the closed pipe whatever
the size of its output.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("synthetic_run", TESTS / "tui" / "synthetic_run.py")
synthetic_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic_run)

LAUNCHER = "import sys; from tpu_debug.cli import main; sys.exit(main())"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> pathlib.Path:
    logdir = tmp_path_factory.mktemp("closed-pipe")
    for name in ("20260131T120000.000Z-a", "20260131T120001.000Z-b"):
        synthetic_run.write_synthetic_run(logdir / name)
    return logdir


RUNS = {"A": "20260131T120000.000Z-a", "B": "20260131T120001.000Z-b"}


def _closed_pipe(*args: str) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=TESTS.parent,
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return proc.wait(timeout=300), err


@pytest.mark.parametrize(
    "verb",
    [
        ["report", "--json", "A"],
        ["report", "--plain", "A"],
        ["diff", "--json", "A", "B"],
        ["diff", "--plain", "A", "B"],
        ["runs"],
        ["report", "--help"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_the_verb_quietly(logdir, verb):
    args = [str(logdir / RUNS[a]) if a in RUNS else a for a in verb]
    code, err = _closed_pipe(*args, "--logdir", str(logdir))
    assert (code, err) == (0, "")


def test_a_closed_pipe_ends_a_multi_process_report_quietly(tmp_path):
    from tpu_debug.ranks import new_group

    group = new_group(tmp_path, "pair", 2, ["train.py"])
    for rank in range(2):
        synthetic_run.write_synthetic_run(group.path / f"20260131T120000.000Z-rank{rank}")
    group.write(status="finished", exit_status=[0, 0])
    group.close()
    for output in ("--json", "--plain"):
        assert _closed_pipe("report", output, str(group.path)) == (0, "")
