"""Pitfall: the same data copied to the device at every step.

A class-weight table written as a Python list is turned into a device tensor
inside the training loop: ``torch.tensor(weights, device="tpu")`` builds it
on the host and copies it over at every step, though it never changes.
Copies like this (or a batch the device waits for, when a DataLoader neither
pins memory nor prefetches) add a host-to-device transfer to every step.

``tpu-debug run`` on this script reports the copy made at every step, its
line, its size and its time. ``--fixed`` builds the tensor once, before the
loop.

    python examples/pitfalls/h2d_every_step.py [--steps 6] [--fixed]
    tpu-debug run examples/pitfalls/h2d_every_step.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device

CLASS_WEIGHTS = [1.0, 2.0, 0.5, 1.5]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fixed", action="store_true", help="build the weights once, before the loop")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(64, 8).to("tpu")
    y = torch.randint(0, 4, (64,)).to("tpu")
    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    weights = torch.tensor(CLASS_WEIGHTS, device="tpu")
    for _ in range(args.steps):
        if not args.fixed:
            weights = torch.tensor(CLASS_WEIGHTS, device="tpu")  # rebuilt and copied every step
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y, weight=weights)
        loss.backward()
        opt.step()
    print(f"{args.steps} steps, final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
