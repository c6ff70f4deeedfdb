"""Train a tiny MLP where an identical NumPy mask is rebuilt and uploaded with .to() at every
step. Fix: build the mask on the device once, before the loop."""

import numpy as np
import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Linear(32, 32).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 32).to("tpu")
for step in range(6):
    mask = torch.from_numpy(np.triu(np.ones((32, 32), dtype=np.float32))).to("tpu")  # EXPECT: h2d_every_step
    opt.zero_grad()
    loss = (model(x) @ mask).pow(2).mean()
    loss.backward()
    opt.step()
print(loss.item())
