"""Two ranks of a data-parallel loop, one of them slow (run by tests/distributed/test_step_time_ranks.py).

    tpu-debug run --nproc 2 slow_rank.py OUT

Rank 1 does extra work before each step's all_reduce (a sleep of SLOW seconds, standing
for work only one rank does); rank 0 waits for it in the all_reduce. Each rank writes
``OUT/rank<r>.json``: what its own clock measured around each all_reduce and each sleep.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import tpu_debug

SLOW = 0.2
STEPS = 6

dist.init_process_group()
rank = dist.get_rank()
w = torch.ones(64, device="tpu")
clocks, sleeps = [], []
for _ in range(STEPS):
    grad = (w * 2.0).relu()
    if rank == 1:
        start = time.perf_counter()
        time.sleep(SLOW)
        sleeps.append(time.perf_counter() - start)
    start = time.perf_counter()
    dist.all_reduce(grad)
    clocks.append(time.perf_counter() - start)
    tpu_debug.step()
Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({"clocks": clocks, "sleeps": sleeps}))
dist.destroy_process_group()
