"""Weighted cross-entropy whose class weights are rebuilt from a Python list with torch.tensor on
the device at every step, the same upload each step. Fix: build the weight tensor once before the loop."""

import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Linear(16, 3).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 16).to("tpu"), torch.randint(0, 3, (16,)).to("tpu")
class_weights = [0.2, 0.3, 0.5]
for step in range(6):
    opt.zero_grad()
    w = torch.tensor(class_weights, device="tpu")  # EXPECT: h2d_every_step
    loss = nn.functional.cross_entropy(model(x), y, weight=w)
    loss.backward()
    opt.step()
print(loss.item())
