"""The pytest plugin (``tpu_debug.pytest_plugin``, a ``pytest11`` entry point), end to end with
``pytester``: ``--tpu-debug[=DIR]`` records a run per test, the two fixtures fail a test with
the line and the cause, and loading the plugin imports neither torch nor jax."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import tpu_debug

pytest_plugins = ["pytester"]

# each inner session is a new interpreter (runpytest_subprocess: as a user runs pytest, and an
# in-process run would forget the modules torch imports lazily, some of which register torch
# libraries that cannot be registered twice); it loads the plugin by its entry point's name,
# under which the installed entry point registers it too, so the two ways do not clash
PLUGIN = ("-p", "tpu_debug_pytest", "-p", "no:cacheprovider")

HEADER = """
import torch
import tpu_debug
"""


SHAPES = HEADER + """
def test_grows(tpu_debug_no_recompiles):
    for n in range(101, 107):  # a new length every step: every step compiles
        y = (torch.ones(n, device="tpu") * 2).sum()
        tpu_debug.step()
    assert y.cpu().tolist() == 212.0

def test_steady(tpu_debug_no_recompiles):
    x = torch.ones(107, device="tpu")
    for _ in range(5):  # step 0 compiles (warm-up), the rest run the same programs
        y = (x * 3).sum()
        tpu_debug.step()
    assert y.cpu().tolist() == 321.0

def test_no_steps(tpu_debug_no_recompiles):
    for n in (108, 109):  # two lengths, no steps: no steady state, and a warning that says so
        y = torch.ones(n, device="tpu") * 2
    assert y.cpu().tolist() == [2.0] * 109
"""

SYNCS = HEADER + """
def test_if_tensor(tpu_debug_no_implicit_syncs):
    x = torch.ones(4, device="tpu")
    if x.sum() > 0:  # bool() on a tpu tensor: the host waits for the device
        x = x + 1
    assert x.cpu().tolist() == [2.0] * 4

def test_explicit_copy(tpu_debug_no_implicit_syncs):
    x = torch.ones(4, device="tpu")
    assert x.sum().cpu().tolist() == 4.0  # .cpu() is asked for: no implicit sync
"""


RECORDED = HEADER + """
def test_add():
    assert (torch.ones(3, device="tpu") + 1).cpu().tolist() == [2.0] * 3

def test_nothing():
    pass

def test_fails():
    torch.zeros(2, device="tpu").cpu()
    assert False, "on purpose"
"""


def test_fixtures_fail_tests_with_the_line_and_the_cause_and_each_test_is_recorded(pytester):
    # one inner session for all (each starts an interpreter that imports torch and jax)
    pytester.makepyfile(test_shapes=SHAPES, test_syncs=SYNCS, test_rec=RECORDED)
    result = pytester.runpytest_subprocess(*PLUGIN, "--tpu-debug=runs")
    result.assert_outcomes(passed=5, failed=3, warnings=1)
    failed = {line.split(" - ")[0] for line in result.outlines if line.startswith("FAILED ")}
    assert failed == {"FAILED test_shapes.py::test_grows", "FAILED test_syncs.py::test_if_tensor",
                      "FAILED test_rec.py::test_fails"}
    # six steps compiling one after another: only the first is warm-up (step_phases); the steady
    # steps compile ones, mul and sum for lengths 102..106: 15 compiles
    result.stdout.re_match_lines([
        r"tpu_debug_no_recompiles: 15 compile\(s\) in steady state, in step\(s\) 1-5 of 6 \(warm-up: 0\):$",
        r"  mul\.Tensor recompiled at .*test_shapes\.py:6 in test_grows: the closest earlier key has 1 mismatch:$",
        r"    arg 0 'self': f32\[101\] -> f32\[102\]$",
        r"fix: dim 0 of arg 0 'self' of mul\.Tensor grows at every step \(101\.\.106\) and nothing in the step concatenates onto it",
        r"\(the run: .*/runs/[^/]*-test_shapes\.py_test_grows\)$",
    ])
    result.stdout.fnmatch_lines([
        "tpu_debug_no_implicit_syncs: 1 implicit device-to-host sync(s):",
        "  *test_syncs.py:6 in test_if_tensor: bool() / if t:, 1 time(s), 1 bytes",
        "fix: keep values on the device*",
    ])
    result.stdout.fnmatch_lines([
        "test_shapes.py::test_no_steps",
        "*PytestWarning: tpu_debug_no_recompiles: the test ran no steps *",
    ])

    # one run per test, named after it, holding what the test ran
    runs = {}
    for path in tpu_debug.list_runs(pytester.path / "runs"):
        with tpu_debug.open_run(path) as session:
            m = session.metadata()
            runs[m.name] = (m.status, sorted(o.name for o in session.ops() if o.mode == "eager"))
    assert set(runs) == {
        "test_shapes.py::test_grows", "test_shapes.py::test_steady", "test_shapes.py::test_no_steps",
        "test_syncs.py::test_if_tensor", "test_syncs.py::test_explicit_copy",
        "test_rec.py::test_add", "test_rec.py::test_nothing", "test_rec.py::test_fails",
    }
    assert runs["test_rec.py::test_add"][0] == "finished" and "add.Tensor" in runs["test_rec.py::test_add"][1]
    assert runs["test_rec.py::test_nothing"] == ("finished", [])
    assert runs["test_rec.py::test_fails"][0] == "failed"
    # a check's failure is the test's, not the program's: the run itself finished
    assert runs["test_shapes.py::test_grows"][0] == "finished"


def test_where_the_runs_go(tmp_path, monkeypatch):
    from tpu_debug.pytest_recording import _logdir

    def item(option, **funcargs):
        options = {"tpu_debug": option}
        config = SimpleNamespace(getoption=options.__getitem__, invocation_params=SimpleNamespace(dir=tmp_path))
        return SimpleNamespace(config=config, funcargs=funcargs)

    monkeypatch.chdir(tmp_path / "..")  # a test that changed directory does not move the runs
    assert _logdir(item("runs"), ()) == tmp_path / "runs"
    assert _logdir(item("/abs/runs"), ()) == Path("/abs/runs")
    monkeypatch.delenv("TPU_DEBUG_LOGDIR", raising=False)
    assert _logdir(item(""), ()) == tmp_path / "tpu_debug_runs"  # --tpu-debug alone
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", "elsewhere")
    assert _logdir(item(""), ()) == tmp_path / "elsewhere"
    # no --tpu-debug: the checked test's run goes to its fixture's temporary directory
    checked = tmp_path / "fixture"
    assert _logdir(item(None, tpu_debug_no_implicit_syncs=checked), ("tpu_debug_no_implicit_syncs",)) == checked


def test_plugin_imports_neither_torch_nor_jax_when_unused(pytester):
    """Pytest loads an installed plugin in every project: unused, it must cost nothing."""
    pytester.makepyfile(test_plain="""
import sys

def test_plain(request):
    assert request.config.pluginmanager.has_plugin("tpu_debug_pytest")
    assert request.config.getoption("tpu_debug") is None
    assert not {"torch", "jax"} & set(sys.modules), sorted(sys.modules)
""")
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=1)
    # a test path after --tpu-debug would be taken as the run directory: refused, saying how
    result = pytester.runpytest_subprocess(*PLUGIN, "--tpu-debug", "test_plain.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refused = "--tpu-debug took 'test_plain.py' as the directory for the runs: write --tpu-debug=DIR"
    result.stderr.fnmatch_lines([f"*{refused}, or put --tpu-debug after the test paths"])


def test_plugin_is_declared_as_a_pytest11_entry_point():
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\ntpu_debug_pytest = "tpu_debug.pytest_plugin"' in text
