"""Evaluate a small classifier under torch.no_grad over a DataLoader, accumulating the number of
correct predictions on the device and reading it once at the end. A correct program."""

# corpus: correct
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tpu_debug  # noqa: F401

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,))), batch_size=16)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("tpu").eval()
correct = torch.zeros((), dtype=torch.long, device="tpu")
with torch.no_grad():
    for x, y in loader:
        x, y = x.to("tpu"), y.to("tpu")
        correct += (model(x).argmax(dim=1) == y).sum()
print("accuracy", correct.item() / 64)
