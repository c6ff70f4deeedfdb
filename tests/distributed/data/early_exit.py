"""Rank 1 leaves the training loop one step early: rank 0 waits for it at its next step.

Under `tpu-debug run --nproc 2`, rank 0's second call of the compiled step waits
for rank 1 at the rank check and, when TPU_DEBUG_RANK_TIMEOUT passes, raises a
RankTimeoutError saying where rank 1 was last.
"""

from __future__ import annotations

import torch
from torch import nn
from tpu_debug.runtime import distributed as dist

import tpu_debug

RANK = dist.get_rank()
devices = torch.tpu.device_count() * dist.get_world_size()
mesh = dist.init_device_mesh("tpu", (devices,), mesh_dim_names=("dp",))
torch.manual_seed(0)
model = nn.Linear(8, 4).to("tpu")
dist.distribute_module(model, mesh)


def step(x):
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


step = tpu_debug.compile(step)
for i in range(3):
    if RANK == 1 and i == 1:
        break  # the bug: a rank-dependent loop count
    step(dist.mark_sharding(torch.randn(2 * devices, 8).to("tpu"), mesh, ("dp", None)))
