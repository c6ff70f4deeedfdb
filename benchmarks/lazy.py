"""Lazy fused eager mode: training steps in eager op by op (``DEFER_NEVER``), eager
fused (``DEFER_AND_FUSE``) and compiled, measured in this one process.

    python benchmarks/lazy.py [--repeat 20] [--rows mlp-train,llama-train]

The models, batches and the compiled "step" style are benchmarks/compiled.py's: tiny
Llama (hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads, vocab 256; batch
1, seq 32) and an MLP (256 -> 512 -> 512 -> 10, batch 64), each trained with AdamW
(``capturable=True`` everywhere, so the step counts live on the device in every
variant). The same eager training step runs op by op and fused; the fused one
runs as one program per step, cut by the end of ``optimizer.step()``. Every variant
is checked against PyTorch CPU (first loss, parameters after one step) before it
is timed, and the fused programs compiled while timing are counted: a training
loop's steps must find theirs in the cache.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.runtime import lazy
from tpu_debug.runtime.tensor import to_jax

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama

FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE
NEVER = torch.tpu.EagerMode.DEFER_NEVER
BASE = "tpu eager op by op"


def _sync(out):
    if out.device.type != "tpu":  # PyTorch's own CPU step: done when it returns
        return out
    lazy.computed(out)
    to_jax(out).block_until_ready()
    return out


def _time_all(variants: dict, repeat: int, calls: int = 5) -> dict[str, float]:
    """Median ms per call of each variant ``{name: fn}`` (wall and process CPU time), and
    per variant the median over rounds of (op-by-op wall time / its wall time). Interleaved rounds, the order rotating; a
    sample is ``calls`` calls and one sync, as a training loop runs them."""
    names = list(variants)
    for fn in variants.values():
        for _ in range(3):
            _sync(fn())
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = variants[name]
            time.sleep(0.02)  # let the previous variant's worker threads go idle
            for _ in range(2):
                _sync(fn())
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls - 1):
                fn()
            _sync(fn())
            samples[name].append((time.perf_counter() - start) / calls)
            cpu[name].append((time.process_time() - start_cpu) / calls)
    result = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
    # CPU time (all of the process's threads: ours, XLA's) holds when other jobs share the
    # machine and stretch the wall time
    result.update({"cpu " + n: statistics.median(v) * 1e3 for n, v in cpu.items()})
    for n, v in samples.items():
        result["x " + n] = statistics.median(b / x for b, x in zip(samples[BASE], v))
    return result


PHASES = ("forward+loss", "backward", "optimizer step", "sync")


def _phases(parts, mode, repeat: int) -> dict[str, float]:
    """Median thread CPU ms of each part of a step (``parts()`` yields at the end of each)
    in eager ``mode``: what recording costs in the forward pass, in autograd's backward
    pass, in the optimizer."""
    samples: dict[str, list[float]] = {p: [] for p in PHASES}
    with torch.tpu.set_eager_mode(mode):
        for i in range(3 + 5 * repeat):
            it = parts()
            next(it)  # zero_grad
            last = time.thread_time()
            for phase in PHASES:
                next(it)
                now = time.thread_time()
                if i >= 3:
                    samples[phase].append((now - last) * 1e3)
                last = now
    return {p: statistics.median(v) for p, v in samples.items()}


def train_steps(make, batch, loss_fn, repeat: int) -> dict[str, float]:
    cpu = make()
    x, y = batch
    xd, yd = x.to("tpu"), y.to("tpu")

    def eager_step(model, opt, x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def eager_step_parts(model, opt, x, y):
        # the step's parts, each ended by a mark: where its host time goes
        yield opt.zero_grad()
        loss = loss_fn(model(x), y)
        yield
        loss.backward()
        yield
        opt.step()  # lazy mode: the graph runs at its end (the optimizer hook)
        yield
        _sync(loss)
        yield

    def on_tpu():
        model = copy.deepcopy(cpu).to("tpu")
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    never_model, never_opt = on_tpu()
    fuse_model, fuse_opt = on_tpu()
    comp_model, comp_opt = on_tpu()

    def op_by_op():
        with torch.tpu.set_eager_mode(NEVER):
            return eager_step(never_model, never_opt, xd, yd)

    def fused():
        with torch.tpu.set_eager_mode(FUSE):
            return eager_step(fuse_model, fuse_opt, xd, yd)

    def fwd_bwd(x, y):
        loss = loss_fn(comp_model(x), y)
        loss.backward()
        return loss.detach()

    fwd_bwd_c = tpu_debug.compile(fwd_bwd)
    step_c = tpu_debug.compile(comp_opt.step)

    def compiled():
        with torch.tpu.set_eager_mode(NEVER):
            comp_opt.zero_grad()
            loss = fwd_bwd_c(xd, yd)
            step_c()
            return loss

    ref_model = copy.deepcopy(cpu)
    reference = eager_step(ref_model, torch.optim.AdamW(ref_model.parameters(), lr=1e-3), x, y).item()
    for step, model in ((op_by_op, never_model), (fused, fuse_model), (compiled, comp_model)):
        torch.testing.assert_close(step().item(), reference, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-4)  # AdamW: lr 1e-3 per step
    result = _time_all({BASE: op_by_op, "tpu eager fused": fused, "tpu compiled step": compiled}, repeat)
    result["phases"] = {mode.name: _phases(lambda m=model, o=opt: eager_step_parts(m, o, xd, yd), mode, repeat)
                        for mode, model, opt in ((NEVER, never_model, never_opt), (FUSE, fuse_model, fuse_opt))}
    # the same parts in PyTorch's own CPU eager mode, on one thread (its compute included, tiny
    # here): what PyTorch's dispatcher, autograd and the model's Python cost per step before
    # any device records anything
    cpu_opt = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result["phases"]["torch CPU eager, one thread"] = _phases(lambda: eager_step_parts(cpu, cpu_opt, x, y), NEVER, repeat)
    finally:
        torch.set_num_threads(threads)
    # the timed fused steps after warm-up: how many programs their graphs needed
    before = {(e["name"], e["ops"]) for e in lazy.fused_stats()}
    heard = []
    for _ in range(3):
        fused()
        heard.append(lazy.fused_stats())
    result["fused programs"] = len({(e["name"], e["ops"]) for e in heard[-1]} - before)
    ops = [e["ops"] for e in heard[-1] if e["calls"] >= 3]
    result["ops per fused program"] = max(ops) if ops else 0
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rows", default="mlp-train,llama-train",
                        help="comma-separated subset of: mlp-train, llama-train")
    args = parser.parse_args(argv)
    wanted = set(args.rows.split(","))
    cfg = LlamaConfig()

    def make_mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def make_llama():
        torch.manual_seed(0)
        return TinyLlama(cfg)

    torch.manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (1, 33))

    def llama_loss(logits, target):
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), target.reshape(-1))

    rows = {}
    if "mlp-train" in wanted:
        rows["MLP train step (fwd+bwd+AdamW)"] = train_steps(
            make_mlp, (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy, args.repeat
        )
    if "llama-train" in wanted:
        rows["tiny-Llama train step (fwd+bwd+AdamW)"] = train_steps(
            make_llama, (tokens[:, :-1], tokens[:, 1:]), llama_loss, args.repeat
        )
    print("| workload | eager op by op (ms) | eager fused (ms) | compiled step (ms) | fused speed-up "
          "| compiled speed-up | fused / compiled | CPU ms: op by op / fused / compiled "
          "| CPU: fused speed-up | CPU: fused / compiled | ops per fused program |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        fused_vs_compiled = r["x tpu compiled step"] / r["x tpu eager fused"]
        c_never, c_fused, c_comp = r["cpu " + BASE], r["cpu tpu eager fused"], r["cpu tpu compiled step"]
        print(f"| {name} | {r[BASE]:.2f} | {r['tpu eager fused']:.2f} | {r['tpu compiled step']:.2f} "
              f"| {r['x tpu eager fused']:.2f}x | {r['x tpu compiled step']:.2f}x | {fused_vs_compiled:.2f}x "
              f"| {c_never:.1f} / {c_fused:.1f} / {c_comp:.1f} | {c_never / c_fused:.2f}x "
              f"| {c_fused / c_comp:.2f}x | {r['ops per fused program']} |")
        if r["fused programs"]:
            print(f"  ! {name}: {r['fused programs']} fused programs compiled after warm-up")
    for name, r in rows.items():
        for mode, ph in r["phases"].items():
            parts = ", ".join(f"{p} {v:.2f}" for p, v in ph.items())
            print(f"  {name}, {mode}: thread CPU ms per part: {parts} (total {sum(ph.values()):.2f})")
    print("\nms: median per step; speed-ups: median over rounds of op-by-op time / the column's; "
          "fused / compiled: the fused step's time over the compiled step's")
    print(f"\nload average {' '.join(f'{v:.1f}' for v in os.getloadavg())} (2 CPUs)")


if __name__ == "__main__":
    main()
