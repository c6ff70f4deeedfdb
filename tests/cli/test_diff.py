"""``tpu-debug diff RUN_A RUN_B``: what a change bought, as text and as JSON (tpu_debug.diff/1)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from tpu_debug.runtime import clear_cache

import tpu_debug
from tpu_debug.cli import main

SCHEMA_DOC = pathlib.Path(__file__).parents[2] / "docs" / "report_schema.md"


def _documented() -> set[str]:
    """Every name the schema document writes as code (`name`)."""
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", SCHEMA_DOC.read_text()))


def _record(logdir, *, sync: bool, name: str) -> str:
    """Six explicit steps of one small loop; with ``sync``, an ``.item()`` in each."""
    clear_cache()
    x = torch.arange(8, dtype=torch.float32, device="tpu")
    with tpu_debug.trace(logdir=logdir, name=name) as session:
        total = torch.zeros((), device="tpu")
        for _ in range(6):
            loss = (x * 2.0).sum()
            if sync:
                total += loss.item()  # the sync the fix removes
            else:
                total = total + loss
            tpu_debug.step()
        result = float(total.cpu())
    assert result == 6 * 56.0  # sum(2 * arange(8)) per step, exact in float32
    return str(session.run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two runs the tests compare (read only: recorded once for the module)."""
    logdir = tmp_path_factory.mktemp("runs")
    return _record(logdir, sync=True, name="before"), _record(logdir, sync=False, name="after")


def _diff_json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(["diff", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_diff_json_says_the_sync_is_fixed(runs, capsys):
    before, after = runs
    data = _diff_json(capsys, before, after)
    assert data["schema"] == "tpu_debug.diff/1"
    assert data["findings_schema"] == "tpu_debug.findings/1"
    assert (data["a"]["name"], data["b"]["name"]) == ("before", "after")
    assert (data["a"]["dir"], data["b"]["dir"]) == (before, after)
    fig = data["figures"]
    # each step of A synced once (its .item()); B's steps never do
    assert fig["implicit_syncs_per_step"]["a"] == 1.0 and fig["implicit_syncs_per_step"]["b"] == 0.0
    assert fig["implicit_syncs_per_step"]["change"] == -1.0
    assert fig["implicit_syncs"] == {"a": 6, "b": 0, "change": -6, "unit": ""}
    assert fig["steps"]["a"] == fig["steps"]["b"] == 6
    # both loops settle after the first step: nothing compiles in steady state
    assert fig["steady_compiles"]["a"] == fig["steady_compiles"]["b"] == 0
    assert fig["steady_recompiles"]["b"] == 0
    assert fig["compiles"]["a"] > 0 and fig["compiles"]["b"] > 0
    assert fig["step_seconds"]["unit"] == "s" and fig["step_seconds"]["a"] > 0
    # neither run compared against CPU
    assert fig["max_divergence"] == {"a": None, "b": None, "change": None, "unit": ""}
    assert fig["findings"] == {"a": 1, "b": 0, "change": -1, "unit": ""}
    found = data["findings"]
    (fixed,) = found["fixed"]
    assert (fixed["kind"], fixed["cause"]) == ("implicit_sync", "item")
    assert fixed["evidence"]["location"]["file"] == __file__
    assert found["introduced"] == [] and found["remaining"] == []

    # the other way round, the fix is undone: the same finding is introduced
    back = _diff_json(capsys, after, before)
    assert back["findings"]["fixed"] == [] and back["findings"]["introduced"] == [fixed]
    assert back["figures"]["implicit_syncs_per_step"]["change"] == 1.0

    # a run against itself: every finding remains, nothing changed
    same = _diff_json(capsys, before, before)
    assert [p["a"]["kind"] for p in same["findings"]["remaining"]] == ["implicit_sync"]
    assert all(f["change"] in (0, None) for f in same["figures"].values())


def test_diff_json_fields_are_documented(runs, capsys):
    data = _diff_json(capsys, *runs)
    documented = _documented()
    assert "tpu_debug.diff/1" in SCHEMA_DOC.read_text()
    missing = {k for k in (*data, *data["figures"], *data["findings"], *data["a"]) if k not in documented}
    assert not missing, f"fields of tpu-debug diff --json not in {SCHEMA_DOC.name}: {sorted(missing)}"


def test_diff_text_shows_figures_and_findings(runs, capsys):
    before, after = runs
    capsys.readouterr()
    assert main(["diff", "--plain", before, after]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tpu_debug diff: before -> after\n")
    assert re.search(r"implicit syncs per steady step\s*\|\s*1\s*\|\s*0\s*\|\s*-1 \(-100%\)", out), out
    fixed = out.split("Findings fixed (1)\n", 1)[1].split("Findings introduced (0)", 1)[0]
    assert fixed.startswith("WARN ") and "test_diff.py:" in fixed and "fix: " in fixed
    assert "none: B has no finding A did not have" in out


def test_diff_of_a_missing_run_says_so(runs, logdir, capsys):
    before, _ = runs
    capsys.readouterr()
    missing = str(logdir / "no-such-run")
    assert main(["diff", before, missing, "--logdir", str(logdir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tpu-debug diff: {missing}: no such run"), err


def test_diff_reads_runs_without_torch_or_jax(runs, tmp_path):
    """A reading verb: the console script's path imports neither torch nor jax."""
    before, after = runs
    code = f"""
        import contextlib, io, json, sys
        from tpu_debug.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["diff", "--json", {before!r}, {after!r}])
        print(code, json.loads(out.getvalue())["figures"]["implicit_syncs"]["change"])
        print(sorted(m for m in ("torch", "jax", "jaxlib", "tpu_debug.runtime.device") if m in sys.modules))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["0 -6", "[]", ""]


def test_diff_compares_divergence_against_cpu(logdir, capsys):
    """A matmul in one bfloat16 pass (TPU numerics) against the same in float32: the fix of a
    precision problem, as the diff shows it."""
    torch.manual_seed(0)
    # TPU numerics hold the product to the precision it emulates, not to float32's tolerance: rows
    # near 1000 varying by 1 keep about one bit of that variation in bfloat16 (its spacing there
    # is 4), so the rounding error (RMS ~1.2 * sqrt(128)) is over half of what the result varies
    # (sqrt(128)): a divergence at that precision. Centred operands would be within it.
    a, b = (torch.randn(32, 128) + 1000).to("tpu"), torch.randn(128, 16).to("tpu")
    dirs = []
    for name, numerics in (("bf16", "tpu"), ("f32", "cpu")):
        clear_cache()
        with tpu_debug.trace(logdir=logdir, name=name, divergence=True, numerics=numerics) as session:
            (a @ b).cpu()
        dirs.append(str(session.run_dir))
    with tpu_debug.trace(logdir=logdir, name="unchecked") as session:
        (a @ b).cpu()
    unchecked = str(session.run_dir)

    data = _diff_json(capsys, *dirs)
    fig = data["figures"]
    # in float32 the mm is within float32's tolerance (only the summation order differs)
    assert fig["divergences_over_tolerance"]["a"] == 1 and fig["divergences_over_tolerance"]["b"] == 0
    assert fig["max_divergence"]["a"] > 1 and fig["max_divergence"]["b"] is None
    (over,) = tpu_debug.open_run(dirs[0]).divergences(measure="local", over=True)
    assert over.name == "mm" and fig["max_abs_divergence"]["a"] == over.max_abs
    assert [f["kind"] for f in data["findings"]["fixed"]] == ["divergence"]
    assert data["findings"]["introduced"] == []
    # a run that did not compare has no divergence figures at all
    fig = _diff_json(capsys, dirs[1], unchecked)["figures"]
    assert fig["divergences_over_tolerance"] == {"a": 0, "b": None, "change": None, "unit": ""}
    assert fig["max_abs_divergence"]["b"] is None


def _wide(x, w):
    h = x @ w  # WIDE: the product that grows with the batch
    return h.tanh().sum() + (h * h).sum()


def test_diff_shows_the_peaks_change_by_kind_and_by_line(logdir, capsys):
    w = torch.randn(32, 2048, device="tpu")
    dirs = []
    for batch in (256, 512):  # two batch sizes: the product doubles, the weight stays
        x = torch.randn(batch, 32, device="tpu")
        with tpu_debug.trace(logdir=logdir, name=f"batch{batch}", memory=True) as session:
            tpu_debug.compile(_wide)(x, w).item()
        dirs.append(str(session.run_dir))
    data = _diff_json(capsys, *dirs)
    peak = data["peak"]
    a, b = peak["a"], peak["b"]
    assert data["figures"]["peak_bytes"]["change"] == b["total_bytes"] - a["total_bytes"] > 0
    line = next(i for i, t in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1) if "# WIDE" in t)
    (grown,) = [r for r in peak["by_line"] if r["what"] == f"test_diff.py:{line}"]
    # the product's bytes, float32 [batch, 2048], at the line that made it
    assert (grown["a"], grown["b"]) == (256 * 2048 * 4, 512 * 2048 * 4)
    kinds = {r["what"]: r for r in peak["by_kind"]}
    assert kinds["temporary"]["change"] >= 256 * 2048 * 4
    # the inputs: x doubled, the weight the same; both were made before the trace, which says
    # so in words where a line would stand
    assert {r["what"] for r in peak["by_line"]} >= {"made before the trace began"}
    assert sum(r["change"] for r in peak["by_kind"]) == b["total_bytes"] - a["total_bytes"]
    capsys.readouterr()
    assert main(["diff", *dirs]) == 0
    text = capsys.readouterr().out
    assert "Peak memory (A | B)" in text and f"test_diff.py:{line}" in text
