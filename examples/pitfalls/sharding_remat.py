"""Pitfall: two inputs of one op sharded differently make XLA gather a whole tensor every step.

The activations of a data + tensor parallel step are split on the batch (over
"dp") and on the hidden dimension (over "tp"). The position embeddings added to
them were laid out for sequence parallelism: the sequence split over all eight
devices. XLA's SPMD partitioner cannot turn one layout into the other with a
collective, so it gathers the whole tensor onto every device and splits it again,
in every call of the step (it says so on stderr: "Involuntary full
rematerialization", a line easy to miss among the log).

``tpu-debug run --devices 8`` on this script records that warning instead of
printing it and makes it a finding at the line of the addition, with both
layouts; ``--fixed`` shards the embeddings the way the activations are.

    tpu-debug run --devices 8 examples/pitfalls/sharding_remat.py [--steps 4] [--fixed]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.runtime import distributed as dist

import tpu_debug

BATCH, SEQ, HIDDEN = 8, 16, 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fixed", action="store_true", help="shard the embeddings like the activations")
    args = parser.parse_args(argv)
    if torch.tpu.device_count() < 8:
        print(f"this example needs 8 devices, found {torch.tpu.device_count()}: run it with "
              "tpu-debug run --devices 8", file=sys.stderr)
        return 2

    mesh = dist.init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1)).to("tpu")
    dist.distribute_module(model, mesh)  # weights replicated
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    activations = ("dp", None, "tp")  # batch over dp, hidden over tp
    positions = dist.mark_sharding(torch.randn(BATCH, SEQ, HIDDEN, device="tpu"), mesh,
                                   activations if args.fixed else (None, ("dp", "tp"), None))

    def train_step(x, pos, y):
        h = x + pos  # the op that meets both layouts
        loss = F.mse_loss(model(h).squeeze(-1), y)
        loss.backward()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    for _ in range(args.steps):
        x = dist.mark_sharding(torch.randn(BATCH, SEQ, HIDDEN, device="tpu"), mesh, activations)
        y = dist.mark_sharding(torch.randn(BATCH, SEQ, device="tpu"), mesh, ("dp", None))
        opt.zero_grad()
        loss = step(x, positions, y)
        opt.step()
    print(f"loss after {args.steps} steps: {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
