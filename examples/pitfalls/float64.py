"""Pitfall: float64 data that runs here and would not run on a TPU.

NumPy makes float64 arrays by default, and ``torch.from_numpy`` keeps the
dtype: features loaded that way make the whole model float64. CPU XLA
computes in float64 without complaint, so the script runs here; a TPU has no
float64, and there the same program fails or must be rewritten in float32.

``tpu-debug run`` on this script names the ops that ran in float64 and the
line where the float64 data entered the device. ``--fixed`` casts the features to float32 where
they are loaded.

    python examples/pitfalls/float64.py [--steps 4] [--fixed]
    tpu-debug run examples/pitfalls/float64.py
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fixed", action="store_true", help="cast the features to float32 when loading")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    features = torch.from_numpy(rng.normal(size=(64, 8)))  # float64, as NumPy makes it
    target = torch.from_numpy(rng.normal(size=(64, 1)))
    if args.fixed:
        features, target = features.float(), target.float()
    x, y = features.to("tpu"), target.to("tpu")
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(dtype=x.dtype).to("tpu")  # the model follows the data's dtype
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"{args.steps} steps in {x.dtype}, final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
