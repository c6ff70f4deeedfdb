"""Train a small MLP for 100 steps on the `tpu` device, with SGD and with Adam.

The same training runs on PyTorch's CPU in this process, and the loss curves
are compared step by step: they must agree within float32 tolerance.

    python examples/mlp_train.py [--steps 100]
    tpu-debug run examples/mlp_train.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


def make_data(n: int = 256, features: int = 16, classes: int = 4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    true_w = torch.randn(features, classes, generator=g)
    y = (x @ true_w).argmax(dim=1)
    return x, y


def make_model(features: int = 16, classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, classes))


def train(device: str, optimizer: str, steps: int) -> list[float]:
    x, y = make_data()
    model = make_model().to(device)
    x, y = x.to(device), y.to(device)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]  # one transfer at the end, not one per step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"tpu device runs on: {torch.tpu.get_device_name()}")
    worst = 0.0
    for opt in ("sgd", "adam"):
        tpu = train("tpu", opt, args.steps)
        cpu = train("cpu", opt, args.steps)
        diff = max(abs(a - b) for a, b in zip(tpu, cpu))
        worst = max(worst, diff / max(abs(c) for c in cpu))
        print(f"{opt:>4}: loss {tpu[0]:.4f} -> {tpu[-1]:.4f} on tpu, {cpu[0]:.4f} -> {cpu[-1]:.4f} on cpu; "
              f"max |tpu - cpu| = {diff:.2e}")
    ok = worst < 1e-4
    print("loss curves match CPU" if ok else f"loss curves DIVERGE from CPU (relative {worst:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
