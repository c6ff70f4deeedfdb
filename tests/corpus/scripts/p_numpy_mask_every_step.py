"""Planted: the same 256 KiB NumPy mask is moved to the device at every step.
Fix: create it on the device once, before the loop.
"""
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
mask_np = (np.random.default_rng(0).random((256, 256)) > 0.5).astype(np.float32)
model = nn.Linear(256, 256).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(6, 32, 256)  # a 32 KiB batch: new data each step
for step in range(6):
    x = data[step].to("tpu")
    mask = torch.from_numpy(mask_np).to("tpu")  # EXPECT: h2d_every_step
    opt.zero_grad()
    loss = (model(x) @ mask).square().mean()
    loss.backward()
    opt.step()
print("done")
