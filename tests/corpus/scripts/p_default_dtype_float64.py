"""Planted: the script sets float64 as the default dtype (copied from a numerics notebook), so every
tensor it makes is float64. Fix: leave the default at float32.
"""
import torch
from torch import nn

torch.set_default_dtype(torch.float64)  # EXPECT: float64
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to("tpu")  # EXPECT: float64
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xs = torch.randn(4, 32, 8)
for i in range(4):
    x = xs[i].to("tpu")
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
print("done")
