"""Will a model train on a TPU slice? Its step compiled for it: per-chip HBM, collectives, estimates."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NOT_FIT = 3  # the step does not fit (or the compiler refused it); 1 is a usage or model error


def _override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give FIELD=VALUE, e.g. num_hidden_layers=2")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a preset (llama3-8b, llama3-70b, llama2-70b, mixtral-8x7b, gemma2-9b, "
                        "tiny-llama) or a Hugging Face "
                        "config.json path; nothing is downloaded and no weights are made")
    parser.add_argument("--target", default="v5e-8",
                        help="the TPU slice (v5e-8, v6e-256, v5p-128; default v5e-8)")
    parser.add_argument("--plan", default="fsdp", help="mesh axes: fsdp, dp, tp, or sized as fsdp=4,tp=2 "
                        "(default: fsdp over every chip)")
    parser.add_argument("--batch", type=int, default=8, help="global batch in sequences (default 8)")
    parser.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--job", choices=("train", "forward", "prefill", "decode"), default="train",
                        help="train: forward, loss, backward, AdamW (default); forward: the forward only; "
                             "prefill: the forward over seq tokens filling a static KV cache; decode: one "
                             "token per sequence attending to a KV cache of seq positions")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the parameters' dtype (AdamW's state is kept in it)")
    parser.add_argument("--set", dest="overrides", type=_override, action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="change a config field (repeatable): --set num_hidden_layers=2")
    parser.add_argument("--optimization-level", choices=("O0", "O1", "O2", "O3"), default=None,
                        help="XLA's effort level (default: the compiler's; O0 compiles big steps faster)")
    parser.add_argument("--shard-activations", action="store_true",
                        help="constrain every activation whose first dimension is the batch to be split "
                        "over the batch axes (off: only the embeddings' output is)")
    parser.add_argument("--layers", choices=("loop", "unrolled"), default=None,
                        help="a training step's decoder layers: loop, one loop over their stacked "
                        "parameters (fast; the default above 4 identical layers); unrolled, every layer "
                        "compiled in line, as torch.compile of the step does (slow for big models)")
    parser.add_argument("--remat", action="store_true",
                        help="activation checkpointing: each decoder layer keeps only its input for the "
                        "backward and recomputes the rest")
    parser.add_argument("--chunked-loss", action="store_true",
                        help="the head's logits, cross-entropy and their gradients a chunk of positions at a "
                        "time (a fused linear cross-entropy: the logits never whole; the looped step)")
    parser.add_argument("--remat-policy", choices=("matmuls", "full", "all-matmuls", "offload", "maxtext"), default=None,
                        help="what each decoder layer keeps for the backward: matmuls, its weight matmuls' "
                        "outputs (default); full, only its input (as --remat); all-matmuls, the attention's "
                        "scores too; offload, its matmul outputs in host memory; maxtext, its input and the attention's "
                        "q/k/v in host memory, the rest recomputed, as MaxText trains Llama 3.1 on v6e (the "
                        "looped step)")
    parser.add_argument("--attention", choices=("blocked", "flash", "splash"), default=None,
                        help="the looped step's attention: blocked (a block of queries at a time, the "
                        "default), flash (flash attention's backward, blocks in order) or splash (JAX's Pallas TPU "
                        "splash attention kernel: queries and keys blocked, causal blocks skipped)")
    parser.add_argument("--master-dtype", choices=("float32",), default=None,
                        help="mixed precision: parameters and AdamW state kept in float32, cast to --dtype "
                        "where read (the looped step)")
    parser.add_argument("--search", choices=("slice", "batch"), default=None,
                        help="compile candidates: slice, the smallest slice of --target's generation "
                        "that fits --batch; batch, the largest batch (doubling from --batch) that "
                        "fits --target")
    parser.add_argument("--with-remat", action="store_true",
                        help="with --search: also compile each candidate with activation checkpointing")
    parser.add_argument("--fixes", action="store_true",
                        help="when the step does not fit: compile it with each change that could make it "
                        "fit (a chunked loss, activations offloaded to host memory, activation "
                        "checkpointing, bfloat16, the next slice, half the batch) and list those that fit, "
                        "the recommended first, each with the PyTorch change it means")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--logdir", default=None,
                        help="where the answer is kept as a run "
                        "(default: TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument("--name", default=None, help="the run's name (default: fit-MODEL-TARGET)")
    parser.add_argument("--no-record", dest="record", action="store_false",
                        help="print the answer only; keep no run (a --search keeps every candidate, the recommended one "
                        "last)")


def options_of(args: argparse.Namespace) -> Any:
    """The ``FitOptions`` the flags ask for (checked as made; ``--search`` varies its target,
    batch or remat; ``--json`` echoes them as ``"options"``)."""
    from tpu_debug.fit import FitOptions  # deferred: entry: fit compiles with torch and jax

    return FitOptions(
        target=args.target, plan=args.plan, batch=args.batch, seq=args.seq, job=args.job, dtype=args.dtype,
        overrides=dict(args.overrides), shard_activations=args.shard_activations,
        optimization_level=args.optimization_level,
        loop=None if args.layers is None else args.layers == "loop", remat=args.remat,
        master_dtype=args.master_dtype, loss="chunked" if args.chunked_loss else "plain",
        remat_policy=args.remat_policy, attention=args.attention or "blocked",
    )


def run(args: argparse.Namespace) -> int:
    # the function by its module: importing tpu_debug.fit binds the package's ``fit`` to the module.
    # Imported here, as in each verb below: fit imports torch and jax, and every verb's CLI module is imported
    from tpu_debug.fit import fit, search  # deferred: entry: fit compiles with torch and jax

    options = options_of(args)
    if args.search:
        keywords = options.keywords()
        found = search(args.model, args.search, keywords.pop("target"), with_remat=args.with_remat, **keywords)
        if args.json:
            json.dump({"question": found.question, "options": options.to_dict(),
                       "best": found.best and found.best.to_dict(),
                       "candidates": [r.to_dict() for r in found.candidates]}, sys.stdout, indent=1)
            print()
        else:
            print(found.render())
        if args.record and found.candidates:
            from tpu_debug.fit import record_search  # deferred: entry: fit compiles with torch and jax

            run_dir = record_search(found, logdir=args.logdir, name=args.name)
            print(f"\nrun saved in {run_dir} (tpu-debug report {run_dir})", file=sys.stderr)
        return 0 if found.best else NOT_FIT
    keywords = options.keywords()
    report = fit(args.model, keywords.pop("target"), **keywords)
    found_fixes = None
    if args.fixes and report.fits is False:
        from tpu_debug.fit import fixes  # deferred: entry: fit compiles with torch and jax

        found_fixes = fixes(args.model, options.target, **keywords)
    if args.json:
        data = {**report.to_dict(), "options": options.to_dict()}
        if found_fixes is not None:
            code = dict(zip((what for what, _ in found_fixes.tried), found_fixes.code))
            data["fixes"] = [{"change": what, "pytorch": code.get(what), **r.to_dict()}
                             for what, r in found_fixes.tried]
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        print(report.render(fixes_hint=found_fixes is None))
        if found_fixes is not None:
            print(found_fixes.render())
    if args.record:
        from tpu_debug.fit import record_fit  # deferred: entry: fit compiles with torch and jax

        run_dir = record_fit(report, logdir=args.logdir, name=args.name, fixes=found_fixes)
        print(f"\nrun saved in {run_dir} (tpu-debug report {run_dir})", file=sys.stderr)
    # a step that does not fit is an answer, but a script asking "does it fit?" reads the status
    return 0 if report.fits else NOT_FIT
