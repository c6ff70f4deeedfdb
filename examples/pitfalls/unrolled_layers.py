"""Pitfall: a transformer compiled whole, its layers in a Python loop, compiles every layer again.

``tpu_debug.compile(model)`` (as ``torch.compile(model)``) traces ``forward`` as Python
runs it: the loop ``for layer in self.layers`` is unrolled, and the graph holds one copy of
the layer's operations per layer. Dynamo traces each copy, AOTAutograd differentiates each,
and XLA compiles each: the compile grows with the depth of the model though every layer is
the same program with other weights. On a TPU, for a real model, that is minutes.

``tpu-debug run`` on this script reports the compile time line by line (the report's
Compile time section: the layer's lines take most of it) and an unrolled loop, with the
fix: compile one layer and reuse it. ``--fixed`` compiles each layer
(``tpu_debug.compile(layer)``) instead of the model: dynamo traces the layer once, and
every layer runs that one program with its own weights.

    python examples/pitfalls/unrolled_layers.py [--layers 12] [--steps 2] [--fixed]
    tpu-debug run examples/pitfalls/unrolled_layers.py
    tpu-debug report --compile-profile compile.pb.gz   # then: pprof -top compile.pb.gz
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug

DIM, HEADS, SEQ, BATCH = 32, 4, 16, 2


class Block(nn.Module):
    """A pre-norm transformer layer: self-attention, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) / (d // HEADS) ** 0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fixed", action="store_true", help="compile each layer, not the whole model")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Transformer(args.layers).to("tpu")
    if args.fixed:
        # one compiled layer: dynamo traces Block.forward once and reuses it for every layer
        for i, layer in enumerate(model.layers):
            model.layers[i] = tpu_debug.compile(layer)
        forward = model
    else:
        forward = tpu_debug.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, SEQ, DIM).to("tpu")
    target = torch.randn(BATCH, SEQ, DIM).to("tpu")
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(forward(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    history = torch.stack(losses).cpu()
    print(f"{args.layers} layers, {args.steps} steps, loss {history[0]:.4f} -> {history[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
