"""Pitfall: a training loop fed batches of varying sequence length recompiles on every new length.

XLA compiles one program per input shape. Here each batch has a different
sequence length, so every op that sees the sequence dimension (embedding,
linear layers, the loss, their gradients) gets a new shape and compiles again:
the run spends its time compiling, not training.

``tpu-debug run`` on this script reports a recompile storm and names the
dimension that keeps changing (dim 1 of the token batch: the sequence length)
with the lengths it took, and the fix: pad or bucket it. ``--bucket 16`` pads
every batch up to a multiple of 16 (padding tokens are ignored by the loss),
so two programs serve every step.

    python examples/pitfalls/recompile_storm.py [--steps 12] [--bucket 16] [--compiled]
    tpu-debug run examples/pitfalls/recompile_storm.py
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import tpu_debug

VOCAB, DIM, BATCH = 32, 16, 4
# what a data loader of unpadded sentences gives: a new length almost every step
LENGTHS = (12, 17, 9, 23, 31, 20, 26, 14, 12, 17, 9, 23, 28, 11, 19, 30)
IGNORE = -100  # label of padding tokens: the loss skips them


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(tokens))))


def batch(step: int, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens of this step's length; with ``bucket``, padded up to a multiple of it."""
    g = torch.Generator().manual_seed(step)
    length = LENGTHS[step % len(LENGTHS)]
    tokens = torch.randint(0, VOCAB, (BATCH, length + 1), generator=g)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    if bucket:
        padded = -(-length // bucket) * bucket
        inputs = nn.functional.pad(inputs, (0, padded - length), value=0)
        labels = nn.functional.pad(labels, (0, padded - length), value=IGNORE)
    return inputs, labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--bucket", type=int, default=0, help="pad sequence lengths up to a multiple of this")
    parser.add_argument("--compiled", action="store_true", help="run the model with tpu_debug.compile")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = TinyLM().to("tpu")
    forward = tpu_debug.compile(model) if args.compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE)
    losses = []
    for step in range(args.steps):
        inputs, labels = batch(step, args.bucket)
        inputs, labels = inputs.to("tpu"), labels.to("tpu")
        opt.zero_grad()
        logits = forward(inputs)
        loss = loss_fn(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    history = torch.stack(losses).cpu()  # one transfer after the loop
    print(f"{args.steps} steps, loss {history[0]:.3f} -> {history[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
