"""A ResNet (basic residual blocks, batch norm, strided downsampling, global average pool)
on the `tpu` device: one training step, eagerly or compiled, checked against CPU.
Written here: torchvision cannot be installed beside this torch.

    python examples/models/resnet.py [--mode eager|compiled]
    tpu-debug run examples/models/resnet.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.models import _harness  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(8, 16, 32), blocks=(1, 1, 1), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make_batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def loss_of(model, batch):
    x, y = batch
    logits = model(x)
    return logits, F.cross_entropy(logits, y)


def run(mode: str) -> _harness.Comparison:
    return _harness.compare(ResNet, make_batch, loss_of, mode)


def main(argv: list[str] | None = None) -> int:
    return _harness.main_for(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
