"""What divergence checking costs: the tiny-Llama forward traced with
``divergence=False`` vs ``divergence=True``, measured in this one process.

    python benchmarks/divergence.py [--repeat 7] [--steps 5]

Each repeat runs ``--steps`` forwards inside a trace without divergence and
``--steps`` inside a trace with it, the order alternating; the figure is the
median of the per-repeat ratios (wall and CPU time). Rows: eager forward
(every op also runs on CPU, local and drift), eager forward with TPU numerics
(the same, products in bfloat16 passes), and the compiled forward (a debug
variant of the program returns every node, the FX graph is interpreted on CPU).

Tiny Llama: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads,
vocab 256; batch 1, seq 32; no grad.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama


def _sync(out):
    from tpu_debug.runtime.tensor import to_jax

    to_jax(out).block_until_ready()


def _run(fn, steps: int, logdir: str, **options) -> tuple[float, float]:
    """(wall, CPU) seconds per forward inside one trace."""
    with tpu_debug.trace(logdir=logdir, hlo=False, **options):
        _sync(fn())  # warm: nothing below is a first call
        gc.collect()
        gc.disable()
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                _sync(fn())
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            gc.enable()
    return wall / steps, cpu / steps


def measure(fn, repeat: int, steps: int, logdir: str, **options) -> dict[str, float]:
    """Divergence off vs on, both with ``options`` (numerics apply to both sides)."""
    _run(fn, 1, logdir, **options)  # compile outside the timed runs
    _run(fn, 1, logdir, divergence=True, **options)
    off_w, on_w, ratios_w, ratios_c = [], [], [], []
    for r in range(repeat):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {}
        for enabled in order:
            got[enabled] = _run(fn, steps, logdir, divergence=enabled, **options)
        off_w.append(got[False][0])
        on_w.append(got[True][0])
        ratios_w.append(got[True][0] / got[False][0])
        ratios_c.append(got[True][1] / got[False][1])
    return {
        "off": min(off_w) * 1e3,
        "on": min(on_w) * 1e3,
        "ratio wall": statistics.median(ratios_w),
        "ratio cpu": statistics.median(ratios_c),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)

    cfg = LlamaConfig()
    torch.manual_seed(0)
    cpu_model = TinyLlama(cfg).eval()
    model = copy.deepcopy(cpu_model).to("tpu")
    compiled = tpu_debug.compile(copy.deepcopy(cpu_model).to("tpu"))
    tokens = torch.randint(0, cfg.vocab, (1, 32)).to("tpu")
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as logdir:
        rows.append(("eager forward", measure(lambda: model(tokens), args.repeat, args.steps, logdir)))
        rows.append(
            (
                "eager forward, numerics='tpu'",
                measure(lambda: model(tokens), args.repeat, args.steps, logdir, numerics="tpu"),
            )
        )
        rows.append(("compiled forward", measure(lambda: compiled(tokens), args.repeat, args.steps, logdir)))
    print(
        f"torch {torch.__version__}, tiny Llama forward (batch 1, seq 32), {args.repeat} x {args.steps} steps"
    )
    print("| forward | divergence off (best) | on (best) | on / off, median wall | on / off, median CPU |")
    print("|---|---:|---:|---:|---:|")
    for name, m in rows:
        print(
            f"| {name} | {m['off']:.1f} ms | {m['on']:.1f} ms | {m['ratio wall']:.2f}x | {m['ratio cpu']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
