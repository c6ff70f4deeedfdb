"""Planted: printing a device tensor at every step (a sync and a transfer each step).
Fix: print every N steps, or keep the values on the device.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(20, 5).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
xs, ys = torch.randn(6, 16, 20), torch.randint(0, 5, (6, 16))
for step in range(6):
    x, y = xs[step].to("tpu"), ys[step].to("tpu")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print("step", step, "loss", loss)  # EXPECT: implicit_sync
