"""Pitfall: a compile cache folder made anew for every run never holds a program.

A launcher that gives each job a folder of its own (``mktemp -d``, a job id in
TorchTPU's ``TORCH_TPU_TIER2_COMPILATION_CACHE``) sends every run's compile cache to a
new, empty folder: each run compiles every program again, and the programs the last run
compiled sit in the folder next to it. This script stands for the second run of such a
job: it first starts the job's previous run (the same training, in a process of its own,
with a folder of its own), then trains in a new folder.

``tpu-debug run --compile-cache`` on this script reports a cache that misses what the
earlier run compiled, names the folder that holds it and the fix: one cache folder kept
between runs. ``--fixed`` gives both runs the same folder: this run reads every program
back.

    tpu-debug run --compile-cache examples/pitfalls/compile_cache_per_run.py [--fixed]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path

import torch
from torch import nn

# the job's cache folders, under the working directory
CACHES = Path.cwd() / "compile-caches"


def train(steps: int) -> float:
    import tpu_debug  # noqa: F401 - registers the tpu device

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32).to("tpu"), torch.randn(16, 8).to("tpu")
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return float(loss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fixed", action="store_true", help="one cache folder for both runs")
    parser.add_argument("--previous-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    folder = CACHES / ("shared" if args.fixed else f"job-{uuid.uuid4().hex[:8]}")
    # what the launcher does for each job (TorchTPU's variable; an absolute path is used as is)
    os.environ["TORCH_TPU_TIER2_COMPILATION_CACHE"] = str(folder)
    if args.previous_run:
        print(f"previous run: loss {train(args.steps):.4f}")
        return 0
    # the job's previous run, with the compile cache on and a folder of its own
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_TPU_TIER2_COMPILATION_CACHE",
                                                            "TPU_DEBUG_COMPILE_CACHE_DIR")}
    env["TPU_DEBUG_COMPILE_CACHE"] = "1"
    again = ["--fixed"] if args.fixed else []
    subprocess.run([sys.executable, __file__, "--previous-run", "--steps", str(args.steps), *again], env=env,
                   check=True)
    print(f"this run: loss {train(args.steps):.4f} (compile cache in {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
