"""``tpu-debug import-trace`` on TORCH_TRACE logs a plain torch.compile program writes (no tpu_debug)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """\
    import torch

    def f(x):
        y = x * 2
        print("side effect")
        return y + 1

    g = torch.compile(f, backend=BACKEND, dynamic=False)
    g(torch.ones(3))
    g(torch.ones(4))
    """
)


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpu_debug", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _make_trace(root: Path, backend: str) -> Path:
    script = root / "script.py"
    script.write_text(SCRIPT.replace("BACKEND", repr(backend)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG")}
    env["TORCH_TRACE"] = str(root / "trace")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "trace"


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_trace(tmp_path_factory.mktemp("torch_trace"), "eager")


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_report_shows_recompile_guard_and_graph_break(backend: str, trace_dir: Path, tmp_path: Path) -> None:
    if backend != "eager":
        trace_dir = _make_trace(tmp_path, backend)
    done = _tool("import-trace", str(trace_dir), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    report = _tool("report", "--logdir", str(tmp_path / "runs"), "--plain", "--width", "400")
    assert report.returncode == 0, report.stderr
    text = report.stdout
    # the recompile: the second call's shape (4) fails the first compile's guard on x's size (3)
    assert "tensor 'x' size mismatch at index 0. expected 3, actual 4" in text
    # the graph break: at the script's print line, reason naming print
    line = SCRIPT.splitlines().index('    print("side effect")') + 1
    assert f"script.py:{line}" in text
    assert "print" in text.split("graph breaks:", 1)[1]


def test_one_run_per_rank(trace_dir: Path, tmp_path: Path) -> None:
    # two ranks faked by copying one rank's log under the names torch.distributed gives
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    log = next(trace_dir.glob("dedicated_log_torch_trace*.log"))
    for rank in (0, 1):
        shutil.copy(log, ranks / f"dedicated_log_torch_trace_rank_{rank}_abc.log")
    done = _tool("import-trace", str(ranks), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    names = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "runs").iterdir())
    assert names == ["torch_trace-rank0", "torch_trace-rank1"]


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    done = _tool("import-trace", str(tmp_path), "--logdir", str(tmp_path / "runs"))
    assert done.returncode != 0
    assert "no dedicated_log_torch_trace" in done.stderr


def test_tlparse_reads_the_same_log_and_agrees_on_the_guard(trace_dir: Path, tmp_path: Path) -> None:
    # tlparse (when installed) is the independent reader of the log: its recompile
    # reasons hold the guard our run reports
    tlparse = shutil.which("tlparse") or str(Path(sys.executable).parent / "tlparse")
    if not Path(tlparse).exists():
        pytest.skip("tlparse is not installed")
    log = next(trace_dir.glob("dedicated_log_torch_trace*.log"))
    out = tmp_path / "tlparse"
    done = subprocess.run(
        [tlparse, str(log), "-o", str(out), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reasons = " ".join(p.read_text() for p in out.glob("*/recompile_reasons_*.json"))
    assert "tensor 'x' size mismatch at index 0. expected 3, actual 4" in reasons
