"""Planted: the running loss is accumulated as a Python float with .item() at every step, a sync
that stops the host each step. Fix: accumulate on the device and read once.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
xs, ys = torch.randn(8, 32, 16), torch.randn(8, 32, 1)
running = 0.0
for i in range(8):
    x, y = xs[i].to("tpu"), ys[i].to("tpu")
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    running += loss.item()  # EXPECT: implicit_sync
print("mean loss", running / 8)
