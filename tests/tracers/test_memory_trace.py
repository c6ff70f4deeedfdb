"""``trace(memory=True)``: the device bytes of a training loop per step, recorded in the run
store and read back by the report and ``memory_view``.

What stays between steps is known from PyTorch's own accounting: parameters, their
gradients and SGD's momentum buffers, each ``numel() * element_size()`` bytes.
"""

from __future__ import annotations

import gc
import io

import torch

import tpu_debug
from tpu_debug.tracers.reading.memory_view import memory_view


def test_a_traced_training_loop_records_bytes_per_step(logdir):
    gc.collect()
    steps = 3
    with tpu_debug.trace(logdir=logdir, memory=True) as session:
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(steps):
            x = torch.randn(64, 128).to("tpu")
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    run = tpu_debug.open_run(session.run_dir)
    view = memory_view(run)
    assert [s.step for s in view.steps] == list(range(steps))
    s = view.summary
    assert s is not None and s.steps == steps and s.target is None and s.fits is None and not s.dry_run
    # parameters, their gradients and SGD's momentum buffers stay between steps
    assert s.end_bytes >= 3 * params and s.persistent_bytes >= 3 * params
    assert s.peak_bytes >= s.end_bytes and s.peak_bytes == max(e.peak_bytes for e in view.steps)
    lines = {(h.file, h.phase) for h in s.holders}
    assert (__file__, "optimizer") in lines, lines  # the momentum buffers, made in opt.step()
    assert any(f == __file__ and p == "forward" for f, p in lines), lines
    buf = io.StringIO()
    tpu_debug.print_report(run, file=buf, terminal=False, width=160)
    text = buf.getvalue()
    assert "Memory" in text and "held at the peak by" in text and "test_memory_trace.py:" in text, text
