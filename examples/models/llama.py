"""Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) on the `tpu` device:
one training step and a KV-cache greedy decode, eagerly or compiled, checked against CPU.

    python examples/models/llama.py [--mode eager|compiled]
    tpu-debug run examples/models/llama.py --mode compiled
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tpu_debug

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.models import _harness  # noqa: E402
from examples.models.tiny_llama import LlamaConfig, TinyLlama, rotary  # noqa: E402

CONFIG = LlamaConfig(vocab=128, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, max_seq=32)
PROMPT, NEW_TOKENS = 6, 4


def make_model():
    return TinyLlama(CONFIG)


def make_batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CONFIG.vocab, (2, 17), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, batch):
    x, y = batch
    logits = model(x)
    return logits, F.cross_entropy(logits.reshape(-1, CONFIG.vocab), y.reshape(-1))


def cached_step(model, tokens, pos, cache_k, cache_v):
    """Logits of ``tokens`` (at positions ``pos`` .. ``pos + s - 1``, ``pos`` a 0-d tensor),
    attending to the cache, whose rows ``pos`` .. are written in place. The cache is static
    (max_seq rows, masked beyond the current position), so one compiled program serves
    every decode step."""
    cfg = model.cfg
    b, s = tokens.shape
    positions = pos + torch.arange(s, device=tokens.device)
    cos, sin = model.cos[positions], model.sin[positions]
    visible = torch.arange(cfg.max_seq, device=tokens.device)[None, :] <= positions[:, None]
    x = model.embed(tokens)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        h = block.attn_norm(x)
        q = attn.q(h).view(b, s, attn.heads, attn.head_dim).transpose(1, 2)
        k = attn.k(h).view(b, s, attn.kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v(h).view(b, s, attn.kv_heads, attn.head_dim).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        cache_k[layer].index_copy_(2, positions, k)
        cache_v[layer].index_copy_(2, positions, v)
        rep = attn.heads // attn.kv_heads
        keys = cache_k[layer].repeat_interleave(rep, dim=1)
        values = cache_v[layer].repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible)
        x = x + attn.o(out.transpose(1, 2).reshape(b, s, -1))
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.norm(x))


def greedy_decode(model, prompt, new_tokens, step=cached_step):
    """Prefill the prompt, then ``new_tokens`` one-token steps; returns (tokens, logits per step)."""
    cfg = model.cfg
    b = prompt.shape[0]
    head_dim = cfg.hidden // cfg.heads
    shape = (cfg.layers, b, cfg.kv_heads, cfg.max_seq, head_dim)
    cache_k = torch.zeros(shape, device=prompt.device)
    cache_v = torch.zeros(shape, device=prompt.device)
    logits = step(model, prompt, torch.tensor(0, device=prompt.device), cache_k, cache_v)[:, -1]
    tokens, all_logits = [logits.argmax(-1)], [logits]
    for i in range(new_tokens - 1):
        pos = torch.tensor(prompt.shape[1] + i, device=prompt.device)
        logits = step(model, tokens[-1][:, None], pos, cache_k, cache_v)[:, -1]
        tokens.append(logits.argmax(-1))
        all_logits.append(logits)
    return torch.stack(tokens, 1), torch.stack(all_logits, 1)


def run(mode: str) -> _harness.Comparison:
    result = _harness.compare(make_model, make_batch, loss_of, mode)
    torch.manual_seed(0)
    cpu = make_model()
    dev = copy.deepcopy(cpu).to("tpu")
    prompt = make_batch()[0][:, :PROMPT]
    step = tpu_debug.compile(cached_step) if mode == "compiled" else cached_step
    with torch.no_grad():
        tokens_c, logits_c = greedy_decode(cpu, prompt, NEW_TOKENS)
        tokens_d, logits_d = greedy_decode(dev, prompt.to("tpu"), NEW_TOKENS, step)
        # the cache is right: the last decode step's logits are the full forward's
        full = cpu(torch.cat([prompt, tokens_c[:, :-1]], 1))[:, -1]
    result.worst["decode logits"] = _harness._ratio(logits_d, logits_c, rtol=_harness.RTOL, scale_atol=_harness.SCALE_ATOL)
    result.worst["decode tokens"] = _harness._ratio(tokens_d, tokens_c, rtol=0, scale_atol=0)
    result.worst["cache vs full forward (cpu)"] = _harness._ratio(
        logits_c[:, -1], full, rtol=_harness.RTOL, scale_atol=_harness.SCALE_ATOL
    )
    return result


def main(argv: list[str] | None = None) -> int:
    return _harness.main_for(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
