"""Pitfall: image and batch sizes a TPU pads, wasting HBM and bandwidth.

A TPU lays a float32 array out in (8, 128) tiles over two of its dimensions
(the compiler picks which): a dimension of 100 is stored and moved as 128.
Images of 100 x 100 pixels in batches of 96 leave it no dimension that fills
a tile, so 22 % of every image batch the step touches is padding, and a third
of the pooled one. CPU XLA has no tiles, so nothing shows here; compiled for
a real TPU (``--target``), every program is laid out as the TPU would.

``tpu-debug run --target v5e`` on this script names the padded arrays, their
line and the dimension to pad. ``--fixed`` crops and pads the images to
128 x 128 and batches 128 of them, so the tiles are full.

    python examples/pitfalls/tpu_padding.py [--steps 3] [--fixed]
    tpu-debug run --target v5e examples/pitfalls/tpu_padding.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device

CLASSES = 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fixed", action="store_true", help="128 x 128 images in batches of 128")
    args = parser.parse_args(argv)

    size, batch = (128, 128) if args.fixed else (100, 96)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, size, size, generator=g).to("tpu")
    labels = torch.randint(0, CLASSES, (batch,), generator=g).to("tpu")
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1).to("tpu")
    torch.manual_seed(0)
    model = nn.Linear(3 * (size // 2) ** 2, CLASSES).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = (images - mean) * 4.0  # normalized: batch x 3 x size x size
        x = nn.functional.avg_pool2d(x, 2).flatten(1)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
    print(
        f"{args.steps} steps on {batch} images of {size}x{size}, final loss {loss.detach().cpu().item():.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
