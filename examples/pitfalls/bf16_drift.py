"""Pitfall: a loss that drifts on a TPU, because float32 matmuls run in bfloat16.

A TPU's matrix unit multiplies float32 tensors in bfloat16 unless asked for
more (XLA's DEFAULT precision: 8 significant bits per operand, float32 sums).
This regression model reads sensor values around 1000 whose signal is in the
fractions: rounded to bfloat16, 1000.3 becomes 1000 (bfloat16 steps by 4
there), the first layer sees no signal, and the loss on the device drifts away
from the loss on CPU.

    python examples/pitfalls/bf16_drift.py
        # on this machine's CPU XLA, float32 products: the device loss matches CPU
    tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py
        # TPU numerics: the loss drifts; the report names the first op over
        # tolerance (the first layer's addmm, `hidden = self.inp(x)` below) and
        # shows that it vanishes at precision "highest"
    tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py --highest
        # torch.tpu.precision.set("highest"): no drift (six bfloat16 passes on a TPU: slower)

The better fix is in the data: centre the inputs (``x - x.mean(0)``), so the
signal is what bfloat16 keeps.
"""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn

import tpu_debug  # noqa: F401 - registers the tpu device


class Regressor(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 64):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        hidden = self.inp(x)
        return self.out(torch.relu(hidden))


def train(model, x, y, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-7)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]  # read once, after the loop: no sync per step


def main() -> int:
    if "--highest" in sys.argv[1:]:
        torch.tpu.precision.set("highest")
    torch.manual_seed(0)
    readings = 1000.0 + torch.randn(256, 8)  # raw sensor values: large offset, signal in the fractions
    target = (readings - 1000.0) @ torch.randn(8, 1)
    model = Regressor()
    with torch.no_grad():  # as if trained on the raw readings: the first bias cancels the offset
        model.inp.bias.copy_(-model.inp.weight @ torch.full((8,), 1000.0))
    reference = copy.deepcopy(model)

    cpu = train(reference, readings, target)
    tpu = train(model.to("tpu"), readings.to("tpu"), target.to("tpu"))
    for step, (a, b) in enumerate(zip(cpu, tpu)):
        print(f"step {step}: loss cpu {a:.6f}  tpu {b:.6f}  relative difference {abs(a - b) / abs(a):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
