"""A dry run of an inference loop that does not fit: its fixes fit inference, and its need is
what is held at once.

The weights' bytes come from PyTorch's own accounting (``numel() * element_size()``). An
inference loop keeps nothing for a backward pass and has no gradients or optimizer state, so
neither activation checkpointing nor sharding optimizer state is a fix. The weights'
initialisation (``randn``) runs before the weights exist: its temporaries never meet the
forward's peak and must not add to the need.
"""

from __future__ import annotations

import torch

import tpu_debug
from tpu_debug.tracers.reading.memory_view import describe_fix, memory_view


def _inference(layers: int, width: int):
    # made on the device: a dry run holds no values, so the 18 GiB never exist on this machine
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device="tpu") for _ in range(layers)])
    model.eval()
    x = torch.randn(64, width, device="tpu")
    with torch.no_grad():
        for _ in range(2):
            model(x)
    return model


def test_an_inference_dry_run_gets_inference_fixes_and_no_init_temporaries(tmp_path):
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target="v5e") as session:
        model = _inference(layers=72, width=8192)  # 72 x 256 MiB of float32 weights: over 15.75 GiB
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    view = memory_view(tpu_debug.open_run(session.run_dir))
    s = view.summary
    assert s is not None and s.dry_run and s.trains is False
    assert s.peak_bytes >= weights
    # every program's temporaries fit under the peak: the need is the peak itself
    assert s.required_bytes == s.peak_bytes, (s.required_bytes, s.peak_bytes, s.temp_program, s.temp_live_bytes)
    assert view.findings, "a 18 GiB model on a 15.75 GiB chip does not fit"
    texts = [describe_fix(f) for f in view.findings[0].fixes]
    assert not any(f.remedy == "checkpointing" for f in view.findings[0].fixes), texts
    assert not any("optimizer" in t or "gradients" in t for t in texts), texts
    assert any("bfloat16" in t for t in texts) and any("chips" in t for t in texts), texts


def test_a_training_dry_run_is_known_to_train(tmp_path):
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target="v5e") as session:
        model = torch.nn.Linear(256, 256).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 256, device="tpu")).sum().backward()
            opt.step()
            opt.zero_grad()
    s = memory_view(tpu_debug.open_run(session.run_dir)).summary
    assert s is not None and s.trains is True
