"""A Llama forward at a size this machine cannot hold, for a dry run on a TPU target.

The defaults are a 3 GB bfloat16 model (hidden 4096, vocabulary 128000, 2 layers, batch
8 x 64 tokens): run it with tensors that hold no data, every program compiled for the
TPU, nothing executed:

    tpu-debug run --target v6e --dry-run examples/dry_run_llama.py
    tpu-debug run --target v5e --dry-run examples/dry_run_llama.py --layers 4 --batch 16

The model is built on the `tpu` device, so under a dry run its parameters hold no host
memory either. Run without ``--dry-run`` only at small sizes (``--hidden 64 --vocab 256``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import tpu_debug  # noqa: F401 - registers the tpu device

if __package__ in (None, ""):  # run as a script: make the repository's `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128_000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = parser.parse_args(argv)
    config = LlamaConfig(vocab=args.vocab, hidden=args.hidden, intermediate=args.hidden * 7 // 2,
                         layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, max_seq=args.seq)
    with torch.device("tpu"):
        model = TinyLlama(config).to(getattr(torch, args.dtype))
    tokens = torch.zeros(args.batch, args.seq, dtype=torch.long, device="tpu")
    with torch.no_grad():
        logits = model(tokens)
    count = sum(p.numel() for p in model.parameters())
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"Llama forward: {count} parameters ({size / 1e9:.2f} GB), logits {tuple(logits.shape)} {logits.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
