"""Splash attention (runtime/torchtpu/splash_attention.py: JAX's splash Pallas kernel, interpreted on
CPU) against PyTorch's ``scaled_dot_product_attention`` on CPU, forward and backward, with
TorchTPU's masks; and TorchTPU's jagged-tensor padding helpers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tpu_debug.core.errors import TpuArgumentError

B, H, S, D = 1, 2, 128, 32


def _qkv(kv_heads: int = H, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, kv_heads, S, D, generator=g)
    v = torch.randn(B, kv_heads, S, D, generator=g)
    return q, k, v


def _window_mask(window: int) -> torch.Tensor:
    # each query sees itself and the `window` keys before it
    i = torch.arange(S)
    return (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)


@pytest.mark.parametrize("case", ["causal", "full", "window"])
def test_splash_is_scaled_dot_product_attention(case):
    from torch_tpu.ops import splash_attention

    q, k, v = _qkv()
    kwargs = {"causal": {}, "full": {"is_causal": False}, "window": {"local_window_size": 16}}[case]
    out = splash_attention.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), **kwargs)
    reference = {
        "causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "full": lambda: F.scaled_dot_product_attention(q, k, v),
        "window": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(16)),
    }[case]()
    assert out.device.type == "tpu" and out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.cpu(), reference, rtol=1e-5, atol=1e-5)


def test_splash_gradients_and_grouped_heads_match_cpu_autograd():
    q, k, v = _qkv(kv_heads=1, seed=1)
    on_tpu = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    out = torch.tpu.ops.splash_sdpa(*on_tpu, scale=0.3, enable_gqa=True)
    (out * torch.linspace(-1, 1, D, device="tpu")).sum().backward()
    on_cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*on_cpu, is_causal=True, scale=0.3, enable_gqa=True)
    (expected * torch.linspace(-1, 1, D)).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(on_tpu, on_cpu):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-4)


def test_splash_checks_what_torchtpu_checks():
    from torch_tpu._internal.ops.splash_attention import splash_sdpa

    q, k, v = (t.to("tpu") for t in _qkv(kv_heads=1))
    with pytest.raises(TpuArgumentError, match=r"^enable_gqa \(False\) does not match inputs: n_heads=2, n_kv_heads=1"):
        splash_sdpa(q, k, v)
    with pytest.raises(TpuArgumentError, match=r"takes \(batch, heads, seq, head_dim\) tensors"):
        splash_sdpa(q[0], k[0], v[0])


def test_jagged_padding_round_trips():
    from torch_tpu._internal import ops

    rows = [torch.randn(n, 4) for n in (3, 5, 2)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    padded = ops.align_jagged_to_multiple(nt, multiple=8, padding_value=-1.0)
    assert padded.values().shape == (16, 4) and torch.equal(padded.offsets(), nt.offsets())
    assert torch.equal(padded.values()[10:], torch.full((6, 4), -1.0))
    back = ops.strip_jagged_padding(padded, valid_tokens=10)
    assert torch.equal(back.values(), nt.values())
    assert torch.equal(ops.strip_jagged_padding(padded).values(), nt.values())
    assert ops.align_jagged_to_multiple(back, multiple=5) is back  # 10 rows: nothing to pad
    assert torch.tpu.ops.align_jagged_to_multiple is ops.align_jagged_to_multiple
