"""Skip the optimizer step when the loss is not finite, tested with a Python `if` on a device
tensor at every step, a sync each step. Fix: drop the check or use torch.where / check every N steps."""

import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 16).to("tpu"), torch.randn(16, 1).to("tpu")
for step in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if torch.isfinite(loss):  # EXPECT: implicit_sync
        opt.step()
