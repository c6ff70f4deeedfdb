"""Pitfall: a fit check whose TPU compile takes most of the run's compile time.

``tpu-debug run --target v5e`` compiles every program twice: for this machine, to run it,
and for the TPU, to read its memory, cost and padding. XLA's TPU compiler works much
harder than the CPU one on wide layers (tiling, VMEM windows, code generation for each
fusion): here the TPU's compile of one training step is several times the local one, and
most of the run's compile time.

``tpu-debug run --target v5e`` on this script reports that the target's compile dominates,
with the setting that cuts it for a memory check: XLA's lowest effort level, which TorchTPU
reads from ``TORCH_TPU_INTERNAL_XLA_OPTIONS`` (and the target compile follows). ``--fixed``
sets it before the first compile.

    tpu-debug run --target v5e --target-wait 900 examples/pitfalls/target_compile_bound.py [--fixed]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

WIDTH, DEPTH, BATCH = 2048, 8, 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fixed", action="store_true", help="compile at XLA's lowest effort level (O0)")
    args = parser.parse_args(argv)
    # no results kept between runs: each run compiles for the TPU (with the target cache on, a
    # second run reads them back, which hides the compile this example is about)
    os.environ["TPU_DEBUG_TARGET_CACHE"] = "off"
    if args.fixed:
        # a memory check needs the buffers, not the fastest code: O0 compiles far less
        os.environ["TORCH_TPU_INTERNAL_XLA_OPTIONS"] = "xla_optimization_level=O0"

    import tpu_debug

    torch.manual_seed(0)
    layers = [m for _ in range(DEPTH) for m in (nn.Linear(WIDTH, WIDTH), nn.GELU())]
    model = nn.Sequential(*layers).to("tpu")
    step = tpu_debug.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH).to("tpu")
    for _ in range(args.steps):
        opt.zero_grad()
        loss = step(x).square().mean()
        loss.backward()
        opt.step()
    print(f"loss {float(loss.detach()):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
