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
# MaxText's published runs (docs/reference/models/tiering.md, benchmarks/*_model_configs.py):
# per-device batch x chips, their sequence length, float32 weights, pure FSDP, rematerialized layers
MAXTEXT = (
    ("llama3-8b v6e-256 fsdp", "llama3-8b", "v6e-256", "fsdp", 4 * 256, 8192,
     ("--remat", "--master-dtype", "float32")),
    ("llama3-70b v6e-256 fsdp", "llama3-70b", "v6e-256", "fsdp", 5 * 256, 8192,
     ("--remat", "--master-dtype", "float32")),
    ("llama2-70b v5p-512 fsdp", "llama2-70b", "v5p-512", "fsdp", 2 * 512, 4096,
     ("--remat", "--master-dtype", "float32")),
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="compile at O0")
    parser.add_argument("--maxtext", action="store_true", help="MaxText's published configurations")
    parser.add_argument("--only", default="", help="rows whose label contains this")
    args = parser.parse_args(argv)
    rows = [r for r in (MAXTEXT if args.maxtext else LARGE) if args.only in r[0]]
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"effort: {'O0' if args.quick else 'default'}")
    print("| answer (model, slice, plan) | batch x seq | options | per chip: needs / usable | MFU (estimate) "
          "| wall | CPU | peak RSS | load avg |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for spec in rows:
        print(_row(spec, args.quick), flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
