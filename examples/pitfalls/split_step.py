"""Pitfall: a compiled model whose optimizer runs outside it, one parameter at a time.

``torch.compile(model)`` makes the forward and backward programs, but
``optimizer.step()`` still runs eagerly after them: here SGD with momentum
over a deep, narrow MLP's 64 parameters with ``foreach=False``, three small
ops per parameter and the optimizer's Python around each, every step. On
small models that host work is most of the step. TorchTPU's guide compiles
the training step whole: forward, backward and the update in one program.

``tpu-debug run`` on this script reports the optimizer outside the compiled
model, at its ``opt.step()`` line, with its ops per step and the share of
the step its host work takes. ``--fixed`` compiles the whole step with
``tpu_debug.compile``.

    python examples/pitfalls/split_step.py [--steps 8] [--fixed]
    tpu-debug run examples/pitfalls/split_step.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug

LAYERS, WIDTH, BATCH = 32, 8, 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help="compile the whole training step")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())]).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    x, y = torch.randn(BATCH, WIDTH).to("tpu"), torch.randn(BATCH, WIDTH).to("tpu")

    if args.fixed:

        @tpu_debug.compile
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

    else:
        cmodel = torch.compile(model, backend="tpu_debug")

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(cmodel(x), y)
            loss.backward()
            opt.step()  # eager: three ops per parameter, after the compiled programs
            return loss.detach()

    for _ in range(args.steps):
        loss = step(x, y)
    print(f"{args.steps} steps, final loss {loss.cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
