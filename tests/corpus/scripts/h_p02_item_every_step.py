"""Train with AdamW and append loss.item() to a list at every step, a sync in every step.
Fix: keep the losses on the device (loss.detach()) and read them once, or log every N steps."""

import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 16).to("tpu"), torch.randn(32, 1).to("tpu")
losses = []
for step in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())  # EXPECT: implicit_sync
print(losses[-1])
