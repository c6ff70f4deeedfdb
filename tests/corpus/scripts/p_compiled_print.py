"""Planted: a debugging print left inside a compiled forward: dynamo breaks the graph there and the
print syncs at every call. Fix: remove it (or log outside the compiled function).
"""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x):
        h = torch.relu(self.a(x))
        print("activation mean", h.mean())  # EXPECT: graph_break
        return self.b(h)


torch.manual_seed(0)
model = Block().to("tpu")
cmodel = torch.compile(model, backend="tpu_debug")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(5, 8, 32)
for i in range(5):
    x = data[i].to("tpu")
    opt.zero_grad()
    cmodel(x).sum().backward()
    opt.step()
