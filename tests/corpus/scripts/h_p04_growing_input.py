"""A compiled toy decoder fed a sequence that grows by one token per step, so every step has a new
shape and recompiles. Fix: pad to a fixed length (or buckets) and mask, or use a static KV cache."""

import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
emb = nn.Embedding(50, 32).to("tpu")
head = nn.Linear(32, 50).to("tpu")


def forward(tokens):
    return head(emb(tokens).mean(dim=1))


fwd = torch.compile(forward, backend="tpu_debug")
tokens = torch.randint(0, 50, (1, 4)).to("tpu")
with torch.no_grad():
    for _ in range(8):
        logits = fwd(tokens)  # EXPECT: dynamic_shape
        nxt = logits.argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
print(tokens.shape)
