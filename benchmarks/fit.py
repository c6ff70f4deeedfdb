"""`tpu-debug fit` on real model sizes: the answer, its wall time and the host memory it took.

Each answer is a fresh process (`python -m tpu_debug fit ... --json --no-record`) with
its own empty TPU-target cache, so every program is compiled; its wall time, CPU time
(user + system) and peak resident memory (`os.wait4`'s rusage of that child) are the
figures. Prints a markdown table; paste it into benchmarks/README.md with the load
average it prints.

    python benchmarks/fit.py                 # the large configurations, XLA's default effort
    python benchmarks/fit.py --quick         # the same at O0 (faster, figures higher)
    python benchmarks/fit.py --maxtext       # MaxText's published configurations (docs/fit.md)
    python benchmarks/fit.py --only 70b      # rows whose label contains "70b"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

# label, model, slice, plan, global batch, seq, options
LARGE = (
    ("llama3-8b v5e-8 fsdp", "llama3-8b", "v5e-8", "fsdp", 8, 2048, ("--remat",)),
    ("llama3-8b v5e-64 fsdp", "llama3-8b", "v5e-64", "fsdp", 64, 2048, ()),
    ("llama3-8b v5e-64 fsdp ", "llama3-8b", "v5e-64", "fsdp", 64, 2048, ("--remat",)),
    ("llama3-8b v6e-256 fsdp", "llama3-8b", "v6e-256", "fsdp", 256, 2048, ()),
    ("llama3-70b v6e-256 fsdp", "llama3-70b", "v6e-256", "fsdp", 256, 2048, ("--remat",)),
    ("mixtral-8x7b v6e-256 fsdp", "mixtral-8x7b", "v6e-256", "fsdp", 256, 2048, ("--remat",)),
)

@dataclasses.dataclass(frozen=True)
class MaxTextRow:
    """One of MaxText's measured runs and our answer's options for the same step.

    ``options`` name every choice of our step (the CLI's flags); ``maxtext`` says MaxText's
    choices for the run, from its config (``benchmarks/maxtext_*_model_configs.py`` at
    maxtext e591f30c); ``mfu`` is its measured MFU (``docs/reference/models/tiering.md``).
    """

    label: str
    model: str
    target: str
    per_chip: int  # sequences per chip (MaxText's per_device_batch_size)
    seq: int
    options: tuple[str, ...]
    maxtext: str
    mfu: float

    @property
    def batch(self) -> int:
        return self.per_chip * int(self.target.rsplit("-", 1)[1])


# MaxText's runs: pure FSDP (ici_fsdp_parallelism=-1), float32 weights (its default
# weight_dtype) with bfloat16 compute. Each row asks for the closest of our options to its
# choices; a choice we do not model is said in ``maxtext``. An option this tool does not
# have yet makes the row print the CLI's error: the row is kept, to run when it does.
MAXTEXT = (
    MaxTextRow("llama3.1-8b", "llama3-8b", "v6e-256", 4, 8192,
               ("--master-dtype", "float32", "--attention", "splash", "--remat-policy", "maxtext",
                "--chunked-loss"),
               "llama3_1_8b_8192: remat custom (decoder_layer_input, query/key/value/out_proj offloaded to "
               "host, the rest recomputed), splash attention blocks 2048, whole logits; ours offloads the "
               "layer input and q/k/v (k and v with their 8 heads, as MaxText's; not out_proj) and chunks "
               "the loss", 0.4546),
    MaxTextRow("llama3.1-8b whole logits", "llama3-8b", "v6e-256", 4, 8192,
               ("--master-dtype", "float32", "--attention", "splash", "--remat-policy", "maxtext"),
               "as above with the logits whole, as MaxText's config keeps them", 0.4546),
    MaxTextRow("llama3.1-70b", "llama3-70b", "v6e-256", 5, 8192,
               ("--master-dtype", "float32", "--attention", "splash", "--remat-policy", "maxtext",
                "--chunked-loss"),
               "llama3_1_70b_8192: remat custom (decoder_layer_input, query/key/value_proj offloaded), splash "
               "attention blocks 2048; ours offloads the same (k and v with their 8 heads, as MaxText's); "
               "the chunked loss is ours", 0.5033),
    MaxTextRow("llama2-70b", "llama2-70b", "v5p-512", 2, 4096,
               ("--master-dtype", "float32", "--remat"),
               "llama2_70b_v5p_128: remat save_dot_except_mlpwi (the matmul outputs kept but the MLP's input "
               "projections', which are recomputed), attention autoselected; ours keeps less (--remat): our "
               "matmuls policy keeps the MLP's too and needs at least 251.21 GiB", 0.654),
    MaxTextRow("mixtral-8x7b", "mixtral-8x7b", "v6e-256", 12, 4096,
               ("--master-dtype", "float32", "--remat", "--attention", "flash"),
               "mixtral_8x7b_dropless: remat full, splash attention, megablox grouped matmuls, dropless "
               "(tiering.md's Silver row, 35.23 %, names the tpu-recipes run; this is the config of that model "
               "at that batch and sequence in maxtext_trillium_model_configs.py)", 0.3523),
)


def answer(model: str, target: str, plan: str, batch: int, seq: int, options: tuple, quick: bool) -> dict:
    """One answer in a fresh process with an empty target cache: its JSON, wall time, peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TPU_DEBUG_TARGET_CACHE=os.path.join(tmp, "cache"))
        cmd = [sys.executable, "-m", "tpu_debug", "fit", model, "--target", target, "--plan", plan,
               "--batch", str(batch), "--seq", str(seq), "--json", "--no-record", *options]
        if quick:
            cmd += ["--optimization-level", "O0"]
        with open(os.path.join(tmp, "out"), "w+") as out, open(os.path.join(tmp, "err"), "w+") as err:
            start = time.perf_counter()
            child = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
            _, _, usage = os.wait4(child.pid, 0)  # this child's own rusage (peak RSS in KiB)
            wall = time.perf_counter() - start
            out.seek(0)
            err.seek(0)
            text, errors = out.read(), err.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = {"error": (errors.strip().splitlines() or ["no output"])[-1]}
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024, "data": data}


def _row(spec: tuple, quick: bool) -> str:
    label, model, target, plan, batch, seq, options = spec
    load = os.getloadavg()[0]
    got = answer(model, target, plan, batch, seq, options, quick)
    load = max(load, os.getloadavg()[0])  # the machine may be shared: a load stretches the wall time
    d = got["data"]
    head = f"| {label} | {batch} x {seq} | {' '.join(options) or '-'} |"
    # CPU seconds beside the wall time: another job on the machine stretches the wall, not the CPU
    tail = f"{got['wall']:.0f} s | {got['cpu']:.0f} s | {got['rss'] / 1e9:.1f} GB | {load:.1f} |"
    if "required" not in d:
        return f"{head} error: {d.get('error')} | - | {tail}"
    verdict = {True: "fits", False: "does NOT fit", None: "refused"}[d["fits"]]
    needs = f"{d['required'] / 2**30:.2f} / {d['capacity'] / 2**30:.2f} GiB" if d["required"] else "-"
    mfu = d["estimate"]["mfu"] if d.get("estimate") else None
    return f"{head} {needs}: {verdict} | {'-' if mfu is None else f'{mfu:.1%}'} | {tail}"


def _gib(n) -> str:
    return f"{n / 2**30:.2f} GiB"


def _reasons(d: dict) -> str:
    """Why our answer differs from MaxText's run, read from the answer's own figures."""
    out = []
    m, e = d.get("memory"), d.get("estimate")
    if d.get("at_least"):
        out.append("stopped at its first allocation that did not fit: "
                   + " + ".join(f"{what} {_gib(n)}" for what, n in d["at_least"]))
    elif m:
        out.append(f"arguments {_gib(m['arguments'])} (parameters {_gib(m['parameters'])}, optimizer state "
                   f"{_gib(m['optimizer_state'])}), temporaries {_gib(m['temporaries'])} (gradients "
                   f"~{_gib(m['gradients'])}, activations and other ~{_gib(m['activations'])})")
    if e:
        parts = {"compute": e["compute_seconds"], "memory": e["memory_seconds"], "communication": e["comm_seconds"] or 0}
        worst = max(("compute", "memory"), key=parts.get)
        out.append(f"step ~{e['seconds']:.2f} s, {worst}-bound: compute {parts['compute']:.2f} s, memory "
                   f"{parts['memory']:.2f} s, communication {parts['communication']:.2f} s not overlapped "
                   f"({e['mfu_overlapped']:.1%} MFU if all overlapped); our model FLOPs count causal attention "
                   "whole, MaxText's newer figures halve it")
    for b in d.get("communication") or ():
        if b["bound"] and b["compiled"] > 1.5 * b["bound"]:
            top = b["shares"][0]["what"] if b["shares"] else "?"
            out.append(f"{b['kind']} {b['compiled'] / b['bound']:.1f}x its bound (mostly {top})")
    if d.get("error") and not d.get("fits"):
        out.append(f"compiler: {d['error'][:160]}")
    return "; ".join(out) or "-"


def _maxtext_row(row: MaxTextRow, quick: bool) -> str:
    load = os.getloadavg()[0]
    got = answer(row.model, row.target, "fsdp", row.batch, row.seq, row.options, quick)
    load = max(load, os.getloadavg()[0])
    d = got["data"]
    head = (f"| {row.label} | {row.target} | {row.per_chip} x {row.seq} | `{' '.join(row.options)}` | "
            f"{row.maxtext} |")
    tail = f"{got['wall']:.0f} s | {got['cpu']:.0f} s | {got['rss'] / 1e9:.1f} GB | {load:.1f} |"
    if "required" not in d:
        return f"{head} error: {d.get('error')} | - | - | {row.mfu:.2%} | - | {tail}"
    verdict = {True: "fits", False: "does not fit", None: "refused"}[d["fits"]]
    needs = (f"{'at least ' if d.get('at_least') else ''}{_gib(d['required'])} / {_gib(d['capacity'])}"
             if d["required"] else "-")
    mfu = d["estimate"]["mfu"] if d.get("estimate") else None
    return (f"{head} {verdict} | {needs} | {'-' if mfu is None else f'{mfu:.1%}'} | {row.mfu:.2%} | "
            f"{_reasons(d)} | {tail}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="compile at O0")
    parser.add_argument("--maxtext", action="store_true", help="MaxText's published configurations")
    parser.add_argument("--only", default="", help="rows whose label contains this")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"effort: {'O0' if args.quick else 'default'}")
    if args.maxtext:
        print("| model | slice | per chip | our options | MaxText's choices | fits | per chip: needs / usable "
              "| MFU, ours (estimate) | MFU, MaxText (measured) | measured reasons | wall | CPU | peak RSS | load avg |")
        print("|---|---|---|---|---|---|---|---:|---:|---|---:|---:|---:|---:|")
        for row in MAXTEXT:
            if args.only in row.label:
                print(_maxtext_row(row, args.quick), flush=True)
    else:
        print("| answer (model, slice, plan) | batch x seq | options | per chip: needs / usable | MFU (estimate) "
              "| wall | CPU | peak RSS | load avg |")
        print("|---|---|---|---|---:|---:|---:|---:|---:|")
        for spec in LARGE:
            if args.only in spec[0]:
                print(_row(spec, args.quick), flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
