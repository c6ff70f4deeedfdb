"""Pitfall: an op with no TPU kernel, run on CPU at every step (there and back).

A custom op (here ``demo::soft_clip``, written for CPU as an extension would
be) has no ``tpu`` lowering. With ``tpu_debug.runtime.config.cpu_fallback``
on, the runtime runs it on CPU instead of failing: at every call its inputs
are copied to the host and its result back to the device, and the device
waits for the host in the middle of the step.

``tpu-debug run`` on this script reports the CPU fallback inside the step,
with the op, its inputs and what the copies cost. ``--fixed`` writes the same
function with ops the device has: no fallback.

    python examples/pitfalls/cpu_fallback.py [--steps 6] [--fixed]
    tpu-debug run examples/pitfalls/cpu_fallback.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug
from tpu_debug.runtime import config as runtime_config

_lib = torch.library.Library("demo", "DEF")
_lib.define("soft_clip(Tensor x) -> Tensor")
_lib.impl("soft_clip", lambda x: x / (1 + x.abs()), "CPU")  # a CPU kernel only


def soft_clip(x: torch.Tensor, fixed: bool) -> torch.Tensor:
    return x / (1 + x.abs()) if fixed else torch.ops.demo.soft_clip(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fixed", action="store_true", help="use ops that run on the device")
    args = parser.parse_args(argv)
    runtime_config.cpu_fallback = True  # run ops without a lowering on CPU instead of failing

    torch.manual_seed(0)
    x = torch.randn(32, 8).to("tpu")
    y = torch.randn(32, 1).to("tpu")
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        with torch.no_grad():
            target = soft_clip(y, args.fixed)  # the CPU-only op, every step
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
    print(f"{args.steps} steps, final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
