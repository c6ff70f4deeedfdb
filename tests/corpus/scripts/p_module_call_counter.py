"""Planted: a module counts its own forward calls in a Python int attribute inside a compiled forward.
Dynamo guards on the attribute's value, recompiles at every call and hits its recompile limit.
The line to change is the one that mutates the attribute (dynamo's failed guard names it).
"""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # EXPECT: recompile
        return self.norm(torch.relu(self.proj(x)))


torch.manual_seed(0)
enc = Encoder().to("tpu")
fast = torch.compile(enc, backend="tpu_debug")
opt = torch.optim.SGD(enc.parameters(), lr=0.05)
x = torch.randn(8, 16).to("tpu")
for step in range(14):
    opt.zero_grad()
    fast(x).pow(2).mean().backward()
    opt.step()
print("calls", enc.calls)
