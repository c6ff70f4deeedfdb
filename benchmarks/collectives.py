"""What tracing costs a c10d collective on `tpu`: all_reduce on 2 ranks, untraced against traced.

    python benchmarks/collectives.py            # starts itself under torchrun, 2 ranks
    python benchmarks/collectives.py --calls 200 --rounds 7 --sizes 256,65536,1048576

Each rank runs, per tensor size and round, a block of ``--calls`` all_reduces untraced and
one inside ``tpu_debug.trace()`` (the order alternating between rounds, the trace entered
and left outside the timed block, a barrier before each block so both ranks start it
together). A traced call adds what the `tpu` process group's probe and the recorder do
per collective: a ``collective_call`` event with the user's line. The figures are rank 0's
medians over the rounds: wall time and this process's CPU time per call, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _block(dist, tensor, calls: int) -> tuple[float, float]:
    """(wall, CPU) seconds per all_reduce over ``calls`` calls, both ranks starting together."""
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(tensor)
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import tpu_debug

    dist.init_process_group()
    rank = dist.get_rank()
    logdir = tempfile.mkdtemp(prefix=f"collectives-bench-rank{rank}-")
    rows = []
    for n in args.sizes:
        tensor = torch.ones(n, device="tpu")
        _block(dist, tensor, max(args.calls // 10, 5))  # warm: the first transfers of this size
        off, on = [], []
        for r in range(args.rounds):
            for traced in ((False, True) if r % 2 == 0 else (True, False)):
                if traced:
                    with tpu_debug.trace(logdir=logdir, name="bench"):
                        on.append(_block(dist, tensor, args.calls))
                else:
                    off.append(_block(dist, tensor, args.calls))
        rows.append((n, off, on))
    if rank == 0:
        print(f"all_reduce of float32 on {dist.get_world_size()} ranks (`tpu`, tpu_dist), "
              f"{args.calls} calls x {args.rounds} rounds, medians of rank 0")
        print("| elements (bytes) | untraced wall/call | traced wall/call | traced / untraced wall "
              "| untraced CPU/call | traced CPU/call | traced / untraced CPU | added CPU/call |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, off, on in rows:
            ow, oc = statistics.median(w for w, _ in off), statistics.median(c for _, c in off)
            tw, tc = statistics.median(w for w, _ in on), statistics.median(c for _, c in on)
            print(f"| {n} ({4 * n} B) | {ow * 1e6:.1f} µs | {tw * 1e6:.1f} µs | {tw / ow:.3f}x "
                  f"| {oc * 1e6:.1f} µs | {tc * 1e6:.1f} µs | {tc / oc:.3f}x | {(tc - oc) * 1e6:.1f} µs |")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="256,65536,1048576",
                        type=lambda text: [int(v) for v in text.split(",")])
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        worker(args)
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), __file__,
               "--calls", str(args.calls), "--rounds", str(args.rounds), "--sizes", ",".join(map(str, args.sizes))]
    code = subprocess.call(command)
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
