"""float64 on a backend that has it, noted for the TPU that does not."""

from __future__ import annotations

import io

import torch
from tpu_debug.tui.screens.overview import finding_lines

import tpu_debug


def test_float64_ops_are_noted_in_store_report_and_overview(logdir, cold_cache):
    with tpu_debug.trace(logdir=logdir) as session:
        x = torch.arange(6, dtype=torch.float64).to("tpu")
        y = (x * 2.5 + 1).sum()  # float64 math: mul, add, sum
        z = torch.ones(3, device="tpu") * 2  # float32: not noted
        assert y.item() == 43.5 and z.sum().item() == 6.0
    run = tpu_debug.open_run(session.run_dir)
    wide = run.ops.float64()
    assert {"mul.Tensor", "add.Tensor", "sum"} <= set(wide), wide
    assert all(programs >= 1 and runs >= 1 for programs, runs in wide.values())
    assert not any("ones" in name for name in wide)
    buf = io.StringIO()
    tpu_debug.print_report(run, file=buf, terminal=False, width=160)
    text = buf.getvalue()
    assert "a TPU has no float64" in text and "mul.Tensor" in text, text
    (finding,) = [f for f in run.findings() if f.kind == "float64"]
    assert finding.severity == "error" and "a TPU has no float64" in finding.title
    assert {"mul.Tensor", "add.Tensor", "sum"} <= set(finding.targets)
    lines = [f.text.plain for f in finding_lines(run, None)]
    assert any("a TPU has no float64" in line for line in lines), lines


def test_float32_run_has_no_float64_note(logdir):
    with tpu_debug.trace(logdir=logdir) as session:
        (torch.ones(4, device="tpu") + 1).sum().item()
    assert tpu_debug.open_run(session.run_dir).ops.float64() == {}


def test_runtime_notes_float64_ops_without_a_trace(cold_cache):
    from tpu_debug import runtime

    before = runtime.float64_ops().get("div.Tensor", 0)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64).to("tpu")
    (x / x).cpu()
    torch.ones(2, device="tpu").div(2)  # float32: not noted
    after = runtime.float64_ops()
    assert after["div.Tensor"] == before + 1
    runtime.clear_cache()  # the note outlives the executable cache
    assert runtime.float64_ops()["div.Tensor"] == before + 1


def test_the_float64_finding_points_where_the_data_entered_the_device(logdir, cold_cache):
    import inspect

    import numpy as np

    with tpu_debug.trace(logdir=logdir) as session:
        host = torch.from_numpy(np.linspace(0.0, 1.0, 8))  # float64, as NumPy makes it
        x = host.to("tpu")  # the upload
        y = torch.ones(8, device="tpu")
        (x * y).sum().item()  # the first float64 op
    source, start = inspect.getsourcelines(test_the_float64_finding_points_where_the_data_entered_the_device)
    upload = start + next(i for i, line in enumerate(source) if "# the upload" in line)
    (finding,) = [f for f in tpu_debug.open_run(session.run_dir).findings() if f.kind == "float64"]
    assert finding.evidence.location is not None and finding.evidence.location.line == upload, finding
    assert any("first float64 op" in fact for fact in finding.evidence.facts), finding.evidence.facts
