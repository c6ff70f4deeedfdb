"""Planted: a compiled optimizer step whose learning rate is a Python float that a LambdaLR changes
every step: dynamo guards on the value and recompiles each step. Fix: lr=torch.tensor(lr) and a
capturable optimizer.
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 16).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)


@torch.compile(backend="tpu_debug")
def opt_step():
    opt.step()  # EXPECT: recompile


x = torch.randn(8, 16).to("tpu")
for _ in range(7):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt_step()  # EXPECT: recompile
    sched.step()
print("done")
