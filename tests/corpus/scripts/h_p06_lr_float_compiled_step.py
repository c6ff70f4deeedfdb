"""Compile the optimizer step while a scheduler changes the lr, a Python float, at every step, so
every step recompiles the step. Fix: create the optimizer with lr=torch.tensor(...) so lr is an input."""

import torch
from torch import nn

import tpu_debug  # noqa: F401

torch.manual_seed(0)
model = nn.Linear(16, 4).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


@torch.compile(backend="tpu_debug")
def opt_step():
    opt.step()  # EXPECT: recompile


x = torch.randn(8, 16).to("tpu")
for step in range(12):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt_step()  # EXPECT: recompile
    sched.step()
