"""A PyTorch model's step (``tpu_debug.fit.model_step``) compiled for a TPU with tensors that hold no data.

The traced step is first checked where it can be: run on this machine's CPU with real
weights, it must give what PyTorch gives (forward, and a training step with AdamW).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_debug.fit.model_step import compile_step, trace_step
from tpu_debug.runtime.target import TargetError
from tpu_debug.runtime.target._libtpu import _find_libtpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)
GiB = 1024**3
SMALL = LlamaConfig(vocab=128, hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2, max_seq=16)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


def _loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


def _arrays(tensors):
    return [np.asarray(t.detach().numpy()) for t in tensors]


def test_the_traced_forward_computes_what_pytorch_computes():
    torch.manual_seed(0)
    model = TinyLlama(SMALL)
    tokens = torch.randint(0, SMALL.vocab, (2, 16))
    traced = trace_step(model, (tokens,))
    assert traced.mode == "inference" and traced.donate == ()
    assert traced.parameters == sum(p.numel() for p in model.parameters())
    flat = [*model.parameters(), *model.buffers(), tokens]
    with jax.enable_x64(True):
        (logits,) = jax.jit(traced.function())(*_arrays(flat))
    expected = model(tokens).detach().numpy()
    # float32 through one block (matmuls, softmax, rsqrt) summed in a different order by
    # XLA and PyTorch: agreement to a few float32 ulps of the logits' scale
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-5)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the model was not moved


def test_the_traced_training_step_is_pytorchs_adamw_step():
    torch.manual_seed(0)
    model = TinyLlama(SMALL)
    tokens = torch.randint(0, SMALL.vocab, (2, 16))
    labels = torch.randint(0, SMALL.vocab, (2, 16))
    traced = trace_step(model, (tokens,), train=True, loss_fn=_loss, targets=(labels,))
    params = list(model.parameters())
    zeros = [torch.zeros_like(p) for p in params]
    flat = [*params, *model.buffers(), *zeros, *zeros, torch.zeros((), dtype=torch.float32), tokens, labels]
    with jax.enable_x64(True):
        out = jax.jit(traced.function())(*_arrays(flat))
    n = len(params)
    loss, new_p, new_m = out[0], out[1:1 + n], out[1 + n:1 + 2 * n]
    assert float(out[-1]) == 1.0  # the step count

    reference = _loss(model(tokens), labels)
    reference.backward()
    grads = [p.grad.clone() for p in params]
    torch.optim.AdamW(params, lr=1e-3).step()  # the defaults AdamW() traces
    np.testing.assert_allclose(float(loss), reference.item(), rtol=1e-5)
    for g, m in zip(grads, new_m):
        # exp_avg after one step is 0.1 * grad: the gradients themselves, float32 backward
        np.testing.assert_allclose(np.asarray(m), 0.1 * g.numpy(), rtol=1e-3, atol=1e-7)
    for p, g, q in zip(params, grads, new_p):
        # step one moves each weight by lr * g / (|g| + eps) (+ decay): where |g| is far
        # above float32 noise the direction is certain and the weights agree; a gradient
        # near 1e-9 can round to either sign on either side, a move of up to 2 * lr
        sure = g.abs().numpy() > 1e-5
        np.testing.assert_allclose(np.asarray(q)[sure], p.detach().numpy()[sure], rtol=1e-5, atol=1e-6)
        assert np.all(np.abs(np.asarray(q) - p.detach().numpy()) <= 2e-3 + 1e-6)


def test_training_needs_a_loss():
    with pytest.raises(TargetError, match=r"compile_step\(train=True\) needs loss_fn\(outputs, \*targets\)"):
        compile_step(nn.Linear(4, 4), (torch.empty(2, 4, device="meta"),), "v5e", train=True)


@requires_libtpu
def test_a_small_llama_serves_and_trains_on_one_chip():
    with torch.device("meta"):
        model = TinyLlama(SMALL).to(torch.bfloat16)
    tokens = torch.empty(8, 16, dtype=torch.long, device="meta")
    served = compile_step(model, (tokens,), "v6e")
    assert served.fits and served.mode == "inference"
    m = served.compile.memory
    inputs_bytes = served.parameter_bytes + 8 * 16 * 8  # tokens are int64
    assert m.argument_bytes >= inputs_bytes  # the same arrays, in padded tiles
    assert m.output_bytes >= 8 * 16 * SMALL.vocab * 2  # bf16 logits
    assert "fits" in served.render()

    trained = compile_step(model, (tokens,), "v6e", train=True, loss_fn=_loss, targets=(tokens,))
    assert trained.fits and trained.mode == "training"
    assert trained.state_bytes == 2 * trained.parameter_bytes  # exp_avg, exp_avg_sq in bf16
    # parameters and AdamW state are updated in place: their outputs alias their inputs
    assert trained.compile.memory.alias_bytes >= trained.parameter_bytes + trained.state_bytes
    assert trained.graph_nodes > served.graph_nodes


@requires_libtpu
def test_a_model_too_big_for_the_chip_does_not_fit_and_is_never_allocated():
    with torch.device("meta"):
        model = nn.Linear(100_000, 100_000, bias=False).to(torch.bfloat16)  # 18.6 GiB of weights
    x = torch.empty(8, 100_000, dtype=torch.bfloat16, device="meta")
    result = compile_step(model, (x,), "v5e")
    assert result.fits is False
    e = result.compile.error
    assert e.required_bytes > result.parameter_bytes > e.available_bytes
    assert "does NOT fit" in result.render()
    assert compile_step(model, (x,), "v5p").fits  # 95 GiB
    # nothing held the weights: this process never came near their size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    assert peak < result.parameter_bytes / 3
