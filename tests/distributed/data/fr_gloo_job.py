"""A plain PyTorch job on gloo with its Flight Recorder on, for ``tpu-debug import-fr``
(run by tests/distributed/test_flight_recorder.py without the `tpu` device).

    TORCH_FR_BUFFER_SIZE=100 TORCH_FR_DUMP_TEMP_FILE=DIR/rank_ torchrun --nproc-per-node 2 fr_gloo_job.py

Rank 1 reads each batch slowly (a sleep stands for it) before 5 all-reduces, then both
broadcast. Each rank writes its dump as a job does on demand: PyTorch's
``_dump_fr_trace()`` to ``TORCH_FR_DUMP_TEMP_FILE`` followed by its rank.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for _ in range(5):
    if rank == 1:
        time.sleep(0.1)  # rank 1 reads its batch slowly
    dist.all_reduce(t)  # the ranks meet here
dist.broadcast(t, 0)
with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
    f.write(torch._C._distributed_c10d._dump_fr_trace())
dist.destroy_process_group()
