"""Planted: the whole training step compiled, loss.backward() inside it: dynamo stops at the
backward, so every step runs the forward program, returns to Python for autograd's backward and
runs the rest as another program. Fix: tpu_debug.compile, or torch._dynamo.config.trace_autograd_ops
= True, with loss.detach() returned: forward and backward compile as one program.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)


@torch.compile(backend="tpu_debug")
def forward_backward(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()  # EXPECT: graph_break
    return loss.detach()


data = torch.randn(6, 16, 32)
labels = torch.randint(0, 8, (6, 16))
for i in range(6):
    opt.zero_grad()
    loss = forward_backward(data[i].to("tpu"), labels[i].to("tpu"))
    opt.step()
print("done")
