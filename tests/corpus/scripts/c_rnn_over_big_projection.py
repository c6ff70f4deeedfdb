"""An eager step with a loop of small ops around one large projection: hundreds of ops, but the
step's time is the big matmul's (device work), so dispatch is not its cost and compiling saves little.
# corpus: correct
"""
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(1024, 1024).to("tpu")
gate = nn.Linear(16, 16).to("tpu")
opt = torch.optim.SGD([*proj.parameters(), *gate.parameters()], lr=1e-3)
feats = torch.randn(2048, 1024).to("tpu")
for step in range(5):
    h = torch.zeros(4, 16, device="tpu")
    for t in range(60):
        h = torch.tanh(gate(h) + 0.1)
    big = proj(feats).relu()
    for _ in range(5):
        big = proj(big).relu()
    loss = big.mean() + h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
