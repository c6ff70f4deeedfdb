"""A compiled model whose optimizer runs outside it, op by op: one finding at the optimizer.step()
line when the optimizer's host work is most of the step, with the fix TorchTPU's guide teaches
(compile the whole step); none once the step is one program, and none where the model's own
work is most of the step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from tpu_debug.tracers.advisor.step_rules import OPTIMIZER_OPS_MIN, OPTIMIZER_SHARE

import tpu_debug

STEPS = 8


def _mlp(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())]).to("tpu")


def _split_run(tmp_path, layers: int, width: int, batch: int, foreach: bool):
    model = _mlp(layers, width)
    cmodel = torch.compile(model, backend="tpu_debug")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=foreach)
    x = torch.randn(batch, width).to("tpu")
    with tpu_debug.trace(logdir=tmp_path) as session:
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            cmodel(x).square().mean().backward()
            opt.step()  # the optimizer's line
    return tpu_debug.open_run(session.run_dir)


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "_line_of" not in text)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """112 parameters updated one by one (foreach=False): three hundred small eager ops per step,
    each with the optimizer's Python around it, after a compiled model of tiny matmuls."""
    return _split_run(tmp_path_factory.mktemp("split"), layers=56, width=8, batch=4, foreach=False)


def test_an_optimizer_outside_a_compiled_model_is_one_finding_at_its_line(split):
    steady = [s for s in split.steps() if s.optimizer_ops]
    assert steady and all(s.graph_runs >= 2 for s in steady)  # the model's forward and backward programs
    # SGD with momentum, one parameter at a time: at least one op per parameter and step
    assert all(s.optimizer_ops >= 112 for s in steady)
    assert all(0 < s.optimizer_seconds <= s.seconds for s in steady)
    found = [f for f in split.findings() if f.kind == "split_step"]
    assert len(found) == 1, [(f.kind, f.title) for f in split.findings()]
    f = found[0]
    assert f.severity == "warning" and f.estimated
    loc = f.evidence.location
    assert loc is not None and loc.file == __file__
    assert loc.line == _line_of("opt.step()  # the optimizer's line")
    counts = {c.name: c.value for c in f.evidence.counts}
    assert counts["optimizer eager ops per step"] >= 112
    assert counts["share of a steady step"] >= 100 * OPTIMIZER_SHARE
    # each step's optimizer time is inside the step: so is the middle one's
    assert 0 < counts["optimizer.step() time per step"] <= counts["step time"]
    # the host work is part of each step's optimizer time: so is the middle one's
    assert counts["optimizer host work per step"] <= counts["optimizer.step() time per step"]
    assert "tpu_debug.compile(step)" in f.fix and "optimizer.step()" in f.fix
    # one cause, one finding: the eager ops are the optimizer's, said once
    assert not [g for g in split.findings() if g.kind == "eager_tiny_ops"]


def test_the_whole_step_compiled_is_silent(tmp_path):
    model = _mlp(24, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(4, 16).to("tpu")

    @tpu_debug.compile
    def step(x):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    with tpu_debug.trace(logdir=tmp_path) as session:
        for _ in range(STEPS):
            step(x)
    run = tpu_debug.open_run(session.run_dir)
    assert [s.optimizer_ops for s in run.steps()][1:] == [0] * (len(run.steps()) - 1)
    assert not [f for f in run.findings() if f.kind == "split_step"]


def test_a_model_whose_own_work_is_the_step_is_silent(tmp_path):
    """Twelve parameters updated one by one after wide matmuls: as many optimizer ops as a
    finding needs, but the model's work is the step, and the split costs little."""
    run = _split_run(tmp_path, layers=6, width=256, batch=1024, foreach=False)
    steady = [s for s in run.steps() if s.optimizer_ops]
    assert steady and all(s.graph_runs >= 2 for s in steady)
    assert sorted(s.optimizer_ops for s in steady)[len(steady) // 2] >= OPTIMIZER_OPS_MIN
    assert not [f for f in run.findings() if f.kind == "split_step"]


def test_a_foreach_optimizer_is_silent(tmp_path):
    """PyTorch's default foreach optimizer runs a handful of ops per step however many
    parameters it updates: fewer than a finding needs."""
    run = _split_run(tmp_path, layers=8, width=16, batch=4, foreach=True)
    steady = [s for s in run.steps() if s.optimizer_ops]
    assert steady and all(0 < s.optimizer_ops < OPTIMIZER_OPS_MIN for s in steady[1:])
    assert not [f for f in run.findings() if f.kind == "split_step"]
