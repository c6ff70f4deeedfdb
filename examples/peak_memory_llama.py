"""A Llama training step too big for one TPU chip, for a dry run: what holds its peak, and what to change.

The defaults are a float32 Llama (hidden 2048, 4 layers, a 128,000-token vocabulary: 0.74 B
parameters) trained with AdamW on 8 sequences of 1024 tokens. Its step needs more than the
15.75 GiB of a v5e chip: the parameters, their gradients and AdamW's two moments (four copies,
float32), the logits over the vocabulary and their gradient, and what each layer keeps for the
backward. A dry run compiles every program for the TPU and nothing executes, so it answers on
any machine:

    tpu-debug run --dry-run --target v5e-8 examples/peak_memory_llama.py --mode compiled
    tpu-debug run --dry-run --target v5e-8 examples/peak_memory_llama.py --mode eager
    tpu-debug run --dry-run --target v5e-8 --eager-mode defer_and_fuse examples/peak_memory_llama.py

The report's **Peak buffers** names the largest buffers at the peak with their lines and kinds,
and the advisor's finding the remedy for the largest kind. ``--bf16`` keeps the parameters and
the optimizer's state in bfloat16, ``--batch`` and ``--seq`` change the tokens a step trains on.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import tpu_debug

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.tiny_llama import LlamaConfig, TinyLlama


def whole_loss(model, tokens):
    logits = model(tokens[:, :-1])  # the forward: the logits are [batch, seq, vocabulary]
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def _chunk_loss(head, hidden, labels):
    return F.cross_entropy(head(hidden).float(), labels, reduction="sum")


def chunked_loss(model, tokens, chunk: int = 1024):
    """The same loss a chunk of positions at a time, each chunk's logits recomputed in the
    backward (torch.utils.checkpoint): no [tokens, vocabulary] logits exist whole."""
    hidden = model.hidden(tokens[:, :-1]).flatten(0, 1)
    labels = tokens[:, 1:].flatten()
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk):
        total = total + checkpoint(_chunk_loss, model.lm_head, hidden[start:start + chunk],
                                   labels[start:start + chunk], use_reentrant=False)
    return total / labels.numel()


def train_step(model, opt, tokens, loss_of=whole_loss):
    loss = loss_of(model, tokens)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), default="compiled",
                        help="compiled: the whole step as one program (tpu_debug.compile)")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128_000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--bf16", action="store_true", help="parameters and optimizer state in bfloat16")
    parser.add_argument("--chunked-loss", action="store_true",
                        help="the loss a chunk of positions at a time, no whole logits")
    args = parser.parse_args(argv)
    config = LlamaConfig(vocab=args.vocab, hidden=args.hidden, intermediate=args.hidden * 7 // 2,
                         layers=args.layers, heads=args.hidden // 128, kv_heads=args.hidden // 512,
                         max_seq=args.seq + 1)
    with torch.device("tpu"):
        model = TinyLlama(config).to(torch.bfloat16 if args.bf16 else torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.zeros(args.batch, args.seq + 1, dtype=torch.long, device="tpu")
    step = functools.partial(train_step, loss_of=chunked_loss if args.chunked_loss else whole_loss)
    step = tpu_debug.compile(step) if args.mode == "compiled" else step
    step(model, opt, tokens)
    size = sum(p.numel() for p in model.parameters())
    print(f"one training step of a {size / 1e9:.2f} B-parameter Llama ({args.mode}), batch {args.batch} x {args.seq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
