"""Pitfall: a compiled layer step called with the layer's index compiles once per layer.

A way to avoid unrolling a loop over layers into one graph is to compile one step and call
it for each layer. Here the compiled function picks its layer itself, ``layers[i](x)``,
from a Python int ``i``: dynamo specializes a graph on the value of a Python number it
indexes with, so it compiles the function again for ``i = 1``, ``2``, ... and every one of
those compiles makes the same program (the layer's weights are its inputs either way).

``tpu-debug run`` on this script reports a compile repeated for every layer, with the
value that changes and the fix: pass the layer itself. ``--fixed`` calls
``step(layer, x)``: one compile serves every layer.

    python examples/pitfalls/compile_per_layer.py [--layers 6] [--steps 2] [--fixed]
    tpu-debug run examples/pitfalls/compile_per_layer.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug

DIM = 32


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # dynamo compiles a function 8 times at most (its recompile limit): 6 layers stay under it
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fixed", action="store_true", help="pass the layer, not its index")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    layers = nn.ModuleList(Layer() for _ in range(args.layers)).to("tpu")
    by_index = tpu_debug.compile(lambda i, x: layers[i](x))
    by_layer = tpu_debug.compile(lambda layer, x: layer(x))
    opt = torch.optim.SGD(layers.parameters(), lr=0.01)
    x = torch.randn(8, DIM).to("tpu").requires_grad_()
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        h = x
        for i, layer in enumerate(layers):
            h = by_layer(layer, h) if args.fixed else by_index(i, h)
        loss = h.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    history = torch.stack(losses).cpu()
    print(f"{args.layers} layers, loss {history[0]:.4f} -> {history[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
