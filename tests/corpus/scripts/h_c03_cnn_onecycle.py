"""Train a small CNN on random images with AdamW, OneCycleLR, clipping the
gradient norm, logging every 5 steps. A correct program."""

# corpus: correct
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tpu_debug  # noqa: F401

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(40, 3, 16, 16), torch.randint(0, 10, (40,))), batch_size=8)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)
).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=len(loader))
for step, (x, y) in enumerate(loader):
    x, y = x.to("tpu"), y.to("tpu")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if step % 5 == 4:
        print(f"step {step} loss {loss.item():.4f}")
