"""Pitfall: one rank does extra work before every collective, and the others wait for it.

Rank 1 writes a log line to a slow file system before each step's gradient all-reduce (a
sleep stands for it here); rank 0 reaches the all-reduce first and waits there each step.
Nothing hangs and the numbers are right, so nothing says so, except the time. The `tpu`
process group's live check sees each rank arrive: rank 0's run holds the finding "rank 1
entered last at N of N collectives ... this rank waited ... for it", at the all-reduce's
line. ``--fixed`` leaves the slow logging out of the loop.

The script starts its second rank itself (a child process joining through
``init_process_group``'s ``env://``), so it runs as one command; rank 0 is this process.

    python examples/pitfalls/collective_straggler.py [--steps 6] [--fixed]
    tpu-debug run examples/pitfalls/collective_straggler.py
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slow_log(step: int) -> None:
    time.sleep(0.1)  # a log line to a slow file system, on one rank only


def train(steps: int, fixed: bool) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 1, bias=False).to("tpu")  # one gradient: one all-reduce per step, after the sleep
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(16, 8, device="tpu")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == 1 and not fixed:
            slow_log(step)
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)  # the ranks meet here
        opt.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
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
    finally:
        dist.destroy_process_group()
        if child is not None:
            child.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
