"""Planted: an early-stopping test `if loss < threshold` on a device tensor at every step: Python
needs the value, so every step waits for the device. Fix: check every N steps.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xs, ys = torch.randn(8, 64, 8), torch.randn(8, 64, 1)
for step in range(8):
    x, y = xs[step].to("tpu"), ys[step].to("tpu")
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if loss < 1e-4:  # EXPECT: implicit_sync
        break
print("stopped at", step)
