"""Planted: a hand-written greedy decoding loop that appends one token per step with torch.cat, so
the model's input grows by one every step and every op recompiles. Fix: a fixed-size buffer (or a
static KV cache) and an index.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64)).to("tpu").eval()
tokens = torch.randint(0, 64, (1, 4)).to("tpu")
with torch.no_grad():
    for _ in range(10):
        logits = model(tokens)  # EXPECT: dynamic_shape
        next_token = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
print(tokens.cpu().tolist())
