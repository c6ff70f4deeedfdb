"""A 0-d float64 that dynamo made from a Python float argument is not the user's float64;
a float64 tensor of the user's still is a finding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from source_helpers import line_of
from torch import nn

import tpu_debug
from tpu_debug.report import print_report, report_data

pytestmark = pytest.mark.usefixtures("forget_graphs")


def _annealed(tmp_path):
    torch.manual_seed(0)
    teacher = nn.Linear(16, 10).to("tpu")
    student = nn.Linear(16, 10).to("tpu")
    opt = torch.optim.SGD(student.parameters(), lr=0.05)

    @torch.compile(backend="tpu_debug")
    def distill_loss(s_logits, t_logits, T):
        p = F.log_softmax(s_logits / T, dim=-1)
        q = F.softmax(t_logits / T, dim=-1)
        return F.kl_div(p, q, reduction="batchmean") * (T * T)

    T = 4.0
    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        for _ in range(8):
            x = torch.randn(8, 16, device="tpu")
            with torch.no_grad():
                t = teacher(x)
            distill_loss(student(x), t, T).backward()
            opt.step()
            opt.zero_grad()
            T = max(1.0, T * 0.9)  # a Python float that changes: dynamo passes it as a tensor
    return session


def test_an_annealed_temperature_is_not_the_users_float64(tmp_path):
    session = _annealed(tmp_path)
    # the premise: once T changed, dynamo passed it as a 0-d float64 and the backward got it
    wide = [c for c in session.compiles(mode="compiled") if "float64" in c.signature]
    assert wide and all(
        a.shape == () for c in wide for a in c.args if a.dtype == "float64"
    ), [c.signature for c in wide]
    assert [f for f in session.findings() if f.kind == "float64"] == []


def test_the_float64_section_agrees_with_findings_on_a_scalar_pytorch_made(tmp_path):
    session = _annealed(tmp_path)
    assert [f for f in session.findings() if f.kind == "float64"] == []
    ops = report_data(session)["float64"]
    assert ops and {o["origin"] for o in ops} == {"python_float"}, ops
    out = io.StringIO()
    print_report(session, file=out, terminal=False, width=120)
    text = out.getvalue()
    section = text[text.index("\nfloat64\n"):]
    assert "(see Findings)" not in section
    assert f"{len(ops)} op(s) ran with float64 values that PyTorch made, not the program; not a finding" in section
    assert "a 0-d scalar dynamo made from a Python float" in section


def test_a_float64_scalar_of_the_users_is_still_a_finding(tmp_path):
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = torch.tensor(np.float64(0.5)).to("tpu")  # a NumPy scalar: float64

    @torch.compile(backend="tpu_debug")
    def loss_fn(pred, y, w):
        return ((pred - y).square().mean() * w).float()

    def loop():
        for _ in range(6):
            x, y = torch.randn(4, 8, device="tpu"), torch.randn(4, 1, device="tpu")
            loss = loss_fn(model(x), y, weight)  # call
            loss.backward()
            opt.step()
            opt.zero_grad()

    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        loop()
    (finding,) = [f for f in session.findings() if f.kind == "float64"]
    assert finding.severity == "error" and "from_numpy" in finding.fix
    assert any(t.endswith("/forward") for t in finding.targets), finding.targets
    # the compiled function's compile is pinned to the line that called it
    loc = finding.evidence.location
    assert (loc.file, loc.line) == (__file__, line_of(loop, "# call"))
