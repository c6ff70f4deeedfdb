"""Train an MLP in TorchTPU's fused lazy eager mode (DEFER_AND_FUSE) with SGD, fetching the losses
once at the end. A correct program."""

# corpus: correct
import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 16).to("tpu"), torch.randn(32, 1).to("tpu")
losses = []
with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
    for step in range(6):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    print(torch.stack(losses).cpu())
