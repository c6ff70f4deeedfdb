"""Planted: a compiled nn.Module fed a batch that grows by 7 rows at every step
(torch.compile(model, dynamic=False)): dynamo compiles it again for each size until it hits its
recompile limit, and the module then runs uncompiled, its ops compiled for each size.
One cause, one finding at the call. Fix: one batch size (or pad to a few sizes, or mark_dynamic).
"""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(0)
model = MLP().to("tpu")
f = torch.compile(model, backend="tpu_debug", dynamic=False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    x = torch.randn(8 + 7 * step, 16).to("tpu")
    loss = f(x).pow(2).mean()  # EXPECT: dynamic_shape
    opt.zero_grad()
    loss.backward()
    opt.step()
