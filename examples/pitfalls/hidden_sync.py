"""Pitfall: reading the loss inside the training loop makes the host wait for the device every step.

The device runs asynchronously: the host queues work and moves on, until it
needs a value. ``loss.item()`` (to add up the epoch's loss) and printing the
loss tensor each need the value now, so every step waits for the device to
finish, and printing a tensor copies it element by element.

``tpu-debug run`` on this script lists those syncs by line: the ``.item()``
line and the ``print`` line, each with one sync (or more) per step, and the
time they cost. ``--fixed`` keeps the running loss on the device and reads it
once, after the loop.

    python examples/pitfalls/hidden_sync.py [--steps 20] [--fixed]
    tpu-debug run examples/pitfalls/hidden_sync.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fixed", action="store_true", help="keep the loss on the device, read it once")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(64, 8).to("tpu")
    y = torch.randn(64, 1).to("tpu")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    total = 0.0
    running = torch.zeros((), device="tpu")
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if args.fixed:
            running += loss.detach()  # stays on the device: no sync
        else:
            total += loss.item()  # sync: waits for this step to finish
            print(f"step {step}: loss {loss}")  # formatting a tensor: more syncs
    if args.fixed:
        total = running.item()  # the only sync
    print(f"mean loss over {args.steps} steps: {total / args.steps:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
