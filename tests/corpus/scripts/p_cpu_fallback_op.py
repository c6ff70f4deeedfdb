"""Planted: a custom op registered with a CPU kernel only, called inside the training step: with CPU
fallback on, every call copies its input to the host and back. Fix: write it with torch ops.
"""
import torch
from torch import nn

from tpu_debug.runtime import config as runtime_config

lib = torch.library.Library("corpus", "DEF")
lib.define("squash(Tensor x) -> Tensor")
lib.impl("squash", lambda x: x / (1 + x.abs()), "CPU")
runtime_config.cpu_fallback = True

torch.manual_seed(0)
model = nn.Linear(16, 16).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(5, 8, 16)
for i in range(5):
    x = data[i].to("tpu")
    with torch.no_grad():
        x = torch.ops.corpus.squash(x)  # EXPECT: cpu_fallback
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
