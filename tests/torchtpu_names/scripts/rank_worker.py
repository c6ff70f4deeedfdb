"""One rank: writes the launch variables it was started with and an all-reduce of its rank on
the `tpu` device (a worker as TorchTPU's distributed examples write one)."""

import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")


def worker(out_dir: str) -> None:
    dist.init_process_group()
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)], device="tpu")
    dist.all_reduce(t)
    seen = {k: os.environ.get(k) for k in KEYS}
    seen["all_reduce"] = t.item()
    seen["MASTER_ADDR_SET"] = bool(os.environ.get("MASTER_ADDR"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    worker(sys.argv[1])
