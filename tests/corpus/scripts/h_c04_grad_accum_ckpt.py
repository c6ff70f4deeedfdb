"""Train an embedding bag classifier with SGD and gradient accumulation over 2 micro-batches,
then save a checkpoint of model and optimizer state_dict. A correct program."""

# corpus: correct
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tpu_debug  # noqa: F401

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randint(0, 100, (48, 12)), torch.randint(0, 3, (48,))), batch_size=8)
model = nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(12 * 16, 3)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
accum = 2
for i, (x, y) in enumerate(loader):
    x, y = x.to("tpu"), y.to("tpu")
    loss = nn.functional.cross_entropy(model(x), y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
with tempfile.TemporaryDirectory() as d:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(d, "ckpt.pt"))
print("saved")
