"""Two ranks that stop calling the same collectives (run by tests/distributed/test_collective_calls.py).

    python collective_desync.py hang|shapes

``hang``: rank 0 makes one more all_reduce than rank 1, which leaves (a collective under
``if rank == 0``); rank 0 waits in it until gloo gives up. ``shapes``: the ranks all-gather
tensors of different sizes at their third collective.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

dist.init_process_group(timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
t = torch.ones(4, device="tpu")
dist.all_reduce(t)
dist.barrier()
if sys.argv[1] == "hang":
    if rank == 0:
        dist.all_reduce(t)  # only rank 0 gets here
else:
    out = torch.empty(4, device="tpu")
    dist.all_gather_into_tensor(out, torch.ones(2 + rank, device="tpu"))
dist.destroy_process_group()
