"""Pitfall: a Python number that changes every step is baked into the compiled program.

The loss raises the error to a power ``gamma`` that is annealed as training
goes (a focal-style loss), and is compiled with ``tpu_debug.compile``. Dynamo
turns a Python float argument into a constant of the graph, guarded by its
value: at every new ``gamma`` the guard fails and the function is traced and
compiled again (forward and backward), until dynamo's recompile limit is hit
and the function runs uncompiled from then on.

``tpu-debug run`` on this script reports the recompiles in steady state,
caused by the Python scalar ``gamma`` (not a shape: padding would not help),
the recompile limit hit, and the fix: keep the value in a tensor on the
device, updated in place. ``--fixed`` does that: one program serves every
step.

    python examples/pitfalls/python_scalar.py [--steps 12] [--fixed]
    tpu-debug run examples/pitfalls/python_scalar.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fixed", action="store_true", help="keep gamma in a device tensor")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(32, 8).to("tpu")
    y = torch.randn(32, 1).to("tpu")
    model = nn.Linear(8, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @tpu_debug.compile
    def loss_fn(pred, target, gamma):
        return (pred - target).abs().pow(gamma).mean()

    gamma_t = torch.tensor(2.0, device="tpu")  # made once; updated in place with --fixed
    for step in range(args.steps):
        gamma = 2.0 - 0.1 * step  # annealed: a new value every step
        if args.fixed:
            gamma_t.fill_(gamma)
        opt.zero_grad()
        loss = loss_fn(model(x), y, gamma_t if args.fixed else gamma)
        loss.backward()
        opt.step()
    print(f"{args.steps} steps, final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
