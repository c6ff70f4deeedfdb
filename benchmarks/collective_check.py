"""What the live desync check costs per c10d collective of the `tpu` process group.

    python benchmarks/collective_check.py [--rounds 20] [--calls 200]

Starts two ranks with torchrun (this script again) on this machine. Each round times
``calls`` all-reduces of a `tpu` tensor with the check on and ``calls`` with it off (the
process group's check set aside), alternating which goes first, for a 4-element tensor
and a 256 Ki-element (1 MiB) one, and a barrier. Rank 0 prints the median time per
collective with and without the check and their difference over rounds. The check is one
store write and one read of the other ranks' entries per collective (more reads only
while a rank waits for a late one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _rank_main(rounds: int, calls: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group()
    group = dist.group.WORLD
    check = group._check
    small, big = torch.ones(4, device="tpu"), torch.ones(262144, device="tpu")
    cases = {
        "all_reduce f32[4]": lambda: dist.all_reduce(small),
        "all_reduce f32[262144] (1 MiB)": lambda: dist.all_reduce(big),
        "barrier": dist.barrier,
    }
    rows = []
    for name, fn in cases.items():
        for _ in range(5):
            fn()
        on, off = [], []
        for r in range(rounds):
            for checked in ((True, False) if r % 2 == 0 else (False, True)):
                group._check = check if checked else None
                dist.barrier()  # both ranks start the sample together
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                (on if checked else off).append((time.perf_counter() - start) / calls)
        group._check = check
        rows.append((name, statistics.median(off), statistics.median(on),
                     statistics.median(a - b for a, b in zip(on, off, strict=True))))
    if dist.get_rank() == 0:
        print(f"{'collective':32} {'unchecked':>11} {'checked':>11} {'cost':>9}")
        for name, off_s, on_s, cost in rows:
            print(f"{name:32} {off_s * 1e6:9.1f} us {on_s * 1e6:9.1f} us {cost * 1e6:6.1f} us")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if "RANK" in os.environ:
        _rank_main(args.rounds, args.calls)
        return
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__,
                    "--rounds", str(args.rounds), "--calls", str(args.calls)], check=True)


if __name__ == "__main__":
    main()
