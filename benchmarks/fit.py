"""`tpu-debug fit` on real model sizes: wall time and peak host memory of each answer.

    python benchmarks/fit.py                 # the whole table
    python benchmarks/fit.py --only 8b-v5e-8,mixtral
    python benchmarks/fit.py --level default # the compiler's default effort instead of O0

Each answer is ``tpu-debug fit ... --no-record --json`` in a fresh process, with its own
empty target-cache directory (``$TPU_DEBUG_TARGET_CACHE``), so nothing comes from an
earlier compile. Wall time is the parent's clock around the child; peak RSS is that
child's own ``ru_maxrss``, from ``os.wait4`` (``getrusage(RUSAGE_CHILDREN)`` would give
the largest of all children so far). The 1-minute load average is the larger of the
figures before and after each answer: the machine may be shared, and a loaded machine
slows the one-thread TPU compile. Needs libtpu.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30

# name: (model, slice, plan, global batch, seq, extra flags); batch = sequences per chip x chips
CASES = {
    "8b-v5e-8": ("llama3-8b", "v5e-8", "fsdp", 8, 2048, ()),
    "8b-v5e-64": ("llama3-8b", "v5e-64", "fsdp", 64, 2048, ()),
    "8b-v5e-64-remat": ("llama3-8b", "v5e-64", "fsdp", 64, 2048, ("--remat",)),
    "8b-v6e-256": ("llama3-8b", "v6e-256", "fsdp", 256, 2048, ()),
    "8b-v6e-256-8k": ("llama3-8b", "v6e-256", "fsdp", 256, 8192, ("--remat",)),
    "70b-v6e-256": ("llama3-70b", "v6e-256", "fsdp", 256, 2048, ("--remat",)),
    "70b-v5p-128": ("llama3-70b", "v5p-128", "fsdp", 64, 2048, ("--remat",)),  # 64 chips
    "mixtral": ("mixtral-8x7b", "v6e-64", "fsdp", 64, 2048, ("--remat",)),
}


def _answer(model, target, plan, batch, seq, extra, level):
    cmd = [str(Path(sys.executable).with_name("tpu-debug")), "fit", model, "--target", target, "--plan", plan,
           "--batch", str(batch), "--seq", str(seq), "--no-record", "--json", *extra]
    if level != "default":
        cmd += ["--optimization-level", level]
    with tempfile.TemporaryDirectory(prefix="fit-bench-cache-") as cache:
        env = {**os.environ, "TPU_DEBUG_TARGET_CACHE": cache}
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                                text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out, err = proc.stdout.read(), proc.stderr.read()
    load = max(load, os.getloadavg()[0])
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        report = {"error": (err or out).strip().splitlines()[-1:] or ["no output"]}
    # ru_maxrss is in KiB on Linux
    return report, wall, usage.ru_maxrss * 1024, load, os.waitstatus_to_exitcode(status)


def _row(name, case, level, report, wall, rss, load):
    model, target, plan, batch, seq, extra = case
    count = int(target.split("-")[1])
    chips = count // 2 if target.startswith(("v4", "v5p")) else count  # v4 and v5p count TensorCores
    needs = report.get("required")
    usable = report.get("capacity")
    fits = {True: "fits", False: "does NOT fit"}.get(report.get("fits"), "refused")
    mem = f"{needs / GIB:.2f} / {usable / GIB:.2f} GiB" if needs and usable else "-"
    est = report.get("estimate") or {}
    mfu = f"{100 * est['mfu']:.1f} %" if est.get("mfu") is not None else "-"
    flags = " ".join((*extra, level if level != "default" else "default effort"))
    compile_s = report.get("compile_seconds") or 0
    return (f"| {model} | {target} | {report.get('plan', plan)} ({flags}) "
            f"| {batch // chips} x {seq} per chip | {mem} | {fits} | {mfu} | {wall:.0f} | {compile_s:.0f} "
            f"| {rss / 1e9:.2f} | {load:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated case names: " + ", ".join(CASES))
    parser.add_argument("--level", default="O0", help="optimization level (O0 ... O3, or 'default')")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CASES)
    print("| model | slice | plan | batch x seq | per chip: needs / usable | fits | MFU (estimate) "
          "| wall s | TPU compile s | peak RSS GB | load avg |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        case = CASES[name]
        report, wall, rss, load, code = _answer(*case, args.level)
        print(_row(name, case, args.level, report, wall, rss, load), flush=True)
        if code not in (0, 3):
            print(f"<!-- {name}: exit {code}: {report.get('error')} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
