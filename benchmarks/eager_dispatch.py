"""Eager dispatch cost: µs per small op on `tpu`, beside torch CPU and raw jax.jit.

All three run in this one process, interleaved block by block (a block of tpu
calls, then of torch CPU calls, then of jax.jit calls, 30 rounds), so the
ratios hold on a noisy machine; each figure is the 10th percentile of its
blocks. Beside wall time, the calling thread's CPU time (``time.thread_time``):
what dispatching costs the host, which other jobs on the machine move less.
Writes nothing; paste the table into benchmarks/README.md.
``--memory`` adds a column with memory tracking on (a memory tracer listening:
every payload set is noted with its allocating line), timed in turn with the
others.

    python benchmarks/eager_dispatch.py [--repeat 2000] [--memory]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import torch

import tpu_debug  # noqa: F401


def _time(fn, repeat: int) -> float:
    for _ in range(50):
        fn()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(samples)


def _interleaved(fns, repeat: int, rounds: int = 30) -> list[tuple[float, float]]:
    """(wall µs, thread CPU µs) per call of each of ``fns``, timed in alternating blocks:
    the 10th percentile of each's blocks."""
    for fn in fns:
        for _ in range(50):
            fn()
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    block = max(1, repeat // 10)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start, cpu = time.perf_counter(), time.thread_time()
            for _ in range(block):
                fn()
            walls[i].append((time.perf_counter() - start) / block * 1e6)
            cpus[i].append((time.thread_time() - cpu) / block * 1e6)

    def low(v: list[float]) -> float:
        return sorted(v)[len(v) // 10]

    return [(low(w), low(c)) for w, c in zip(walls, cpus)]


class _Cycle:
    """0, 1, ..., n-1, 0, ...: a view's storage offset that changes every call."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = -1

    def __call__(self) -> int:
        self.i = (self.i + 1) % self.n
        return self.i


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--memory", action="store_true", help="also time each op with memory tracking on")
    args = parser.parse_args(argv)
    rows_cpu = torch.zeros(16, 64)
    rows = rows_cpu.to("tpu")
    jrows = jnp.asarray(rows_cpu.numpy())
    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    lin_cpu = torch.nn.Linear(64, 64)
    lin = torch.nn.Linear(64, 64).to("tpu")
    ja, jb = jnp.asarray(a_cpu.numpy()), jnp.asarray(b_cpu.numpy())
    jw, jbias = jnp.asarray(lin_cpu.weight.detach().numpy()), jnp.asarray(lin_cpu.bias.detach().numpy())
    jit_add = jax.jit(lambda x, y: x + y)
    jit_mul = jax.jit(lambda x, y: x * y)
    jit_relu = jax.jit(lambda x: jnp.maximum(x, 0))
    jit_sum = jax.jit(lambda x: x.sum())
    jit_mm = jax.jit(lambda x, y: x @ y)
    jit_lin = jax.jit(lambda x, w, bb: x @ w.T + bb)
    jit_row_add = jax.jit(lambda r, i: r.at[i].add(1.0))
    jit_row_read = jax.jit(lambda r, i: r[i] * 2.0)
    cycle = _Cycle(16)
    cases = [
        ("add 64x64", lambda: a + b, lambda: a_cpu + b_cpu, lambda: jit_add(ja, jb)),
        ("mul 64x64", lambda: a * b, lambda: a_cpu * b_cpu, lambda: jit_mul(ja, jb)),
        ("relu 64x64", lambda: torch.relu(a), lambda: torch.relu(a_cpu), lambda: jit_relu(ja)),
        ("sum 64x64", lambda: a.sum(), lambda: a_cpu.sum(), lambda: jit_sum(ja)),
        ("mm 64x64", lambda: a @ b, lambda: a_cpu @ b_cpu, lambda: jit_mm(ja, jb)),
        ("nn.Linear(64,64) fwd", lambda: lin(a), lambda: lin_cpu(a_cpu), lambda: jit_lin(ja, jw, jbias)),
        # a view op: the row is read from its storage and written back into it
        ("x[3].add_(1), x 16x64", lambda: rows[3].add_(1), lambda: rows_cpu[3].add_(1),
         lambda: jit_row_add(jrows, 3)),
        # the same at a new storage offset each call (row 0, 1, ... 15, 0, ...)
        ("x[i].add_(1), i = 0..15", lambda: rows[cycle()].add_(1), lambda: rows_cpu[cycle()].add_(1),
         lambda: jit_row_add(jrows, cycle())),
        ("x[i] * 2, i = 0..15", lambda: rows[cycle()] * 2, lambda: rows_cpu[cycle()] * 2,
         lambda: jit_row_read(jrows, cycle())),
    ]
    extra = " tpu, memory tracked (µs) | tracked / tpu |" if args.memory else ""
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(
        "| op | tpu (µs) | torch CPU (µs) | raw jax.jit (µs) | tpu / jax.jit | tpu CPU time (µs) "
        f"| jax.jit CPU time (µs) | tpu / jax.jit, CPU time |{extra}"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.memory else ""))
    with torch.no_grad():
        for name, dev, cpu, raw in cases:
            (t_dev, c_dev), (t_cpu, _), (t_raw, c_raw) = _interleaved((dev, cpu, raw), args.repeat)
            row = (
                f"| {name} | {t_dev:.1f} | {t_cpu:.1f} | {t_raw:.1f} | {t_dev / t_raw:.1f}x "
                f"| {c_dev:.1f} | {c_raw:.1f} | {c_dev / c_raw:.1f}x |"
            )
            if args.memory:
                t_mem = _tracked(dev, args.repeat)
                row += f" {t_mem:.1f} | {t_mem / t_dev:.2f}x |"
            print(row)
        _first_pass()


def _tracked(fn, repeat: int) -> float:
    """``_time(fn)`` with a memory tracer listening, as ``trace(memory=True)`` runs it."""
    from tpu_debug.runtime import probes
    from tpu_debug.tracers.recording.memory_tracker import MemoryTracer

    tracer = MemoryTracer()
    tracer.start()
    probes.subscribe(tracer)
    try:
        return _time(fn, repeat)
    finally:
        probes.unsubscribe(tracer)
        tracer.close()


def _first_pass() -> None:
    """What the first ``x[i].add_(1)`` over 16 rows costs, compiles included (a shape no
    case above used, so nothing is cached yet)."""
    from tpu_debug.runtime import eager

    x = torch.zeros(16, 48, device="tpu")
    before = len(eager.cache_stats())
    start = time.perf_counter()
    for i in range(16):
        x[i].add_(1)
    x.cpu()
    seconds = time.perf_counter() - start
    print(f"\nfirst pass of x[i].add_(1) over 16 rows: {len(eager.cache_stats()) - before} eager "
          f"executables compiled, {seconds * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
