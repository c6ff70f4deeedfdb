"""Planted: a data-dependent Python branch on .item() inside a compiled function: a graph break and
a sync at every call. Fix: torch.where / torch.clamp keeps it in the graph.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 16).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(backend="tpu_debug")
def loss_fn(x):
    out = model(x)
    scale = out.abs().max().item()  # EXPECT: graph_break
    if scale > 10.0:
        out = out / scale
    return out.square().mean()


data = torch.randn(5, 8, 16)
for i in range(5):
    opt.zero_grad()
    loss_fn(data[i].to("tpu")).backward()
    opt.step()
