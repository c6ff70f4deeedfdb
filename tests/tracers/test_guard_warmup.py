"""Recompile and transfer guards leave warm-up alone: an op compiled for each layer's shape in
the step where it first runs, or the first steps of a phase, never stop a correct program;
a shape that changes once the steps repeat does, at its line, with the diff."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from tpu_debug.core.errors import RecompileError

import tpu_debug
from tpu_debug.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _mlp() -> nn.Module:
    # two Linear layers of different widths: addmm meets two shapes in the first forward
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("tpu")


def _train(model: nn.Module, opt: torch.optim.Optimizer, batches: list[int]) -> None:
    for rows in batches:
        x, y = torch.ones(rows, 8).to("tpu"), torch.zeros(rows, 1).to("tpu")
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)  # the forward: where a new batch size recompiles
        loss.backward()
        opt.step()


def _line_of(path: str | Path, text: str) -> int:
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_first_step_shapes_and_a_second_optimizer_are_warm_up(logdir, cold_cache):
    model = _mlp()
    with tpu_debug.trace(logdir=logdir, fail_on_recompile=True) as session:
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), [4] * 4)
        _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), [4] * 4)  # a new phase
    # the program recompiled during warm-up (addmm for the second layer) and was not stopped
    assert any(c.diffs for c in session.compiles(name="addmm"))
    assert len(session.steps()) == 8


def test_a_steady_state_shape_change_stops_at_its_line_with_the_diff(logdir, cold_cache):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with (
        pytest.raises(RecompileError, match="trace\\(fail_on_recompile=True\\) forbids recompiles") as info,
        tpu_debug.trace(logdir=logdir, fail_on_recompile=True),
    ):
        _train(model, opt, [4, 4, 4, 5])
    line = _line_of(__file__, "loss = nn.functional.mse_loss(model(x), y)")
    message = str(info.value)
    assert message.startswith(f"addmm recompiled at {__file__}:{line} in _train"), message
    assert "f32[4,8] -> f32[5,8]" in message


def test_a_shape_change_every_step_stops_once_warm_up_ends(logdir, cold_cache):
    # no step of this loop repeats an earlier one: warm-up ends at the first step that
    # compiles nothing it had not compiled before (the second), and the third is stopped
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RecompileError, match=r"f32\[5,8\] -> f32\[6,8\]"), tpu_debug.trace(
        logdir=logdir, fail_on_recompile=True
    ):
        _train(model, opt, [4, 5, 6, 7])


def test_expect_no_recompiles_block_allows_a_new_ops_shapes_in_its_first_step(cold_cache):
    a, b, c = torch.ones(3, device="tpu"), torch.ones(7, device="tpu"), torch.ones(2, device="tpu")
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tpu_debug.expect_no_recompiles():
        a.atan()
        b.atan()  # the step atan first runs in: one program per shape is warm-up
        _train(model, opt, [4])
    pattern = r"^atan recompiled .*\n.*f32\[(3|7)\] -> f32\[2\]"
    with pytest.raises(RecompileError, match=pattern), tpu_debug.expect_no_recompiles():
        c.atan()  # atan was compiled before the block


def test_expect_no_recompiles_block_stops_a_shape_change_in_a_later_step(cold_cache):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RecompileError, match=r"f32\[4,8\] -> f32\[5,8\]"), tpu_debug.expect_no_recompiles():
        _train(model, opt, [4, 5])


def _run(tmp_path: Path, *argv: str) -> int:
    return main(["run", "--no-report", "--no-hlo", "--logdir", str(tmp_path / "runs"), *argv])


def test_fail_on_recompile_passes_the_mlp_example(tmp_path, cold_cache):
    assert _run(tmp_path, "--fail-on-recompile", str(EXAMPLES / "mlp_train.py"), "--steps", "6") == 0


def test_fail_on_recompile_stops_the_storm_example_in_its_forward(tmp_path, cold_cache):
    script = EXAMPLES / "pitfalls" / "recompile_storm.py"
    assert _run(tmp_path, "--fail-on-recompile", str(script), "--steps", "6") == 1
    error = tpu_debug.open_run(logdir=tmp_path / "runs").metadata().error
    line = _line_of(script, "return self.out(torch.relu(self.hidden(self.embed(tokens))))")
    assert error.startswith(f"RecompileError: embedding recompiled at {script}:{line} in TinyLM.forward"), error
    # the example's batches are LENGTHS[step] tokens long: 12, 17, then 9 in the third step
    assert re.search(r"arg 1 'indices': i64\[4,(12|17)\] -> i64\[4,9\]", error), error


def test_readme_guards_reach_the_sync_they_show(tmp_path, cold_cache):
    # README: `tpu-debug run --fail-on-recompile --transfer-guard-implicit disallow script.py`
    # on examples/pitfalls/hidden_sync.py stops at its first hidden sync, not at a warm-up compile
    script = EXAMPLES / "pitfalls" / "hidden_sync.py"
    argv = ("--fail-on-recompile", "--transfer-guard-implicit", "disallow", str(script))
    assert _run(tmp_path, *argv) == 1
    error = tpu_debug.open_run(logdir=tmp_path / "runs").metadata().error
    line = _line_of(script, "total += loss.item()")
    assert error.startswith("TransferGuardError: implicit device-to-host transfer"), error
    assert f"by .item() at {script}:{line}" in error
