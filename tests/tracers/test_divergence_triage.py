"""Divergence triage: float32 noise (through a zero crossing) or an op that computes the wrong thing.

The noise cases are built deterministically: XLA's float32 ``tanh`` rounds some
inputs one ulp above PyTorch's on CPU. The test picks such inputs (measured, not
assumed) and subtracts PyTorch's own ``tanh`` of them, so the CPU run sees an
exact ``0`` where the device sees ``+1 ulp``: a relu (or a ``> 0`` mask) then
takes another branch on the device, and the gradient (or the masked value)
differs by a whole value, far over tolerance, though no op is wrong. The wrong
case patches the ``tanh`` lowering 1 % off, which float64 cannot explain away.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from tpu_debug.tracers.recording.divergence import triage
from tpu_debug.tracers.events import Crossing, DivergenceEvent
from tpu_debug.tracers.reading import RunQuery
from tpu_debug.tracers.recording.run_writer import RunWriter

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_divergence import _off_by_one_percent, aten, wrong_lowering

CROSSED = 3  # gate inputs set on the device's side of the zero


class Gate(nn.Module):
    """``relu(tanh(x) - offset)`` (or, ``mask=True``, ``x * (tanh(x) - offset > 0)``)."""

    def __init__(self, n: int, mask: bool) -> None:
        super().__init__()
        self.mask = mask
        self.register_buffer("offset", torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.tanh(x) - self.offset
        if self.mask:
            return x * (t > 0)
        return torch.relu(t)


class Net(nn.Module):
    """A small CNN (conv, batch norm in train mode, relu) and a tanh-gated head."""

    def __init__(self, mask: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)
        self.gate = Gate(8, mask)
        self.head = nn.Linear(8, 4)

    def forward(self, img: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.bn(self.conv(img))).mean((2, 3))
        return self.head(self.gate(h)).sum() + features.sum()


GATE_LINE = inspect.getsourcelines(Gate.forward)[1] + 1  # the line computing t (tanh, sub)


def _setup(mask: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model on ``tpu`` in train mode, an image and gate inputs of which the first
    :data:`CROSSED` land a float32 rounding above the gate's zero on the device only."""
    torch.manual_seed(0)
    candidates = torch.linspace(-2, 2, 4001)
    above = candidates[torch.tanh(candidates.to("tpu")).cpu() > torch.tanh(candidates)]
    assert len(above) >= CROSSED, "XLA's tanh rounds like PyTorch's here: no input crosses"
    h = torch.full((8,), 0.5)
    h[:CROSSED] = above[:CROSSED]
    net = Net(mask)
    net.gate.offset.copy_(torch.tanh(h))  # CPU: exactly 0 for every element
    net.gate.offset[CROSSED:] = -1.0  # the rest well inside the relu: no crossing there
    net.train().to("tpu")
    return net, torch.randn(2, 1, 6, 6).to("tpu"), h.to("tpu").requires_grad_()


def _step(model, img, h) -> None:
    model(img, h).backward()


def test_relu_crossing_is_float32_noise_eager(logdir):
    net, img, h = _setup(mask=False)
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        _step(net, img, h)
    over = session.divergences(over=True)
    # no op is over tolerance on its own inputs: all the error is drift from the crossing
    assert over and all(e.measure == "drift" for e in over)
    assert all(e.verdict == "noise" and e.basis == "upstream" for e in over)
    grad = next(e for e in over if e.name == "threshold_backward")
    assert grad.phase == "backward" and grad.max_abs > 0.1
    crossing = grad.crossings[0]
    assert (crossing.op, crossing.branch, crossing.elements, crossing.numel) == ("relu", "zero", CROSSED, 8)
    assert crossing.module == "gate" and crossing.line == GATE_LINE + 3
    assert crossing.file == __file__
    text = grad.triage_text()
    assert text.startswith("float32 noise: this op matches CPU on its own inputs")
    assert f"{CROSSED} elements (of 8) cross relu's zero in `gate`" in text
    assert not session.internal_errors()
    report = session.summary()
    assert "cross relu's zero in `gate`" in " ".join(report.split())


def test_comparison_crossing_is_noise_compiled(logdir):
    torch._dynamo.reset()
    net, img, h = _setup(mask=True)
    model = tpu_debug.compile(net)
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        _step(model, img, h)
    torch._dynamo.reset()
    over = session.divergences(over=True)
    nodes = [e for e in over if e.measure in ("local", "drift")]
    assert nodes and all(e.mode == "compiled" and e.measure == "drift" for e in nodes)
    # the real program's outputs drift too, for the same reason: noise, not a fused-program effect
    assert all(e.verdict == "noise" for e in over) and {e.measure for e in over} >= {"output", "fused"}
    mul = next(e for e in nodes if e.target == "mul.Tensor")
    crossing = mul.crossings[0]
    assert (crossing.op, crossing.branch, crossing.elements) == ("gt.Scalar", "comparison", CROSSED)
    assert crossing.module == "gate" and crossing.line == GATE_LINE + 2
    assert "cross gt.Scalar's comparison in `gate`" in mul.triage_text()
    assert not session.internal_errors()


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_wrong_lowering_is_wrong_in_float64(logdir, mode):
    torch._dynamo.reset()
    net, img, h = _setup(mask=False)
    model = tpu_debug.compile(net) if mode == "compiled" else net
    with (
        wrong_lowering(aten.tanh.default, _off_by_one_percent),
        tpu_debug.trace(logdir=logdir, divergence=True) as session,
    ):
        _step(model, img, h)
    torch._dynamo.reset()
    first = session.divergences.first()
    assert (first.target or first.name, first.measure, first.mode) == ("tanh", "local", mode)
    assert (first.verdict, first.basis, first.f64_mismatched) == ("wrong", "float64", 8)
    assert 1e-3 < first.f64_max_abs <= 0.01  # 1 % of tanh's values, |tanh| < 1
    assert first.triage_text().startswith("the op is wrong: in float64 the device still differs")
    downstream = [e for e in session.divergences(measure="drift", over=True) if e.basis == "upstream"]
    assert downstream and all(e.verdict == "wrong" and e.upstream.startswith("tanh") for e in downstream)
    assert not session.internal_errors()
    report = " ".join(session.summary().split())
    assert "the op is wrong: in float64 the device still differs" in report


def test_rounding_over_a_tight_tolerance_is_noise_in_float64(logdir):
    # with no tolerance at all the device's tanh is "over" by its ulp: float64 clears it
    x = torch.linspace(-2, 2, 64).to("tpu")
    with tpu_debug.trace(logdir=logdir, divergence=True, tolerances="float32=0:0") as session:
        torch.tanh(x)
    (local,) = session.divergences(measure="local", over=True)
    assert (local.name, local.verdict, local.basis, local.f64_mismatched) == ("tanh", "noise", "float64", 0)
    assert local.f64_max_abs < 1e-12
    assert local.triage_text().startswith("float32 noise: in float64 the device matches CPU")


def test_crossing_tables():
    dev = (torch.tensor([1e-9, -1.0, 2.0]),), {}
    cpu = (torch.tensor([-1e-9, -1.0, 2.0]),), {}
    assert triage.crossings_in("relu", dev, cpu) == ("zero", 1, 3)
    assert triage.crossings_in("relu", dev, dev) is None
    above, below = (torch.tensor([1.0 + 1e-6, 0.0]),), (torch.tensor([1.0 - 1e-6, 0.0]),)
    assert triage.crossings_in("hardtanh", (above, {}), (below, {})) == ("bounds", 1, 2)
    assert triage.crossings_in("exp", dev, cpu) is None  # smooth: no branch
    # argmax: a near-tie broken the other way (its result is the branch)
    assert triage.crossings_out("argmax", [torch.tensor([0, 1]).numpy()], [torch.tensor([0, 0])]) == ("tie", 1, 2)


def test_causes_keep_the_first_of_each_kind_and_wrong_wins():
    causes = triage.Causes()
    cross = [causes.new("crossing", crossing=Crossing("relu", i + 1, 8)) for i in range(6)]
    noise = causes.new("noise", where="exp at m.py:3")
    wrong = causes.new("wrong", where="silu at m.py:9")
    merged = triage.Causes.merge(cross, [noise])
    assert len(merged) == triage._KEPT + 1 and {c.crossing.elements for c in merged if c.crossing} == {1, 2, 3, 4}
    noisy = triage.Causes.triage(merged)
    assert (noisy.verdict, noisy.upstream, noisy.crossings[0].elements) == ("noise", "exp at m.py:3", 1)
    assert triage.Causes.triage(merged | {wrong}) == triage.Triaged("wrong", "upstream", upstream="silu at m.py:9")
    assert triage.Causes.triage([causes.new("unknown")]) == triage.NOT_TRIAGED


def test_verdict_and_crossings_round_trip_through_the_store(tmp_path):
    crossings = (Crossing("relu", 3, 8, "zero", "gate", "/x/net.py", 20), Crossing("max.dim", 1, 4, "tie"))
    event = DivergenceEvent(
        1, 0.5, "eager", 7, None, "threshold_backward", "drift", 0.5, 1.0, None, 3, False, 1e-5, False,
        dtype="float32", verdict="noise", basis="upstream", upstream="exp at net.py:3", crossings=crossings,
    )
    wrong = dataclasses.replace(
        event, id=2, measure="local", verdict="wrong", basis="float64", f64_max_abs=3e-3, f64_mismatched=5,
        upstream="", crossings=(),
    )
    writer = RunWriter(tmp_path / "run.db", {"name": "triage"})
    writer.put(event)
    writer.put(wrong)
    writer.close({"status": "finished", "exit_status": 0})
    assert writer.error is None
    assert RunQuery(tmp_path / "run.db").divergences() == [event, wrong]
    assert event.triage_text() == (
        "float32 noise: this op matches CPU on its own inputs; the difference starts where "
        "3 elements (of 8) cross relu's zero in `gate` (net.py:20)"
    )


def test_float32_rounding_of_large_values_is_as_close_as_cpu_and_a_bfloat16_product_is_not():
    from tpu_debug.tracers.recording.divergence.triage import as_close_as_cpu

    torch.manual_seed(0)
    x = 1e5 + 10 * torch.randn(64, 256)
    w = torch.randn(256, 16)
    cpu = torch.mm(x, w)
    # another float32 summation order (blocks of 16, then their sum): a float32 result as good as CPU's,
    # yet over float32's default tolerance, whose rtol is set for values near 1 (max abs ~1e-1 here)
    blocked = sum(torch.mm(x[:, i:i + 16], w[i:i + 16]) for i in range(0, 256, 16)).numpy()
    assert not np.allclose(blocked, cpu.numpy(), rtol=1.3e-6, atol=1e-5)
    assert as_close_as_cpu(torch.ops.aten.mm.default, (x, w), {}, [blocked], [cpu])
    # bfloat16 inputs (a TPU's default matmul precision): hundreds off, far beyond rounding
    bf16 = torch.mm(x.bfloat16().float(), w.bfloat16().float()).numpy()
    assert not as_close_as_cpu(torch.ops.aten.mm.default, (x, w), {}, [bf16], [cpu])


# -- TPU numerics: products held to the emulated precision, decisions it changes ------------------------


def test_a_product_is_held_to_the_precision_it_emulates_not_to_float32():
    from tpu_debug.tracers.recording.divergence.emulated_precision import measure_product

    torch.manual_seed(0)
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    cpu = a @ b
    bf16 = (a.bfloat16().double() @ b.bfloat16().double()).float().numpy()  # one pass: a TPU's default
    assert not np.allclose(bf16, cpu.numpy(), rtol=1.3e-6, atol=1e-5)  # far over float32's tolerance
    assert not measure_product(bf16, cpu, False).over
    # the same operands at an offset 1000 times their variation: the rows' variation is lost
    shifted = a + 1000
    cpu = shifted @ b
    lost = (shifted.bfloat16().double() @ b.bfloat16().double()).float().numpy()
    m = measure_product(lost, cpu, True)
    assert m.over and m.ratio > 1
    # one value (a dot product) is held to its magnitude: there is no variation to keep
    dot = torch.dot(a[0], b[:, 0])
    assert not measure_product(np.asarray(a[0].bfloat16().double() @ b[:, 0].bfloat16().double(), dtype=np.float32),
                               dot, False).over


def test_a_decision_the_emulated_precision_changes_is_its_verdict_when_a_share_changed():
    from tpu_debug.tracers.recording.divergence.emulated_precision import (
        DECISION_SHARE,
        PRECISION,
        changed_decision,
    )

    causes = triage.Causes()
    product = causes.new(PRECISION, where="mm at kmeans.py:15")
    crossing = Crossing("argmin", 300, 512, "tie", "", "/x/kmeans.py", 16)
    verdict = changed_decision("argmin", ("tie", 300, 512), [product], crossing)
    assert (verdict.verdict, verdict.basis, verdict.upstream, verdict.crossings) == (
        "precision", "upstream", "mm at kmeans.py:15", (crossing,))
    # a few near-ties: any precision breaks some
    few = int(DECISION_SHARE * 10_000) - 1
    assert changed_decision("argmax", ("tie", few, 10_000), [product], crossing) is None
    # no product at the emulated precision before it, or a wrong op: not the precision's doing
    assert changed_decision("argmin", ("tie", 300, 512), [causes.new("noise", where="sum at x.py:3")], crossing) is None
    assert changed_decision("argmin", ("tie", 300, 512), [product, causes.new("wrong", where="exp")], crossing) is None
    # max over a dimension returns a value first: which index holds it is no decision seen here
    assert changed_decision("max.dim", ("tie", 300, 512), [product], crossing) is None
    assert changed_decision("gt.Scalar", ("comparison", 300, 512), [product], crossing).verdict == "precision"
