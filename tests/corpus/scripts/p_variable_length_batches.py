"""Planted: batches of token sequences with a different length every step and no padding: every op
meets a new shape and compiles again. Fix: pad the sequences to a few bucket lengths.
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
emb = nn.Embedding(50, 16).to("tpu")
head = nn.Linear(16, 50).to("tpu")
opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1)
lengths = [11, 17, 9, 23, 14, 29, 19, 26]
for length in lengths:
    tokens = torch.randint(0, 50, (4, length + 1)).to("tpu")
    h = emb(tokens[:, :-1])  # EXPECT: dynamic_shape
    logits = head(h)
    loss = F.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
