"""Planted: class weights rebuilt from a Python list and uploaded at every step.
Fix: build the tensor on the device once, before the loop.
"""
import torch
from torch import nn

torch.manual_seed(0)
class_weights = [0.2, 0.5, 1.0, 2.0] * 64
model = nn.Linear(32, 256).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
xs, ys = torch.randn(6, 64, 32), torch.randint(0, 256, (6, 64))
for step in range(6):
    x, y = xs[step].to("tpu"), ys[step].to("tpu")
    weights = torch.tensor(class_weights).to("tpu")  # EXPECT: h2d_every_step
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y, weight=weights)
    loss.backward()
    opt.step()
print("done")
