"""nn.TransformerEncoder and nn.MultiheadAttention on tpu in eval mode under no_grad, where they take
PyTorch's fused fast paths (aten::_transformer_encoder_layer_fwd, aten::_native_multi_head_attention),
in eager, lazy and compiled mode, against the same modules on CPU.

Tolerance: the math path and PyTorch's fused CPU kernel compute the same float32 products in
another order (a packed in-projection, the 1/sqrt(head) scale applied to the queries): a few
float32 roundings per output over values of order 1 after each layer norm, 2e-5 absolute.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from tpu_debug.core.errors import NoLoweringError

ATOL, RTOL = 2e-5, 1e-5
MODES = ("eager", "lazy", "compiled")


@pytest.fixture(autouse=True)
def _forget_graphs():
    yield
    torch._dynamo.reset()


def _mode(mode: str):
    if mode == "lazy":
        return torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    return contextlib.nullcontext()


def _on_tpu(module: nn.Module, mode: str) -> nn.Module:
    import copy

    moved = copy.deepcopy(module).to("tpu")
    return torch.compile(moved, backend="tpu_debug") if mode == "compiled" else moved


def _close(out, ref):
    torch.testing.assert_close(out.cpu(), ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_fast_path_equals_cpu(mode, norm_first, activation):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 7, 32)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True  # the first sequence is two tokens shorter
    causal = nn.Transformer.generate_square_subsequent_mask(7)
    tpu = _on_tpu(enc, mode)
    with torch.no_grad(), _mode(mode):
        _close(tpu(x.to("tpu")), enc(x))
        _close(tpu(x.to("tpu"), src_key_padding_mask=pad.to("tpu")), enc(x, src_key_padding_mask=pad))
        _close(tpu(x.to("tpu"), mask=causal.to("tpu"), is_causal=True), enc(x, mask=causal, is_causal=True))


def test_the_modules_really_take_the_fused_fast_paths(monkeypatch):
    # the comparisons are only about the fast paths if PyTorch calls the fused ops on tpu
    from tpu_debug.runtime.ops import transformer

    calls = []
    attention = transformer._attention
    monkeypatch.setattr(transformer, "_attention", lambda *a: calls.append(a[0].shape) or attention(*a))
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 1,
                                enable_nested_tensor=False).eval().to("tpu")
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval().to("tpu")
    x = torch.randn(2, 5, 32, device="tpu")
    with torch.no_grad():
        enc(x)
        mha(x, x, x)
    assert calls == [torch.Size([2, 5, 32])] * 2


@pytest.mark.parametrize("mode", MODES)
def test_multihead_attention_fast_path_equals_cpu(mode):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    q, kv = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    empty = torch.zeros(2, 9, dtype=torch.bool)
    empty[0] = True  # a sequence with every key padded: NaN on CPU
    tpu = _on_tpu(mha, mode)
    t = lambda v: v.to("tpu")
    with torch.no_grad(), _mode(mode):
        out, w = tpu(t(q), t(q), t(q))  # self-attention: the packed in-projection
        ref, ref_w = mha(q, q, q)
        _close(out, ref)
        _close(w, ref_w)
        out, w = tpu(t(q), t(kv), t(kv), key_padding_mask=t(pad), average_attn_weights=False)
        ref, ref_w = mha(q, kv, kv, key_padding_mask=pad, average_attn_weights=False)
        _close(out, ref)
        _close(w, ref_w)
        out, _ = tpu(t(q), t(kv), t(kv), need_weights=False)
        _close(out, mha(q, kv, kv, need_weights=False)[0])
        out, _ = tpu(t(q), t(kv), t(kv), key_padding_mask=t(empty), need_weights=False)
        ref = mha(q, kv, kv, key_padding_mask=empty, need_weights=False)[0]
        torch.testing.assert_close(out.cpu(), ref, atol=ATOL, rtol=RTOL, equal_nan=True)


def test_the_encoder_asks_whether_a_padding_mask_is_left_aligned():
    """nn.TransformerEncoder calls aten::_nested_tensor_from_mask_left_aligned among the
    conditions of its nested fast path: a question about the mask, answered as on CPU."""
    t = torch.randn(2, 3, 4)
    for keep in ([[1, 1, 0], [1, 0, 0]], [[1, 0, 1], [1, 1, 1]], [[0, 0, 0], [1, 1, 1]]):
        mask = torch.tensor(keep, dtype=torch.bool)
        want = torch._nested_tensor_from_mask_left_aligned(t, mask)
        assert torch._nested_tensor_from_mask_left_aligned(t.to("tpu"), mask.to("tpu")) is want
    for mask, message in ((torch.ones(2, 3), "Expected mask to be of ScalarType Bool, but got Float"),
                          (torch.ones(3, 3, dtype=torch.bool), "Mask size should match input size")):
        with pytest.raises(RuntimeError, match=message):
            torch._nested_tensor_from_mask_left_aligned(t.to("tpu"), mask.to("tpu"))


@pytest.mark.parametrize("mode", MODES)
def test_transformer_in_eval_mode_with_gradients_and_a_padding_mask_equals_cpu(mode):
    """Gradients needed: the encoder declines its nested path (after asking about the mask)."""
    torch.manual_seed(0)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    ref = model(src, tgt, src_key_padding_mask=pad)
    ref.sum().backward()
    tpu = _on_tpu(model, mode)
    with _mode(mode):
        out = tpu(src.to("tpu"), tgt.to("tpu"), src_key_padding_mask=pad.to("tpu"))
        out.sum().backward()
    _close(out.detach(), ref.detach())
    moved = tpu._orig_mod if mode == "compiled" else tpu
    for (name, p), q in zip(model.named_parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=ATOL, rtol=RTOL, msg=name)


def test_the_nested_tensor_padding_path_is_refused_with_the_fix():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).eval().to("tpu")
    pad = torch.zeros(2, 5, dtype=torch.bool, device="tpu")
    pad[0, 3:] = True
    with torch.no_grad(), pytest.raises(NoLoweringError, match=r"enable_nested_tensor=False"):
        enc(torch.randn(2, 5, 32, device="tpu"), src_key_padding_mask=pad)


@pytest.mark.parametrize("mask_type", [None, 0, 1])
def test_masked_softmax_equals_cpu(mask_type):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5)
    shape = {None: (2, 3, 5, 5), 0: (5, 5), 1: (2, 5)}[mask_type]
    mask = torch.rand(shape) < 0.4
    mask.view(-1, shape[-1])[0] = True  # a row masked entirely: NaN, as PyTorch's CPU kernel makes it
    ref = torch._masked_softmax(x, mask, -1, mask_type)
    out = torch._masked_softmax(x.to("tpu"), mask.to("tpu"), -1, mask_type).cpu()
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True)
