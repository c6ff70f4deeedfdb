"""minGPT (learned position embeddings, pre-norm blocks of causal self-attention with an
explicit mask and a GELU MLP, weight-tied head) on the `tpu` device: trains a few AdamW
steps and checks the losses and the first step's gradients against CPU, eagerly or compiled.

    python examples/models/mingpt.py [--mode eager|compiled] [--steps N]
    tpu-debug run examples/models/mingpt.py
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import tpu_debug

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.models import _harness  # noqa: E402

VOCAB, BLOCK, EMBD, HEADS, LAYERS = 64, 16, 32, 4, 2


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)
        self.attn_drop = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(EMBD)
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(approximate="tanh"), nn.Linear(4 * EMBD, EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.wpe = nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.tie_weights()
        for module in self.modules():  # minGPT's initialization: logits start near uniform
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def tie_weights(self):
        """The head shares the token embedding. ``.to("tpu")`` gives each module its own
        Parameter (a tpu tensor is not shallow-copy compatible with a CPU one, so
        ``Module._apply`` replaces parameters instead of assigning their ``.data``), so the
        tie is made again after moving, as Hugging Face's ``tie_weights()`` does."""
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make_batch():
    g = torch.Generator().manual_seed(10)
    tokens = torch.randint(0, VOCAB, (4, BLOCK + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, batch):
    x, y = batch
    logits = model(x)
    return logits, F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def train(model, device: str, steps: int, mode: str) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    runner = tpu_debug.compile(model) if mode == "compiled" else model
    losses = []
    x, y = (t.to(device) for t in make_batch())  # one batch, memorized: the loss must fall
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(runner, (x, y))[1]
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]


def run(mode: str, steps: int = 4) -> _harness.Comparison:
    result = _harness.compare(GPT, make_batch, loss_of, mode)
    torch.manual_seed(0)
    cpu = GPT()
    dev = copy.deepcopy(cpu).to("tpu")
    dev.tie_weights()
    losses_c, losses_d = train(cpu, "cpu", steps, "eager"), train(dev, "tpu", steps, mode)
    # AdamW's first steps move every parameter by about lr; the losses follow the parameters,
    # so they agree to rounding unless a near-zero gradient flipped a step's sign (see
    # _harness): a loss of order 4 then moves by far less than 1e-3 relative.
    for i, (d, c) in enumerate(zip(losses_d, losses_c)):
        result.worst[f"AdamW step {i} loss"] = abs(d - c) / (1e-3 * abs(c))
    result.worst["training lowers the loss"] = 0.0 if losses_d[-1] < losses_d[0] else float("inf")
    return result


def main(argv: list[str] | None = None) -> int:
    return _harness.main_for(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
