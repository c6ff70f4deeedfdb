"""Data-parallel training of a small MLP as one process or as ranks of `tpu-debug run --nproc`.

Every rank builds the same model and global batches (one seed); the batch is
split over the "dp" dimension of a mesh over every device of every rank. The
losses and final weights go to the JSON file named by argv[1] (rank 0 writes),
for the test to compare with PyTorch on CPU.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.runtime import distributed as dist

import tpu_debug

STEPS = 3
devices = torch.tpu.device_count() * dist.get_world_size()
mesh = dist.init_device_mesh("tpu", (devices,), mesh_dim_names=("dp",))

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
batches = [(torch.randn(2 * devices, 8), torch.randint(0, 4, (2 * devices,))) for _ in range(STEPS)]
initial = {k: v.clone() for k, v in model.state_dict().items()}
model.to("tpu")
dist.distribute_module(model, mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.5)


def train_step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


step = tpu_debug.compile(train_step)
opt_step = tpu_debug.compile(opt.step)
losses = []
for x, y in batches:
    loss = step(dist.mark_sharding(x.to("tpu"), mesh, ("dp", None)), dist.mark_sharding(y.to("tpu"), mesh, ("dp",)))
    opt_step()
    opt.zero_grad()
    losses.append(loss.item())
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({
            "losses": losses,
            "weights": {k: v.cpu().tolist() for k, v in model.state_dict().items()},
            "initial": {k: v.tolist() for k, v in initial.items()},
            "batches": [(x.tolist(), y.tolist()) for x, y in batches],
        }, f)
