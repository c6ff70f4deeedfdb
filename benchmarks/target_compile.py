"""Target compiles: cold vs warm cache in fresh processes, and what a background compile costs the program.

    python benchmarks/target_compile.py cache      # cold / warm, JAX's persistent cache and ours
    python benchmarks/target_compile.py overhead   # eager training steps alone vs beside target compiles

``cache``: each measurement is a fresh process (so nothing is warm in memory)
compiling the same program for v6e: a small Llama's training step (2 layers,
hidden 64, batch 8 x 64; about 900 aten ops). First with JAX's persistent
compilation cache pointed at an empty directory (cold, then warm), then with
tpu_debug's target cache (cold, then warm). ``overhead``: eager training steps
of an MLP on the `tpu` device, timed alone and while the one-thread target
compiler works through compiles of the same small Llama step; ratios from one run.
Needs libtpu.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import os, sys, time, warnings
sys.path.insert(0, {root!r})
mode = sys.argv[1]
import jax
if mode == "jax":
    jax.config.update("jax_compilation_cache_dir", sys.argv[2])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    os.environ["TPU_DEBUG_TARGET_CACHE"] = "off"
else:
    os.environ["TPU_DEBUG_TARGET_CACHE"] = sys.argv[2]
import torch, torch.nn.functional as F
import tpu_debug
from tpu_debug.fit import trace_step
from tpu_debug.runtime.target import compile_for_target
from examples.models.tiny_llama import LlamaConfig, TinyLlama
with torch.device("meta"):
    model = TinyLlama(LlamaConfig()).to(torch.bfloat16)
tokens = torch.empty(8, 64, dtype=torch.long, device="meta")
loss = lambda logits, labels: F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())
traced = trace_step(model, (tokens,), train=True, loss_fn=loss, targets=(tokens,))
# libtpu loaded first: the compiler's start-up is not the program's compile
compile_for_target(lambda x: x + 1, (jax.ShapeDtypeStruct((8,), "float32"),), "v6e", cache=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if mode == "jax":  # JAX's own path: jit(...).lower(inputs on a TPU topology).compile()
        from tpu_debug.runtime.target import _libtpu, parse_target
        device = _libtpu.topology(parse_target("v6e"))[0]
        placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=jax.sharding.SingleDeviceSharding(device))
                  for s in traced.specs]
        with jax.enable_x64(True):
            lowered = jax.jit(traced.function(), donate_argnums=traced.donate).lower(*placed)
        start = time.perf_counter()
        lowered.compile()
        seconds = time.perf_counter() - start
        cached = "n/a"
    else:
        start = time.perf_counter()
        result = compile_for_target(traced.function(), traced.specs, "v6e", donate_argnums=traced.donate,
                                    x64=True)
        seconds = time.perf_counter() - start
        cached = result.cached
cache_warnings = sum("persistent compilation cache" in str(w.message) for w in caught)
print(f"RESULT {{seconds:.3f}} {{cached}} {{cache_warnings}}")
"""


def _child(mode: str, directory: str) -> tuple[float, str, int]:
    code = _CHILD.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, mode, directory], capture_output=True, text=True,
                         timeout=1800, cwd=ROOT)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(out.stderr[-3000:])
    _, seconds, cached, warned = line.split()
    return float(seconds), cached, int(warned)


def cache() -> None:
    print("compile_for_target of a small Llama training step for v6e, each in a fresh process:")
    for mode, label in (("jax", "JAX persistent cache"), ("ours", "tpu_debug target cache")):
        with tempfile.TemporaryDirectory() as directory:
            for attempt in ("cold", "warm"):
                seconds, cached, warned = _child(mode, directory)
                files = sum(1 for _ in Path(directory).rglob("*") if _.is_file())
                print(f"  {label:24s} {attempt}: {seconds:7.3f} s  (result from cache: {cached}; cache "
                      f"read warnings: {warned}; files in the cache dir: {files})")


def overhead(steps: int, rounds: int) -> None:
    import torch
    import torch.nn.functional as F
    from tpu_debug.fit import trace_step
    from tpu_debug.runtime.target import TargetCompiler, parse_target

    import tpu_debug  # noqa: F401

    sys.path.insert(0, str(ROOT))
    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    os.environ["TPU_DEBUG_TARGET_CACHE"] = "off"
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to("tpu")
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device="tpu"), torch.randint(0, 10, (64,), device="tpu")

    def train(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            loss = F.cross_entropy(mlp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        loss.item()
        return (time.perf_counter() - start) / n

    with torch.device("meta"):
        model = TinyLlama(LlamaConfig()).to(torch.bfloat16)
    tokens = torch.empty(8, 64, dtype=torch.long, device="meta")
    traced = trace_step(model, (tokens,), train=True,
                        loss_fn=lambda o, t: F.cross_entropy(o.flatten(0, -2).float(), t.flatten()),
                        targets=(tokens,))
    import jax

    compiler = TargetCompiler()
    compiler.submit(lambda a: a + 1, (torch.empty(8),), parse_target("v6e")).result()  # libtpu loaded, worker started
    with jax.enable_x64(True):  # the program lowered once, for CPU, as the runtime keeps its programs
        lowered = jax.jit(traced.function(), donate_argnums=traced.donate).lower(*traced.specs)
    train(10)  # the eager executables compiled
    alone, beside, beside_lowered, submit_us = [], [], [], []

    def run_beside(submit) -> list[float]:
        start = time.perf_counter()
        futures = [submit() for _ in range(2)]
        submit_us.append((time.perf_counter() - start) / 2 * 1e6)
        busy = []
        while not all(f.done() for f in futures):
            busy.append(train(steps))
        return busy

    # alone and beside alternate, many samples each: other work on the machine comes and goes
    for _ in range(rounds):
        alone.extend(train(steps) for _ in range(50))
        beside.extend(run_beside(lambda: compiler.submit(traced.function(), traced.specs, parse_target("v6e"),
                                                         donate_argnums=traced.donate, x64=True)))
        alone.extend(train(steps) for _ in range(50))
        beside_lowered.extend(run_beside(lambda: compiler.submit_lowered(lowered, parse_target("v6e"))))
    compiler.shutdown()
    a, b, c = statistics.median(alone), statistics.median(beside), statistics.median(beside_lowered)
    print(f"eager MLP training step, {steps} steps per sample, {rounds} rounds "
          f"({len(alone)} samples alone, {len(beside)} + {len(beside_lowered)} beside):")
    print(f"  alone:                                 {a * 1e3:.2f} ms/step")
    print(f"  beside compiles of a function:         {b * 1e3:.2f} ms/step  ({b / a:.2f}x)")
    print(f"  beside compiles of an existing lowering: {c * 1e3:.2f} ms/step  ({c / a:.2f}x)")
    print(f"  submit() on the caller:                {statistics.median(submit_us):.0f} us per compile")
    print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cache", "overhead"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "cache":
        cache()
    else:
        overhead(args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
