"""Pitfall: a model's training step that does not fit the TPU slice asked for.

A Llama-shaped model with a 262,144-token vocabulary at width 4096 holds 2.2
billion parameters, nearly all in its embedding and output layer. Trained with
AdamW in bfloat16, its parameters, gradients and the optimizer's two moments
need about 17 GiB, over the 15.75 GiB XLA gives a program on one v5e chip.
``tpu_debug.fit`` compiles the step for the slice with XLA's TPU compiler (no
weights, no TPU needed) and says so; ``record_fit`` keeps the answer in the
run, where the advisor's ``fit_oom`` finding reads it. ``--fixed`` asks for
a v5e-8 with the parameters and optimizer state split over its 8 chips (FSDP),
which fits.

    python examples/pitfalls/fit_oom.py [--fixed]
    tpu-debug run examples/pitfalls/fit_oom.py [--fixed]
"""

from __future__ import annotations

import argparse
import sys

from transformers import LlamaConfig

import tpu_debug
from tpu_debug.fit import record_fit

CONFIG = LlamaConfig(vocab_size=262144, hidden_size=4096, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="a v5e-8 with FSDP over its 8 chips")
    args = parser.parse_args(argv)
    target, plan = ("v5e-8", "fsdp") if args.fixed else ("v5e-1", "dp")
    report = tpu_debug.fit(CONFIG, target, plan=plan, batch=8, seq=512)
    print(report.render())
    record_fit(report)  # joins the run of tpu-debug run (or makes one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
