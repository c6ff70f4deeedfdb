"""Pitfall: an index out of range, which a TPU clamps where PyTorch on CPU raises.

The labels come 1-based from the data (classes 1..5) and pick each sample's
logit with ``torch.gather`` as if they were 0-based: label 5 is index 5 of a
row of 5 logits. PyTorch on CPU raises ("index 5 is out of bounds"); XLA on a
TPU clamps the index into range and reads another class's logit, and the
model trains on the wrong targets without a word. (On CPU, this runtime's XLA
program fills the row with ``nan`` instead: the loss printed here is ``nan``.)

``tpu-debug run`` on this script reports the gather as an error at its line,
with the index, its bounds and what a TPU does instead, whichever mode runs
it (``--mode eager`` raises PyTorch's error there as well, as eager mode checks
indices by default; lazy and compiled programs raise only with
``TPU_DEBUG_DATA_CHECKS=1``). ``--fixed`` makes the labels 0-based.

    python examples/pitfalls/out_of_range_index.py [--steps 3] [--mode lazy] [--fixed]
    tpu-debug run examples/pitfalls/out_of_range_index.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device

CLASSES = 5


def nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean negative log-likelihood of each sample's label."""
    logp = torch.log_softmax(logits, dim=1)
    return -torch.gather(logp, 1, labels[:, None]).mean()  # the label's log-probability


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mode", choices=("eager", "lazy", "compiled"), default="lazy")
    parser.add_argument("--fixed", action="store_true", help="make the 1-based labels 0-based")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(16, 8).to("tpu")
    labels = torch.arange(16) % CLASSES + 1  # classes 1..5, as the data file numbers them
    if args.fixed:
        labels = labels - 1
    labels = labels.to("tpu")
    model = nn.Linear(8, CLASSES).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of = torch.compile(nll, backend="tpu_debug") if args.mode == "compiled" else nll
    mode = torch.tpu.EagerMode.DEFER_AND_FUSE if args.mode == "lazy" else torch.tpu.EagerMode.DEFER_NEVER
    with torch.tpu.set_eager_mode(mode):
        for _ in range(args.steps):
            opt.zero_grad()
            loss = loss_of(model(x), labels)
            loss.backward()
            opt.step()
    print(f"{args.steps} steps ({args.mode}), final loss {loss.detach().cpu().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
