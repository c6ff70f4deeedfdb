"""Does a 7B Llama in bfloat16 serve a batch of 8 on one TPU chip, and does it train there?

    python benchmarks/target_dryrun.py --target v6e --mode inference [--batch 8 --seq 2048 --layers 32]

One dry run per process (so its peak RSS is its own): the model is built under
``torch.device("meta")`` (Llama-2-7B's shape: vocab 32000, hidden 4096,
intermediate 11008, 32 layers, 32 heads, 6.74 B parameters), traced, lowered
through the runtime's op lowerings and compiled by XLA's TPU compiler for the
target. Prints the answer, the per-device memory or the out-of-memory figures,
wall and CPU seconds per phase, and the process's peak RSS. Needs libtpu.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tpu_debug  # noqa: F401 - the runtime (its lowerings) is what the dry run compiles through
from tpu_debug.fit import compile_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402

LLAMA_7B = LlamaConfig(vocab=32000, hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32,
                       max_seq=4096)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v6e")
    parser.add_argument("--mode", choices=("inference", "training"), default="inference")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=LLAMA_7B.layers)
    parser.add_argument("--optimization-level", default="O0", help="XLA effort level, O0..O3, or 'default'")
    parser.add_argument("--no-cache", action="store_true", help="compile even if the result is cached")
    args = parser.parse_args(argv)

    wall, cpu = time.perf_counter(), time.process_time()
    cfg = LlamaConfig(**{**LLAMA_7B.__dict__, "layers": args.layers})
    with torch.device("meta"):
        model = TinyLlama(cfg).to(torch.bfloat16)
    tokens = torch.empty(args.batch, args.seq, dtype=torch.long, device="meta")
    train = args.mode == "training"

    def loss(logits, labels):
        return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())

    level = None if args.optimization_level == "default" else args.optimization_level
    result = compile_step(model, (tokens,), args.target, train=train, loss_fn=loss if train else None,
                     targets=(tokens,) if train else (), cache=not args.no_cache,
                     optimization_level=level)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"Llama {cfg.layers} layers, batch {args.batch} x {args.seq} tokens, XLA {args.optimization_level}")
    print(result.render())
    cached = " (cached result)" if result.compile.cached else ""
    print(f"traced in {result.trace_seconds:.1f} s ({result.graph_nodes} aten ops); TPU compile "
          f"{result.compile.seconds:.1f} s{cached}; whole process "
          f"{wall:.1f} s wall, {cpu:.1f} s CPU; peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
