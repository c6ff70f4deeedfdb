"""What a TPU target costs a traced run: the same training traced without and with ``target="v5e"``.

    python benchmarks/target_trace.py [--repeat 3] [--workloads mlp llama]

Every measurement is a fresh process (nothing compiled, libtpu not loaded), timed
from the trace's start to its end, the end included: with a target, that is where
the trace waits for the target compiles still running. Per workload and repeat:

- ``off``: traced without a target (the baseline, in its own fresh process);
- ``first``: traced with ``target="v5e"`` and an empty target cache: every distinct
  program is compiled by XLA's TPU compiler on its worker thread, beside the run;
- ``rerun``: the same again with the cache the first run filled: the TPU
  compiler's results are read back, not recomputed.

Ratios are against ``off`` of the same repeat (wall time, and CPU time of the
whole process: the target compiler's threads count). Workloads:

- ``mlp``: examples/mlp_train.py's training (16 -> 64 -> 64 -> 4 MLP, batch 256),
  ``--mlp-steps`` steps with SGD, then as many with Adam, eager;
- ``llama``: the tiny Llama of examples/models/tiny_llama.py (hidden 64, 2 layers,
  vocab 256), batch 4 x 32 tokens, next-token cross entropy, AdamW,
  ``--llama-steps`` steps, eager.

Needs libtpu.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import os, sys, time
sys.path.insert(0, {root!r})
workload, target, steps, logdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import torch
import tpu_debug

def mlp():
    from examples.mlp_train import train
    for optimizer in ("sgd", "adam"):
        train("tpu", optimizer, steps)

def llama():
    import torch.nn.functional as F
    from examples.models.tiny_llama import LlamaConfig, TinyLlama
    cfg = LlamaConfig()
    torch.manual_seed(0)
    model = TinyLlama(cfg).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab, (4, 33)).to("tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.stack(losses).cpu()

run = {{"mlp": mlp, "llama": llama}}[workload]
options = {{"target": target, "target_wait": 3600.0}} if target != "off" else {{}}
wall, cpu = time.perf_counter(), time.process_time()
with tpu_debug.trace(logdir=logdir, **options) as session:
    run()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
summary = session.events("target_summary")
s = summary[0] if summary else None
print("RESULT", wall, cpu, s.programs if s else 0, s.cached if s else 0, s.unfinished if s else 0,
      s.compile_seconds if s else 0.0, s.waited_seconds if s else 0.0, len(session.programs(mode="eager")))
"""


def _child(workload: str, target: str, steps: int, cache: str, logdir: str) -> dict[str, float]:
    env = dict(os.environ, TPU_DEBUG_TARGET_CACHE=cache)
    code = _CHILD.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, workload, target, str(steps), logdir], env=env,
                          capture_output=True, text=True, timeout=7200, cwd=ROOT, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"{workload}/{target} failed:\n{done.stderr[-4000:]}")
    wall, cpu, programs, cached, unfinished, compile_s, waited, local = (float(v) for v in line.split()[1:])
    return {"wall": wall, "cpu": cpu, "programs": programs, "cached": cached, "unfinished": unfinished,
            "compile": compile_s, "waited": waited, "local": local}


def measure(workload: str, steps: int, repeat: int) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {"off": [], "first": [], "rerun": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as logdir:
            out["off"].append(_child(workload, "off", steps, cache, logdir))
            out["first"].append(_child(workload, "v5e", steps, cache, logdir))
            out["rerun"].append(_child(workload, "v5e", steps, cache, logdir))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=["mlp", "llama"], choices=["mlp", "llama"])
    parser.add_argument("--mlp-steps", type=int, default=100)
    parser.add_argument("--llama-steps", type=int, default=10)
    args = parser.parse_args(argv)
    steps = {"mlp": args.mlp_steps, "llama": args.llama_steps}
    print(f"target v5e; {args.repeat} repeat(s), each run a fresh process; medians")
    print("| workload | run | wall | ratio (wall) | CPU | ratio (CPU) | programs (cached) | TPU compile | waited at end |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for workload in args.workloads:
        runs = measure(workload, steps[workload], args.repeat)
        for kind in ("off", "first", "rerun"):
            rows = runs[kind]
            wall = statistics.median(r["wall"] for r in rows)
            cpu = statistics.median(r["cpu"] for r in rows)
            ratio_w = statistics.median(r["wall"] / o["wall"] for r, o in zip(rows, runs["off"]))
            ratio_c = statistics.median(r["cpu"] / o["cpu"] for r, o in zip(rows, runs["off"]))
            r = rows[len(rows) // 2]
            programs = "-" if kind == "off" else f"{r['programs']:.0f} ({r['cached']:.0f})"
            compile_s = "-" if kind == "off" else f"{statistics.median(x['compile'] for x in rows):.1f} s"
            waited = "-" if kind == "off" else f"{statistics.median(x['waited'] for x in rows):.1f} s"
            print(f"| {workload} ({steps[workload]} steps, {r['local']:.0f} programs) | {kind} | {wall:.1f} s | "
                  f"{ratio_w:.2f}x | {cpu:.1f} s | {ratio_c:.2f}x | {programs} | {compile_s} | {waited} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
