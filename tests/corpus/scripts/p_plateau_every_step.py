"""Planted: ReduceLROnPlateau stepped with the training loss at every batch. The scheduler reads the
metric back to the host (float(metrics)) inside its step, so every batch waits for the device; it is
meant to be called once per epoch on a validation metric.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)
x = torch.randn(64, 32).to("tpu")
y = torch.randn(64, 1).to("tpu")
for step in range(10):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    plateau.step(loss)  # EXPECT: implicit_sync
print("done")
