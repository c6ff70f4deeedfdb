"""Pitfall: a copy to the host at every step, for a metric.

A training loop counts its correct predictions on the host: ``pred.cpu()`` at
every step copies the predictions back, and a copy to the host waits for the
device to finish all the work queued before it. The host can then no longer
queue the next step while the device runs this one: every step pays the
device's whole latency, on a TPU as here.

``tpu-debug run`` on this script reports the copy made at every step, its line,
its size and its time. ``--fixed`` counts on the device (a tensor the step adds
to) and reads the count once, after the loop.

    python examples/pitfalls/d2h_every_step.py [--steps 6] [--fixed]
    tpu-debug run examples/pitfalls/d2h_every_step.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fixed", action="store_true", help="count on the device, read the count once")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(args.steps, 64, 8)
    y = torch.randint(0, 4, (args.steps, 64))
    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    correct = torch.zeros((), dtype=torch.long, device="tpu") if args.fixed else 0
    for step in range(args.steps):
        xb, yb = x[step].to("tpu"), y[step].to("tpu")
        opt.zero_grad()
        logits = model(xb)
        nn.functional.cross_entropy(logits, yb).backward()
        opt.step()
        if args.fixed:
            correct += (logits.argmax(1) == yb).sum()  # stays on the device
        else:
            correct += int((logits.argmax(1).cpu() == y[step]).sum())  # copied back every step
    accuracy = int(correct) / (64 * args.steps)
    print(f"{args.steps} steps, training accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
