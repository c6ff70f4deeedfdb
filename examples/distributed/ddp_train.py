"""Data-parallel training on the `tpu` device with PyTorch's own DistributedDataParallel.

A plain torch script, as written for TorchTPU: ``import torch`` gives the `tpu` device,
``init_process_group()`` with no backend picks ``tpu_dist`` for it, and each rank trains
a replica on its own slice of the batch while DDP averages the gradients.

    torchrun --nproc-per-node 2 examples/distributed/ddp_train.py
    tpu-debug run --nproc 2 examples/distributed/ddp_train.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args()

    dist.init_process_group()  # tpu_dist on tpu (gloo on the host underneath); env:// from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(args.device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    data = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(8 * world, 16, generator=data)
        y = torch.randint(0, 4, (8 * world,), generator=data)
        mine = slice(8 * rank, 8 * (rank + 1))  # this rank's slice of the global batch
        loss = F.cross_entropy(ddp(x[mine].to(args.device)), y[mine].to(args.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}: mean loss {total.item() / world:.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
