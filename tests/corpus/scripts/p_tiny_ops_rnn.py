"""Planted: a recurrent cell unrolled in Python over 128 time steps of small tensors: hundreds of tiny
ops per training step, each paying a dispatch. Fix: compile the step (torch.compile) or batch the
time steps. The finding is about the whole step: the loop body or the backward pass that
replays it are both its line.
"""
import torch
from torch import nn

torch.manual_seed(0)
cell = nn.RNNCell(8, 16).to("tpu")
head = nn.Linear(16, 1).to("tpu")
opt = torch.optim.SGD(list(cell.parameters()) + list(head.parameters()), lr=0.01)
seqs = torch.randn(3, 128, 4, 8)
for i in range(3):
    xs = seqs[i].to("tpu")
    h = torch.zeros(4, 16, device="tpu")
    for t in range(128):
        h = cell(xs[t], h)  # EXPECT: eager_tiny_ops
    loss = head(h).square().mean()
    opt.zero_grad()
    loss.backward()  # EXPECT: eager_tiny_ops
    opt.step()
print("done")
