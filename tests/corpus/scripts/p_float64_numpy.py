"""Planted: features loaded from NumPy stay float64 (NumPy's default), so the model runs in float64,
which a TPU does not have. Fix: .float() the arrays where they are loaded.
"""
import numpy as np
import torch
from torch import nn

rng = np.random.default_rng(0)
features = torch.from_numpy(rng.normal(size=(128, 10)))
targets = torch.from_numpy(rng.normal(size=(128, 1)))
x, y = features.to("tpu"), targets.to("tpu")  # EXPECT: float64
model = nn.Linear(10, 1).to("tpu").double()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("done")
