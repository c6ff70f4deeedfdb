"""Train a small MLP with SGD and StepLR over a DataLoader of a TensorDataset on the tpu device,
logging the loss every 4 steps. A correct program."""

# corpus: correct
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tpu_debug  # noqa: F401

torch.manual_seed(0)
ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
loader = DataLoader(ds, batch_size=8, drop_last=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
loss_fn = nn.CrossEntropyLoss()
for step, (x, y) in enumerate(loader):
    x, y = x.to("tpu"), y.to("tpu")
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    if step % 4 == 3:
        print(f"step {step} loss {loss.item():.4f}")
