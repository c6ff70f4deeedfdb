"""Compiled divergence on what the real compiled program computes: outputs, then the first fused node."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from tpu_debug.tracers.recording.divergence.fused_checker import CallSchedule

import tpu_debug

# bfloat16 keeps 8 significant bits: one rounding moves a value by up to 2**-8 of it, and
# assert_close's bfloat16 rtol (1.6e-2, the divergence default) allows about four such
# roundings. An output over it is more than bfloat16's own rounding between two backends.
BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-5
SHIFT = 65536.0  # float32 spacing here is 2**-7: a value shifted up and back keeps only 7 fraction bits


def shifted(x, w):
    t = x.float() + SHIFT
    y = (t - SHIFT).to(torch.bfloat16)
    return y * w


SUB_LINE = inspect.getsourcelines(shifted)[1] + 2


def _over(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Elements over bfloat16 tolerance, by assert_close's rule, against the CPU result."""
    out, ref = out.double(), ref.double()
    return int(((out - ref).abs() > BF16_ATOL + BF16_RTOL * ref.abs()).sum())


def test_drift_only_the_fused_program_has_is_found_at_its_line(logdir):
    # XLA folds the two constants of `(t + SHIFT) - SHIFT` into one inside the fused program,
    # so `t`'s float32 rounding at 65536 never happens there; PyTorch rounds it op by op
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w = torch.randn(64, 128, dtype=torch.bfloat16) * 0.05, torch.randn(128, dtype=torch.bfloat16)
    compiled = tpu_debug.compile(shifted)
    before = compiled(x.to("tpu"), w.to("tpu")).cpu()
    cpu = shifted(x, w)
    assert _over(before, cpu) > 100  # the drift is real: the compiled output leaves bfloat16 tolerance
    assert _over(shifted(x.to("tpu"), w.to("tpu")).cpu(), cpu) == 0  # op by op on the device it does not
    torch.testing.assert_close(before, x * w, rtol=0, atol=0)  # the fold: exactly x*w, never shifted
    # the node-by-node check sampled down to no node: the outputs alone find it
    with tpu_debug.trace(logdir=logdir, divergence=True, divergence_sample=1000) as session:
        out = compiled(x.to("tpu"), w.to("tpu")).cpu()
    torch._dynamo.reset()
    assert torch.equal(out, before)  # the check never changes the user's results
    assert not session.internal_errors()
    (output,) = session.divergences(measure="output")
    assert (output.target, output.mode, output.first) == ("mul.Tensor", "compiled", True)
    assert output.mismatched == _over(before, cpu) and output.rtol == BF16_RTOL
    first = session.divergences.first("fused")
    assert (first.name, first.target, first.dtype) == ("sub", "sub.Tensor", "float32")
    assert (first.location.file, first.location.line) == (__file__, SUB_LINE)
    assert first.verdict == ""  # nothing the node check saw explains it: it is the fused program's
    assert session.divergences(measure="local") == []
    summary = session.divergences.summary()
    # one output; bisection over the cast up, add, sub, the cast back and mul: 3 programs (mul, add, sub)
    assert (summary.outputs_compared, summary.over_output, summary.fused_programs) == (1, 1, 3)
    (finding,) = [f for f in session.findings() if f.kind == "divergence"]
    assert finding.cause == "fused" and finding.evidence.location.line == SUB_LINE
    assert "first node that drifts in the fused program" in finding.title
    report = " ".join(session.summary().split())
    assert "first node that drifts in the fused program: sub (sub.Tensor" in report


def test_the_advisor_keeps_one_finding_when_the_node_check_names_the_same_node(logdir):
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w = torch.randn(64, 128, dtype=torch.bfloat16) * 0.05, torch.randn(128, dtype=torch.bfloat16)
    compiled = tpu_debug.compile(shifted)
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        compiled(x.to("tpu"), w.to("tpu"))
    torch._dynamo.reset()
    local, fused = session.divergences.first(), session.divergences.first("fused")
    assert (local.name, fused.name) == ("sub", "sub")
    (finding,) = [f for f in session.findings() if f.kind == "divergence"]
    assert finding.cause == "local" and finding.evidence.location.line == SUB_LINE


def test_clean_compiled_float32_program_is_not_flagged(logdir):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = tpu_debug.compile(model)
    x, y = torch.randn(16, 32).to("tpu"), torch.randint(0, 8, (16,)).to("tpu")
    with tpu_debug.trace(logdir=logdir, divergence=True) as session:
        for _ in range(3):
            loss = F.cross_entropy(step(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    torch._dynamo.reset()
    assert not session.internal_errors()
    assert session.divergences(over=True) == []
    summary = session.divergences.summary()
    assert summary.graphs_compared == 6  # forward and backward, three steps: every call checked
    assert summary.outputs_compared >= 6 and (summary.over_output, summary.fused_programs) == (0, 0)


def test_call_schedule_checks_the_first_calls_then_every_nth():
    schedule = CallSchedule(first=3, every=10)
    due = [n for n in range(1, 41) if schedule.due("g")]
    assert due == [1, 2, 3, 13, 23, 33]
    assert schedule.skipped == 40 - len(due)
    assert schedule.due("other")  # each graph counts its own calls


def test_bisection_leaves_random_draws_and_results_as_they_were(logdir):
    # random nodes in the fused programs draw with the call's own key: the stream does not move
    # (additive noise: a random node's whole value is taken from the device, so a dropout at
    # the end would carry the drift into the CPU side too)
    def noisy(x, w):
        y = shifted(x, w)
        return y + torch.randn_like(y) * 1e-3

    x, w = torch.randn(64, 128, dtype=torch.bfloat16) * 0.05, torch.randn(128, dtype=torch.bfloat16)

    def run(traced: bool):
        torch._dynamo.reset()
        compiled = tpu_debug.compile(noisy)
        torch.manual_seed(1)
        if not traced:
            return compiled(x.to("tpu"), w.to("tpu")).cpu(), torch.rand(8, device="tpu").cpu(), None
        with tpu_debug.trace(logdir=logdir, divergence=True, divergence_sample=1000) as session:
            out = compiled(x.to("tpu"), w.to("tpu")).cpu()
            after = torch.rand(8, device="tpu").cpu()
        return out, after, session

    plain_out, plain_after, _ = run(False)
    out, after, session = run(True)
    torch._dynamo.reset()
    assert torch.equal(out, plain_out) and torch.equal(after, plain_after)
    assert session.divergences.first("fused").name == "sub"
    assert session.divergences.summary().fused_programs >= 2
    assert not session.internal_errors()


def test_an_input_the_program_updates_is_compared_with_its_cpu_update(logdir):
    def update(p, g):
        p.mul_(((g.float() + SHIFT) - SHIFT).to(torch.bfloat16))

    torch._dynamo.reset()
    torch.manual_seed(0)
    p0, g = torch.randn(256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16) * 0.05
    compiled = tpu_debug.compile(update)
    p, cpu = p0.to("tpu"), p0.clone()
    update(cpu, g)
    with tpu_debug.trace(logdir=logdir, divergence=True, divergence_sample=1000) as session:
        compiled(p, g.to("tpu"))
    torch._dynamo.reset()
    assert _over(p.cpu(), cpu) > 10  # the update the user receives leaves tolerance
    (output,) = session.divergences(measure="output")
    assert output.target == "mul.Tensor" and output.mismatched == _over(p.cpu(), cpu)
    assert session.divergences.first("fused").name == "sub"
    assert not session.internal_errors()
