"""A compiled forward that prints a tensor statistic for debugging, which syncs and splits the
compiled graph at every call. Fix: remove the print from the forward (log outside, every N steps)."""

import torch
from torch import nn

import tpu_debug  # noqa: F401


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        print("hidden mean", h.mean())  # EXPECT: graph_break
        return self.fc2(h)


torch.manual_seed(0)
model = Net().to("tpu")
cmodel = torch.compile(model, backend="tpu_debug")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu")
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(cmodel(x), y)
    loss.backward()
    opt.step()
