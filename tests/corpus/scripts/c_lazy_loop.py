"""A training loop in lazy fused mode (TorchTPU's default eager mode), reading the loss after the loop.
# corpus: correct
# corpus-options: --eager-mode defer_and_fuse
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data, labels = torch.randn(6, 16, 32), torch.randint(0, 8, (6, 16))
losses = []
for i in range(6):
    x, y = data[i].to("tpu"), labels[i].to("tpu")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
print("losses", torch.stack(losses).cpu())
