"""A two-rank torch.distributed script for the multi-process run tests (torchrun or --nproc).

    ranks_script.py [same | kill]

``same``: every rank calls the same collectives. ``kill``: rank 1 kills itself (SIGKILL)
after its second collective, as the OOM killer or a preempted host would.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "same"
dist.init_process_group()
rank = dist.get_rank()
x = torch.ones(4, 2, device="tpu")
dist.all_reduce(x)
out = torch.empty(2 * 4, 2, device="tpu")
dist.all_gather_into_tensor(out, x)
if mode == "kill" and rank == 1:
    time.sleep(1.0)  # the run store commits every 0.25 s: what a rank recorded before then is kept
    os.kill(os.getpid(), signal.SIGKILL)
y = torch.ones(4, device="tpu")
dist.all_reduce(y)
dist.barrier()
print(f"rank {rank}: {x.sum().item()} {y.sum().item()}")
dist.destroy_process_group()
