"""Pitfall: a compiled training step that dynamo has to split, at every call.

``tpu_debug.compile`` turns a function into one XLA program, unless dynamo
meets something it cannot put in a graph. Here the step reads the loss with
``.item()`` to skip a step whose loss is too high: a value the host needs
in the middle of the function. Dynamo breaks the graph there, so every call
runs one program up to the ``.item()``, waits for it, goes back to Python,
and runs another program for the rest.

``tpu-debug run`` on this script reports the graph break inside the step,
with dynamo's reason and the line, and the sync it makes. ``--fixed`` keeps
the test on the device (``torch.where``): one program per call.

    python examples/pitfalls/graph_break.py [--steps 8] [--fixed]
    tpu-debug run examples/pitfalls/graph_break.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help="test the loss on the device")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(32, 8).to("tpu")
    y = torch.randn(32, 1).to("tpu")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @tpu_debug.compile
    def train_step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        if args.fixed:
            loss = torch.where(loss > 100.0, loss * 0.0, loss)  # stays in the graph
        elif loss.item() > 100.0:  # the host needs the value now: dynamo splits the graph here
            loss = loss * 0.0
        loss.backward()
        return loss.detach()

    for _ in range(args.steps):
        opt.zero_grad()
        loss = train_step(x, y)
        opt.step()
    print(f"{args.steps} steps, final loss {loss.cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
