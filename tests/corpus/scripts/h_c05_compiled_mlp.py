"""Train a small MLP compiled with torch.compile(backend="tpu_debug") with Adam, the loss kept on
the device and read once after the loop. A correct program."""

# corpus: correct
import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
cmodel = torch.compile(model, backend="tpu_debug")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 16).to("tpu"), torch.randint(0, 4, (32,)).to("tpu")
losses = []
for step in range(6):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(cmodel(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
print(torch.stack(losses).cpu())
