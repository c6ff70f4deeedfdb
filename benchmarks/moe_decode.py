"""MoE decoding: a Qwen-style sparse MoE layer at batch 64 (one new token per sequence),
the experts run as a loop over experts against one grouped matmul (`torch._grouped_mm`),
eager and compiled `tpu`, measured in this one process (variants interleaved).

    python benchmarks/moe_decode.py [--repeat 15] [--experts 32] [--top-k 4] [--hidden 256]

The layer is examples/models/moe.py's ``SparseMoE``: softmax router, top-k experts with
renormalized weights, SwiGLU experts with stacked weights. Loop: per expert, the tokens
routed to it are gathered (``torch.where``: a data-dependent count), multiplied, scattered
back with ``index_add``. Grouped: token copies sorted by expert, one grouped matmul per
projection with the per-expert offsets. Figures: median ms per call (wall and CPU) and
the loop / grouped ratio per mode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.moe import MoEConfig, SparseMoE  # noqa: E402


def _sync(out):
    out.cpu()


def measure(variants: dict, repeat: int, calls: int = 3) -> dict[str, tuple[float, float]]:
    """Median (wall ms, CPU ms) per call of each variant, interleaved with a rotating order."""
    names = list(variants)
    for fn in variants.values():
        for _ in range(2):
            _sync(fn())
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = variants[name]
            _sync(fn())
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls - 1):
                fn()
            _sync(fn())
            wall[name].append((time.perf_counter() - w0) * 1e3 / calls)
            cpu[name].append((time.process_time() - c0) * 1e3 / calls)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--expert-hidden", type=int, default=128)
    args = parser.parse_args(argv)
    cfg = MoEConfig(hidden=args.hidden, expert_hidden=args.expert_hidden, experts=args.experts, top_k=args.top_k)
    torch.manual_seed(0)
    loop = SparseMoE(cfg, "loop").to("tpu").eval()
    grouped = SparseMoE(cfg, "grouped").to("tpu").eval()
    grouped.load_state_dict(loop.state_dict())
    x = torch.randn(args.batch, cfg.hidden).to("tpu")
    with torch.no_grad():
        torch.testing.assert_close(loop(x).cpu(), grouped(x).cpu(), rtol=1e-4, atol=1e-5)
        compiled_loop, compiled_grouped = tpu_debug.compile(loop), tpu_debug.compile(grouped)
        variants = {
            "eager loop": lambda: loop(x),
            "eager grouped": lambda: grouped(x),
            "compiled loop": lambda: compiled_loop(x),
            "compiled grouped": lambda: compiled_grouped(x),
        }
        t0 = time.perf_counter()
        results = measure(variants, args.repeat)
    print(f"batch {args.batch}, hidden {cfg.hidden}, expert hidden {cfg.expert_hidden}, {cfg.experts} experts, "
          f"top-{cfg.top_k}; {args.repeat} interleaved rounds in {time.perf_counter() - t0:.0f} s")
    print("| variant | median wall ms | median CPU ms |")
    print("|---|---:|---:|")
    for name, (w, c) in results.items():
        print(f"| {name} | {w:.2f} | {c:.2f} |")
    for mode in ("eager", "compiled"):
        (lw, lc), (gw, gc) = results[f"{mode} loop"], results[f"{mode} grouped"]
        print(f"{mode}: loop / grouped = {lw / gw:.2f}x wall, {lc / gc:.2f}x CPU")
    (lw, _), (gw, _) = results["eager loop"], results["compiled grouped"]
    print(f"eager loop / compiled grouped = {lw / gw:.2f}x wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
