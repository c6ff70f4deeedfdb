"""A training loop that logs the loss every 10 steps: a deliberate, occasional sync.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(40, 32, 16)
for step in range(40):
    x = data[step].to("tpu")
    opt.zero_grad()
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
