"""Mixture-of-experts and Gemma 2 configs in ``fit``: the capacity dispatch, tiny Mixtral and Gemma 2 steps.

References: transformers' own eager experts (``MixtralExperts`` looping over the experts
that were hit) on PyTorch CPU with random weights, when no choice is dropped; for the
dropped choices, the rule written out by hand (each expert takes the first ``capacity``
choices of a sequence); for the sharded step, the parameter bytes counted by hand from
the config's sizes.
"""

from __future__ import annotations

import math

import pytest
import torch

from tpu_debug.runtime.target import fit_moe
from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
             max_position_embeddings=128, use_cache=False)


def _experts(seq):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    torch.manual_seed(0)
    config = MixtralConfig(**SIZES)
    experts = MixtralExperts(config).float()
    torch.nn.init.normal_(experts.gate_up_proj, std=0.1)
    torch.nn.init.normal_(experts.down_proj, std=0.1)
    fit_moe.prepare(config, seq)
    return config, experts


def _eager(config, experts, *args):
    saved = config._experts_implementation
    config._experts_implementation = "eager"
    try:
        return experts(*args)
    finally:
        config._experts_implementation = saved


def test_capacity_dispatch_equals_transformers_experts_when_nothing_is_dropped(monkeypatch):
    batch, seq, top_k, experts_n = 3, 16, 2, 4
    # capacity = seq x top_k x factor / experts = seq: every choice has a place
    monkeypatch.setattr(fit_moe, "CAPACITY_FACTOR", experts_n / top_k)
    config, experts = _experts(seq)
    hidden = torch.randn(batch * seq, 64)
    index = torch.stack([torch.randperm(experts_n)[:top_k] for _ in range(batch * seq)])
    weights = torch.rand(batch * seq, top_k)
    ours = experts(hidden, index, weights)
    # float32 on CPU, the same products summed in another order
    torch.testing.assert_close(ours, _eager(config, experts, hidden, index, weights), rtol=1e-5, atol=1e-6)


def test_capacity_dispatch_drops_the_choices_past_an_experts_capacity():
    seq = 4  # capacity = ceil(4 x 2 x 1.0 / 4) = 2 choices per expert and sequence
    config, experts = _experts(seq)
    hidden = torch.randn(2 * seq, 64)
    index = torch.tensor([[0, 1]] * seq + [[2, 3], [0, 1], [2, 3], [2, 3]])
    weights = torch.rand(2 * seq, 2)
    ours = experts(hidden, index, weights)
    expected = _eager(config, experts, hidden, index, weights)
    # sequence 0: tokens 0 and 1 take experts 0 and 1's two places, tokens 2 and 3 get nothing;
    # sequence 1: expert 2 and 3 take tokens 4 and 6 (token 7 is the third), experts 0, 1 token 5
    kept = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32)[:, None]
    torch.testing.assert_close(ours, expected * kept, rtol=1e-5, atol=1e-6)


def _parameters_by_hand():
    hidden, inter, vocab, layers = 64, 128, 256, 2
    head = hidden // 4
    attention = hidden * hidden * 2 + hidden * 2 * head * 2  # q, o; k, v with 2 kv heads
    experts = 4 * (2 * inter * hidden + hidden * inter)  # gate_up and down of each expert
    router, norms = 4 * hidden, 2 * hidden
    total = 2 * vocab * hidden + layers * (attention + experts + router + norms) + hidden
    idle = layers * experts // 2  # top 2 of 4 experts run
    return total, total - vocab * hidden - idle  # the input embedding is no matmul; the head is


@pytest.mark.skipif(not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"')
def test_tiny_mixtral_step_fits_with_its_parameters_split_over_the_chips(tmp_path, monkeypatch):
    import tpu_debug

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    batch, seq, chips = 8, 32, 8
    report = tpu_debug.fit({"model_type": "mixtral", **SIZES}, "v5e-8", plan="fsdp", batch=batch, seq=seq)
    total, active = _parameters_by_hand()
    assert report.parameters == total
    assert report.fits is True
    # every parameter has a dimension 8 divides: each chip holds an eighth, in bfloat16
    assert report.memory.parameters == total * 2 // chips
    # AdamW's two moments, and its step count (a float32 scalar on every chip)
    assert report.memory.optimizer_state == 2 * total * 2 // chips + 4
    # the compiler's arguments hold the parameters, AdamW's two moments and the tokens (int64)
    assert report.memory.arguments >= 3 * total * 2 // chips + batch * seq * 8 // chips
    # model FLOPs count the two experts a token runs through, not the four
    expected = 6 * active + 12 * 2 * seq * 64
    assert math.isclose(report.estimate.model_flops, expected * batch * seq, rel_tol=1e-9)


def test_prims_div_lowering_divides_as_torch_does():
    import numpy as np

    from tpu_debug.runtime.ops.prims import div

    a = torch.tensor([7, -7, 9, -9], dtype=torch.int32)
    b = torch.tensor([2, 2, -4, -4], dtype=torch.int32)
    x, y = torch.tensor([1.0, -3.0, 2.5]), torch.tensor([4.0, 2.0, -0.5])
    # integers round toward zero (C division); floats divide exactly
    np.testing.assert_array_equal(np.asarray(div(a.numpy(), b.numpy())), torch.ops.prims.div(a, b).numpy())
    np.testing.assert_array_equal(np.asarray(div(x.numpy(), y.numpy())), torch.ops.prims.div(x, y).numpy())


@pytest.mark.skipif(not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"')
def test_tiny_gemma2_step_fits_with_its_parameters_split_over_the_chips(tmp_path, monkeypatch):
    import tpu_debug

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    hidden, inter, vocab, heads, kv, head_dim = 64, 128, 256, 4, 2, 32
    sizes = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, sliding_window=16,
                 max_position_embeddings=128)
    report = tpu_debug.fit({"model_type": "gemma2", **sizes}, "v5e-8", plan="fsdp", batch=8, seq=32)
    # tied embedding and head; q, k, v, o; gate, up, down; four norms a layer and the final one
    layer = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter + 4 * hidden
    total = vocab * hidden + 2 * layer + hidden
    assert report.parameters == total
    assert report.fits is True
    assert report.memory.parameters == total * 2 // 8
