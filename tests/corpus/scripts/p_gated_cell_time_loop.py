"""Planted: a hand-written gated recurrent cell stepped in Python over 32 time steps of a small batch:
about 900 tiny eager ops per training step, whose time is almost all dispatch. Fix: compile the step
or run it in lazy mode. The loop body or the backward pass that replays it are both its line.
"""
import torch
from torch import nn


class Cell(nn.Module):
    def __init__(self, n_in, n_h):
        super().__init__()
        self.x2h = nn.Linear(n_in, 2 * n_h)
        self.h2h = nn.Linear(n_h, 2 * n_h)

    def forward(self, x, h):
        z, c = (self.x2h(x) + self.h2h(h)).chunk(2, dim=-1)
        z = torch.sigmoid(z)
        return (1 - z) * h + z * torch.tanh(c)


torch.manual_seed(0)
cell = Cell(8, 32).to("tpu")
head = nn.Linear(32, 1).to("tpu")
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-3)
data = torch.randn(8, 32, 4, 8)
for i in range(8):
    xs = data[i].to("tpu")
    h = torch.zeros(4, 32, device="tpu")
    for t in range(xs.shape[0]):
        h = cell(xs[t], h)  # EXPECT: eager_tiny_ops
    loss = head(h).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # EXPECT: eager_tiny_ops
    opt.step()
print("loss", loss.item())
