"""``tpu-debug import-trace`` on TORCH_TRACE logs a plain torch.compile program writes (no tpu_debug)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpu_debug.cli import main as tpu_debug_main

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


# a Python number passed to a compiled function: dynamo guards on its value and compiles
# again for each new one (the guard failures the log records are the reference)
CONSTANT = textwrap.dedent(
    """\
    import torch

    def f(x, n):
        y = x * n
        return y + 1

    g = torch.compile(f, backend="eager", dynamic=False)
    for step in range(6):
        g(torch.ones(3), ARG)
    """
)


def _tool(*args: str) -> subprocess.CompletedProcess:
    """``tpu-debug ARGS`` in this process, through the console script's entry (what ``python -m
    tpu_debug`` calls): the verbs here read a log or a run, and a process of their own would only
    add the start-up (tests/cli/test_startup.py checks that start-up)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = tpu_debug_main(list(args))
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _make_trace(root: Path, backend: str, source: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "script.py"
    script.write_text(source if source is not None else SCRIPT.replace("BACKEND", repr(backend)))
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


def test_what_the_log_does_not_record_is_not_shown_as_zero(trace_dir: Path, tmp_path: Path) -> None:
    done = _tool("import-trace", str(trace_dir), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    data = json.loads(_tool("report", "--logdir", str(tmp_path / "runs"), "--json").stdout)
    # a TORCH_TRACE log records compiles, guards and graph breaks: executions and transfers
    # are unknown (null), while the compiles it does record are counted
    assert data["run"]["imported_from"].endswith(".log")
    assert data["ops"] and all(o["count"] is None and o["seconds"] is None for o in data["ops"])
    assert sum(o["compiles"] for o in data["ops"]) == 4  # f and its resume function, for sizes 3 and 4
    assert data["transfers"]["count"] is None and data["transfers"]["imported"] is True
    assert all(s["eager_ops"] is None and s["transfers"] is None for s in data["steps"]["per_step"])
    text = _tool("report", "--logdir", str(tmp_path / "runs"), "--plain", "--width", "400").stdout
    assert "transfers: not in an imported TORCH_TRACE log" in text
    assert "no host <-> device transfers recorded" not in text


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


def _tlparse(trace_dir: Path, out: Path) -> Path:
    """tlparse's reading of the log: the independent reader (skips when tlparse is missing)."""
    tlparse = shutil.which("tlparse") or str(Path(sys.executable).parent / "tlparse")
    if not Path(tlparse).exists():
        pytest.skip("tlparse is not installed")
    log = next(trace_dir.glob("dedicated_log_torch_trace*.log"))
    done = subprocess.run(
        [tlparse, str(log), "-o", str(out), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_tlparse_reads_the_same_log_and_agrees_on_the_guard(trace_dir: Path, tmp_path: Path) -> None:
    # tlparse's recompile reasons hold the guard our run reports
    out = _tlparse(trace_dir, tmp_path / "tlparse")
    reasons = " ".join(p.read_text() for p in out.glob("*/recompile_reasons_*.json"))
    assert "tensor 'x' size mismatch at index 0. expected 3, actual 4" in reasons


def test_shape_recompile_is_the_size_tlparse_shows(trace_dir: Path, tmp_path: Path) -> None:
    from tpu_debug import open_run

    reasons = _reasons_by_compile(_tlparse(trace_dir, tmp_path / "tlparse"))
    entry, name, dim, before, now = re.match(
        r"(\d+/\d+): tensor '(\w+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)",
        reasons["0/1"][0],
    ).groups()
    done = _tool("import-trace", str(trace_dir), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    compiles = {c.signature.removeprefix("dynamo "): c for c in open_run(done.stdout.strip()).compiles()}
    recompile = compiles["0/1"]
    assert recompile.previous == compiles[entry].id
    assert [(d.aspect, d.arg_name, d.dims, d.before, d.now) for d in recompile.diffs] == [
        ("shape", name, (int(dim),), before, now)
    ]


def _reasons_by_compile(out: Path) -> dict[str, list[str]]:
    """tlparse's recompile reasons per compile id ("0/3"), most recent cached entry first."""
    found = {}
    for path in out.glob("*/recompile_reasons_*.json"):
        frame, compile_ = path.parent.name.split("_")[1:3]  # "-_0_3_0": frame 0, compile 3, attempt 0
        text = path.read_text()
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        found[f"{frame}/{compile_}"] = value if isinstance(value, list) else [value]
    return found


@pytest.fixture(scope="module")
def constant_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_trace(tmp_path_factory.mktemp("constant"), "eager", CONSTANT.replace("ARG", "step"))


def test_recompile_is_linked_to_the_compile_whose_guard_failed(constant_trace: Path, tmp_path: Path) -> None:
    from tpu_debug import open_run

    reasons = _reasons_by_compile(_tlparse(constant_trace, tmp_path / "tlparse"))
    assert len(reasons) == 5  # one per call after the first
    done = _tool("import-trace", str(constant_trace), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    compiles = {c.signature.removeprefix("dynamo "): c for c in open_run(done.stdout.strip()).compiles()}
    by_id = {c.id: c for c in compiles.values()}
    assert compiles["0/0"].previous is None and not compiles["0/0"].diffs
    for compile_id, texts in reasons.items():
        # dynamo's first reason is the most recent cached entry's: "0/2: n == 2  # y = x * n ..."
        entry, guard = re.match(r"(\d+/\d+): (\S+ == \S+)", texts[0]).groups()
        name, value = guard.split(" == ")
        recompile = compiles[compile_id]
        assert by_id[recompile.previous].signature == f"dynamo {entry}"
        assert [(d.aspect, d.arg_name, d.before, d.source) for d in recompile.diffs] == [
            ("scalar", name, value, "guard")
        ]


def test_report_finds_the_recompile_at_the_guarded_line(constant_trace: Path, tmp_path: Path) -> None:
    reasons = _reasons_by_compile(_tlparse(constant_trace, tmp_path / "tlparse"))
    # the user's line of each failed guard, as the log's "User stack trace" gives it
    lines = {int(m) for texts in reasons.values() for m in re.findall(r'script\.py", line (\d+)', texts[0])}
    assert len(lines) == 1
    done = _tool("import-trace", str(constant_trace), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    report = _tool("report", done.stdout.strip(), "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    # the program's torch, as tlparse reads it from the log
    version = json.loads(next((tmp_path / "tlparse").glob("*/torch_version_*.json")).read_text())
    assert data["run"]["versions"]["torch"] == version["pytorch_version"]
    findings = [f for f in data["findings"] if f["kind"] == "recompile"]
    assert len(findings) == 1
    assert findings[0]["cause"] == "scalar" and "'n'" in findings[0]["title"]
    location = findings[0]["evidence"]["location"]
    assert (Path(location["file"]).name, location["line"]) == ("script.py", lines.pop())


def test_diff_between_imported_runs_shows_the_recompiles_fixed(constant_trace: Path, tmp_path: Path) -> None:
    reasons = _reasons_by_compile(_tlparse(constant_trace, tmp_path / "tlparse"))
    fixed = _make_trace(tmp_path / "fixed", "eager", CONSTANT.replace("ARG", "torch.tensor(float(step))"))
    assert not _reasons_by_compile(_tlparse(fixed, tmp_path / "tlparse_fixed"))
    runs = []
    for name, trace in (("before", constant_trace), ("after", fixed)):
        done = _tool("import-trace", str(trace), "--logdir", str(tmp_path / "runs"), "--name", name)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.strip())
    done = _tool("diff", *runs, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    # a run's steps are the calls the log shows compiling: the first (warm-up) compiles f for
    # the first time, and each later one is a recompile in steady state
    assert data["figures"]["compiles"]["a"] == len(reasons) + 1
    assert data["figures"]["steady_recompiles"]["a"] == len(reasons)
    assert data["figures"]["steady_recompiles"]["b"] == 0
    assert [f["kind"] for f in data["findings"]["fixed"]] == ["recompile"]
    assert data["findings"]["introduced"] == []


# a tpu_debug.compile program: dynamo's stack has tpu_debug's wrapper between the user's call
# and the compiled function
WRAPPED = textwrap.dedent(
    """\
    import torch
    import tpu_debug


    def f(x, n):
        y = x * n
        return y + 1


    g = tpu_debug.compile(f, dynamic=False)
    for step in range(6):
        g(torch.ones(3 + step, device='tpu'), step)
    """
)


def test_import_trace_finding_at_compiled_py_called_at_dash(tmp_path: Path) -> None:
    from tpu_debug import open_run

    trace = _make_trace(tmp_path / "wrapped", "eager", WRAPPED)
    done = _tool("import-trace", str(trace), "--logdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    call = WRAPPED.splitlines().index("    g(torch.ones(3 + step, device='tpu'), step)") + 1
    with open_run(done.stdout.strip()) as run:
        failures = run.recompiles.guard_failures()
        compiles = run.compiles()
        findings = run.findings()
    assert failures and compiles
    for event in [*failures, *compiles]:
        assert event.location is not None and Path(event.location.file).name == "script.py", event
    assert {f.location.line for f in failures} == {call}
    for finding in findings:
        assert finding.evidence.location is not None, finding
        assert Path(finding.evidence.location.file).name == "script.py", finding
