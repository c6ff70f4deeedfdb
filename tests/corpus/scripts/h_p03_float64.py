"""Train a linear regression whose data comes from NumPy float64 arrays, so the model and the
step run in float64, which a TPU does not have. Fix: .float() the data (torch.from_numpy keeps float64)."""

import numpy as np
import torch
from torch import nn

import tpu_debug  # noqa: F401

rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((32, 8))).to("tpu")  # EXPECT: float64
y = torch.from_numpy(rng.standard_normal((32, 1))).to("tpu")
model = nn.Linear(8, 1).double().to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()  # EXPECT: float64
    loss.backward()
    opt.step()
print(loss.item())
