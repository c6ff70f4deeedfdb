"""A CPU job, written as for plain PyTorch: gloo, FSDP2's ``fully_shard`` with no mesh (run by
tests/distributed/test_cpu_jobs.py with and without the `tpu` device registered).

    torchrun --nproc-per-node 2 cpu_fsdp2.py OUT_DIR [--tpu-tensor]

Each rank writes ``OUT_DIR/rank<r>.json``: PyTorch's accelerator, the device of the mesh
FSDP2 built, the losses of two SGD steps and every full parameter after them. With
``--tpu-tensor`` it then all-reduces a `tpu` tensor on the gloo group and writes the
error's type and text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
fully_shard(model)  # no mesh: FSDP2 builds one on PyTorch's accelerator
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank))
losses = []
for _ in range(2):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
result = {
    "accelerator": str(torch._C._get_accelerator()),
    "mesh": next(model.parameters()).device_mesh.device_type,
    "losses": losses,
    "params": [p.full_tensor().tolist() for p in model.parameters()],
}
if "--tpu-tensor" in sys.argv:
    try:
        dist.all_reduce(torch.ones(2, device="tpu"))
    except Exception as exc:  # noqa: BLE001 - the test reads what it raised
        result["tpu_tensor"] = {"type": type(exc).__name__, "text": str(exc)}
(out / f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
