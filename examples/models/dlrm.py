"""DLRM (dense features through a bottom MLP, sparse features through `EmbeddingBag`s with
offsets and per-sample weights, pairwise dot-product feature interaction, top MLP) on the
`tpu` device: one training step, eagerly or compiled, checked against CPU.

    python examples/models/dlrm.py [--mode eager|compiled]
    tpu-debug run examples/models/dlrm.py
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

DENSE, DIM, TABLES, BATCH = 13, 16, (40, 30, 20), 8


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = mlp([DENSE, 32, DIM])
        # sum-pooled bags; per_sample_weights weight each looked-up row (mode="sum" only)
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, DIM, mode="sum") for rows in TABLES)
        features = 1 + len(TABLES)
        self.top = mlp([DIM + features * (features - 1) // 2, 32, 1])

    def forward(self, dense, indices, offsets, weights):
        x = self.bottom(dense)
        pooled = [t(i, o, per_sample_weights=w) for t, i, o, w in zip(self.tables, indices, offsets, weights)]
        feats = torch.stack([x, *pooled], dim=1)  # (batch, features, dim)
        dots = feats @ feats.transpose(1, 2)
        rows, cols = torch.tril_indices(feats.shape[1], feats.shape[1], offset=-1, device=dense.device)
        return self.top(torch.cat([x, dots[:, rows, cols]], dim=1)).squeeze(1)


def make_batch():
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(BATCH, DENSE, generator=g)
    indices, offsets, weights = [], [], []
    for rows in TABLES:
        lengths = torch.randint(0, 4, (BATCH,), generator=g)  # bags of 0..3 rows, empty ones too
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
        indices.append(torch.randint(0, rows, (int(lengths.sum()),), generator=g))
        weights.append(torch.rand(int(lengths.sum()), generator=g))
    labels = torch.randint(0, 2, (BATCH,), generator=g).float()
    return dense, indices, offsets, weights, labels


def loss_of(model, batch):
    dense, indices, offsets, weights, labels = batch
    logits = model(dense, indices, offsets, weights)
    return logits, F.binary_cross_entropy_with_logits(logits, labels)


def _to(batch, device):
    return tuple([t.to(device) for t in b] if isinstance(b, list) else b.to(device) for b in batch)


def run(mode: str) -> _harness.Comparison:
    return _harness.compare(DLRM, make_batch, loss_of, mode, to_device=_to)


def main(argv: list[str] | None = None) -> int:
    return _harness.main_for(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
