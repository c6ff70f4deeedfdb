"""Pitfall: a branch on the rank inside a compiled step gives one rank a graph of its own.

Run it as two processes of one data-parallel run (each with two simulated CPU devices):

    tpu-debug run --nproc 2 --devices 2 examples/pitfalls/rank_divergence.py

Rank 1 adds a weight penalty the other rank does not, inside the function it
compiles, so dynamo traces a different graph there and XLA compiles a different
program. Both programs hold an all-reduce of the gradients, but they are not the
same program: on real hardware the ranks would pair up mismatched collectives or
wait for each other forever. tpu_debug's runtime compares the program every rank
is about to run before it runs it: both ranks stop at the first step with a
RankDivergenceError that names the op only rank 1 has and its line, and the
report of the run puts the ranks side by side. The fix is to make the branch the
same on every rank (or to move it out of the compiled function, onto values
every rank shares).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.runtime import distributed as dist

import tpu_debug

RANK = dist.get_rank()
devices = torch.tpu.device_count() * dist.get_world_size()
mesh = dist.init_device_mesh("tpu", (devices,), mesh_dim_names=("dp",))

torch.manual_seed(0)  # every rank builds the same model and the same global batches
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
dist.distribute_module(model, mesh)  # data parallel: weights replicated, batches sharded on "dp"
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(x, y):
    loss = F.cross_entropy(model(x), y)
    if RANK == 1:  # the bug: only rank 1 regularizes
        loss = loss + 1e-3 * model[0].weight.pow(2).sum()
    loss.backward()
    return loss.detach()


step = tpu_debug.compile(train_step)
for i in range(3):
    x = dist.mark_sharding(torch.randn(4 * devices, 32).to("tpu"), mesh, ("dp", None))
    y = dist.mark_sharding(torch.randint(0, 10, (4 * devices,)).to("tpu"), mesh, ("dp",))
    loss = step(x, y)
    opt.step()
    opt.zero_grad()
    print(f"step {i}: loss {loss.item():.4f}")
