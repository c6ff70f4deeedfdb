"""Rank 1 runs an eager op on a tensor spanning both processes that rank 0 does not.

Under `tpu-debug run --nproc 2`, an eager op on such a tensor is a program every
rank runs together, like a compiled step: the ranks compare it before running
it, and both stop with a RankDivergenceError naming each side's op and line.
"""

from __future__ import annotations

import torch
from tpu_debug.runtime import distributed as dist

RANK = dist.get_rank()
devices = torch.tpu.device_count() * dist.get_world_size()
mesh = dist.init_device_mesh("tpu", (devices,), mesh_dim_names=("dp",))
w = dist.mark_sharding(torch.ones(devices, 4).to("tpu"), mesh, (None, None))  # replicated on every device
w.mul_(2)
if RANK == 1:
    w.add_(1)  # the bug: only rank 1 updates it
w.sub_(1)
print(float(w.sum().cpu()))
