"""Pitfall: an eager training step made of thousands of tiny ops.

In eager mode every op is its own program: the host dispatches it and the
device runs a few microseconds of work. A model written as a Python loop of
small ops (here a recurrent cell unrolled over 96 time steps, over 1,100
ops per training step on 8 x 16 tensors) spends its time dispatching, not
computing. Compiled, the same step is one program.

``tpu-debug run`` on this script reports the eager step of thousands of
tiny ops, with the op count, the time per op and an estimate, from this
run, of what compiling the step would save. ``--fixed`` compiles it with
``tpu_debug.compile``.

    python examples/pitfalls/tiny_ops.py [--steps 4] [--fixed]
    tpu-debug run examples/pitfalls/tiny_ops.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug

SEQ, BATCH, HIDDEN = 96, 8, 16


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.rec = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        h = torch.zeros(BATCH, HIDDEN, device=xs[0].device)
        for x in xs:  # one small op after another, SEQ times
            h = torch.tanh(self.inp(x) + self.rec(h))
        return h


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fixed", action="store_true", help="compile the training step")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    xs = [torch.randn(BATCH, HIDDEN).to("tpu") for _ in range(SEQ)]
    y = torch.randn(BATCH, HIDDEN).to("tpu")
    model = Cell().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(xs, y):
        loss = nn.functional.mse_loss(model(xs), y)
        loss.backward()
        return loss.detach()

    step = tpu_debug.compile(train_step) if args.fixed else train_step
    for _ in range(args.steps):
        opt.zero_grad()
        loss = step(xs, y)
        opt.step()
    print(f"{args.steps} steps, final loss {loss.cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
