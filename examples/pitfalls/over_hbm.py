"""Pitfall: a model that does not fit one TPU chip, found before renting one.

An output layer over a 262,144-token vocabulary from a 16,384-wide model
holds 4.3 billion weights: 16 GiB in float32, over the 15.75 GiB XLA gives a
program on one v5e chip. A dry run (``--dry-run``) finds it on any machine:
its tensors hold no data, and every program goes to the TPU compiler, which
refuses the layer's for want of HBM. Printing a prediction then needs a
value a dry run does not have, so the run stops there.

``tpu-debug run --dry-run --target v5e`` on this script says it does not fit,
what holds the memory, and that bfloat16 weights (8 GiB) would. ``--fixed``
keeps the weights in bfloat16 and reads no value in a dry run.

    python examples/pitfalls/over_hbm.py [--fixed]        (a dry run for v5e)
    tpu-debug run --dry-run --target v5e examples/pitfalls/over_hbm.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from tpu_debug.runtime import dry_mode

import tpu_debug

HIDDEN, VOCAB = 16384, 262144


def predict(fixed: bool) -> None:
    dtype = torch.bfloat16 if fixed else torch.float32
    with torch.device("meta"):  # no initialization: the weights are a checkpoint's to load
        head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=dtype)
    head = head.to_empty(device="tpu")  # 4.3 billion weights
    hidden = torch.randn(8, HIDDEN, dtype=dtype, device="tpu")
    with torch.no_grad():
        logits = head(hidden)
    if not (fixed and dry_mode.active is not None):
        print("next tokens:", logits.argmax(-1).tolist())  # a value: a dry run has none


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fixed", action="store_true", help="bfloat16 weights, and no value read in a dry run"
    )
    args = parser.parse_args(argv)
    if dry_mode.active is not None:  # under tpu-debug run --dry-run
        predict(args.fixed)
        return 0
    # run as a script: the same code as a dry run (16 GiB of weights are never allocated)
    result = tpu_debug.dry_run(predict, args.fixed, target="v5e")
    print(result.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
