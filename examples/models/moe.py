"""A Qwen-style mixture-of-experts decoder layer stack (softmax router, top-k experts with
renormalized weights, SwiGLU experts) on the `tpu` device, with two ways to run the
experts: a loop over experts gathering each one's tokens, and one grouped matmul
(`torch._grouped_mm`) over the tokens sorted by expert. One training step of each,
eagerly or compiled, checked against CPU.

    python examples/models/moe.py [--mode eager|compiled] [--experts loop|grouped]
    tpu-debug run examples/models/moe.py --experts loop
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.models import _harness  # noqa: E402
from examples.models.tiny_llama import RMSNorm  # noqa: E402


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    vocab: int = 128
    hidden: int = 32
    expert_hidden: int = 16
    experts: int = 8
    top_k: int = 2
    layers: int = 2
    eps: float = 1e-6


class SparseMoE(nn.Module):
    """Experts' weights stacked (experts, in, out), as grouped-matmul kernels take them; the
    loop path multiplies by one expert's slice."""

    def __init__(self, cfg: MoEConfig, experts: str):
        super().__init__()
        self.cfg, self.experts = cfg, experts
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        scale = cfg.hidden**-0.5
        self.gate_up = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, 2 * cfg.expert_hidden) * scale)
        self.down = nn.Parameter(torch.randn(cfg.experts, cfg.expert_hidden, cfg.hidden) * cfg.expert_hidden**-0.5)

    def route(self, x):
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.cfg.top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), chosen

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = self.route(x)
        out = self.loop(x, weights, chosen) if self.experts == "loop" else self.grouped(x, weights, chosen)
        return out.reshape(shape)

    def expert_mlp(self, h, gate_up, down):
        gate, up = h.matmul(gate_up).chunk(2, dim=-1)
        return (F.silu(gate) * up).matmul(down)

    def loop(self, x, weights, chosen):
        """Each expert's tokens gathered (a data-dependent count), run, scattered back."""
        out = torch.zeros_like(x)
        for e in range(self.cfg.experts):
            token, slot = torch.where(chosen == e)
            y = self.expert_mlp(x[token], self.gate_up[e], self.down[e])
            out = out.index_add(0, token, y * weights[token, slot, None])
        return out

    def grouped(self, x, weights, chosen):
        """Token copies sorted by expert, the experts' matmuls as one grouped matmul each,
        offsets the cumulative token count per expert (no data-dependent shapes)."""
        k = self.cfg.top_k
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        counts = (flat[:, None] == torch.arange(self.cfg.experts, device=x.device)).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        h = x[order // k]
        gate, up = torch._grouped_mm(h, self.gate_up, offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.down, offs=offs)
        y = torch.zeros_like(y).index_copy(0, order, y)
        return (y.view(-1, k, x.shape[-1]) * weights[..., None]).sum(1)


class MoEBlock(nn.Module):
    def __init__(self, cfg: MoEConfig, experts: str):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = nn.MultiheadAttention(cfg.hidden, 4, bias=False, batch_first=True)
        self.moe_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.moe = SparseMoE(cfg, experts)

    def forward(self, x, mask):
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.moe_norm(x))


class TinyMoE(nn.Module):
    def __init__(self, cfg: MoEConfig = MoEConfig(), experts: str = "grouped"):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(MoEBlock(cfg, experts) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens):
        s = tokens.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool, device=tokens.device).triu(1)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.norm(x))


CONFIG = MoEConfig()


def make_batch():
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, CONFIG.vocab, (2, 13), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, batch):
    x, y = batch
    logits = model(x)
    return logits, F.cross_entropy(logits.reshape(-1, CONFIG.vocab), y.reshape(-1))


def run(mode: str, experts: str = "grouped") -> _harness.Comparison:
    return _harness.compare(lambda: TinyMoE(CONFIG, experts), make_batch, loss_of, mode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--experts", choices=("loop", "grouped", "both"), default="both")
    known, rest = parser.parse_known_args(argv)
    paths = ("loop", "grouped") if known.experts == "both" else (known.experts,)
    status = 0
    for path in paths:
        print(f"experts: {path}")
        status |= _harness.main_for(__doc__.splitlines()[0], lambda mode, p=path: run(mode, p), rest)
    return status


if __name__ == "__main__":
    sys.exit(main())
