"""Pitfall: a collective only rank 0 calls (a metric under ``if rank == 0:``) hangs the job.

c10d pairs a group's collectives by their order. After training, rank 0 all-reduces the
loss to log it; rank 1 never calls that all-reduce, so rank 0 waits in it, with gloo, for 30 minutes.
The `tpu` process group checks each collective against the other ranks' before it enters
gloo: rank 0 raises ``CollectiveDesyncError`` as soon as rank 1 has left, naming both
ranks' lines and the fix, and its run holds the finding. ``--fixed`` all-reduces the
metric on every rank and logs it on rank 0 only.

The script starts its second rank itself (a child process joining through
``init_process_group``'s ``env://``), so it runs as one command; rank 0 is this process.
The error is printed and this rank ends, as a launcher would end it.

    python examples/pitfalls/collective_desync.py [--steps 3] [--fixed]
    tpu-debug run examples/pitfalls/collective_desync.py
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn
from tpu_debug.runtime.distributed.errors import CollectiveDesyncError

import tpu_debug  # noqa: F401 - registers the tpu device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(steps: int, fixed: bool) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(16, 8).to("tpu")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
    if fixed:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # every rank: the final mean loss
        if rank == 0:
            print(f"final mean loss {loss.item():.4f}")
    elif rank == 0:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # only rank 0 calls it: rank 1 is not there
        print(f"final mean loss {loss.item():.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args(argv)
    child = None
    if "RANK" not in os.environ:  # rank 0: start rank 1 with the same arguments
        os.environ.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_")}
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:])],
                                 env=dict(env, RANK="1"))
    dist.init_process_group()
    try:
        train(args.steps, args.fixed)
    except CollectiveDesyncError as exc:
        print(f"rank {dist.get_rank()}: {exc}", file=sys.stderr)
    finally:
        dist.destroy_process_group()
        if child is not None:
            child.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
