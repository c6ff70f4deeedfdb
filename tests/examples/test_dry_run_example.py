"""examples/dry_run_llama.py, the README's dry-run command, at a size that runs here for real:
its forward gives the logits a Llama of that config gives on CPU."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_example_builds_a_llama_of_the_sizes_given(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["dry_run_llama.py", "--hidden", "64", "--vocab", "256", "--heads", "4",
                                      "--kv-heads", "2", "--batch", "2", "--seq", "8", "--dtype", "float32"])
    monkeypatch.syspath_prepend(str(ROOT))
    example = runpy.run_path(str(ROOT / "examples" / "dry_run_llama.py"), run_name="dry_run_llama")
    assert example["main"](sys.argv[1:]) == 0
    out = capsys.readouterr().out
    assert "logits (2, 8, 256) torch.float32" in out
    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    # the same config built on CPU (intermediate: 7/2 of hidden, as the example sets it)
    model = TinyLlama(LlamaConfig(vocab=256, hidden=64, intermediate=224, layers=2, heads=4, kv_heads=2,
                                  max_seq=8))
    assert f"Llama forward: {sum(p.numel() for p in model.parameters())} parameters" in out
