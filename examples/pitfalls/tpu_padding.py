"""Pitfall: a layer width a TPU pads, wasting HBM and matrix-unit work.

A TPU lays a float32 matrix out in (8, 128) tiles: a dimension of 100 is
stored, moved and multiplied as 128, so 22 % of each such array is padding.
A classifier over 100 classes (CIFAR-100's) makes logits of width 100 at
every step. CPU XLA has no tiles, so nothing shows here; compiled for a real
TPU (``--target``), every program is laid out as the TPU would.

``tpu-debug run --target v5e`` on this script names the padded array, its
line and the fix. ``--fixed`` pads the classes to 128 and masks the 28 extra
logits out of the loss, so every array is whole tiles.

    python examples/pitfalls/tpu_padding.py [--steps 3] [--fixed]
    tpu-debug run --target v5e examples/pitfalls/tpu_padding.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device

CLASSES = 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fixed", action="store_true", help="pad the classes to 128 and mask the extra ones")
    args = parser.parse_args(argv)

    width = 128 if args.fixed else CLASSES
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g).to("tpu")
    y = torch.randint(0, CLASSES, (64,), generator=g).to("tpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, width)).to("tpu")
    # the padded classes never win: their logits are pushed far below the real ones
    mask = torch.zeros(width)
    mask[CLASSES:] = -1e9
    mask = mask.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x) + mask, y)  # logits: 64 x width
        loss.backward()
        opt.step()
    print(f"{args.steps} steps, logits of width {width}, final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
