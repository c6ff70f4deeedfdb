"""Soak: a long traced run that keeps meeting new shapes keeps its memory flat.

Eager ops on a fixed shape (cache hits) with, every ``_NEW_SHAPE_EVERY`` ops, ops on a
shape never seen before (cycling through ``_SHAPE_CYCLE`` sizes, many times the eager
cache's bound, reading a strided view so the index-array cache fills too), and a
compiled function with dynamic shapes cycling through more input sizes than the
compiled-program bound. Every result is compared with the same computation on CPU.

Memory: RSS after the first 10 % of the ops (warm: every code path has run, the caches
are full) against the peak RSS after it (VmHWM, reset at the warm-up point). Each cached
executable costs ~1.4 MiB on the CPU backend, so unbounded caches would grow RSS by
about that per compile (+126 MiB in the default tier, which compiles ~90 executables
after warm-up). The allowance is what grows with the run rather than with the caches:
``_ALLOWANCE_MIB`` for the tracers' records (the recompile tracker keeps one small
record per compile), the run writer's SQLite page cache and allocator fragmentation,
plus ``_PER_COMPILE_KIB`` per compile after warm-up: native memory JAX and XLA keep for
every program compiled, which no cache of ours holds (measured here with jax 0.10.2 on
CPU and no tpu_debug: 37 KiB a compile over 1,000 new-shape programs, 19 KiB over
6,000, of which ``jax.clear_caches()`` returns a tenth; as in jax-ml/jax#19429).

Tiers: the default tier runs ``SOAK_OPS`` eager ops (25,000 unless the environment
variable says otherwise; not ``TPU_DEBUG_*``, which tests clear); the full run
(1,000,000 eager ops, 10,000 compiled calls) is marked slow.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest
import torch

import tpu_debug
from tpu_debug.runtime import cache_counts, eager, probes
from tpu_debug.runtime.config import config

_DEFAULT_OPS = int(os.environ.get("SOAK_OPS", "25000"))
_FULL_OPS = 1_000_000
_NEW_SHAPE_EVERY = 500  # eager ops between two blocks on a new shape
_SHAPE_CYCLE = 1000  # distinct sizes before a size comes back (its executables long evicted)
_OPS_PER_COMPILED_CALL = 100
_ALLOWANCE_MIB = 64
_PER_COMPILE_KIB = 48
_MIB = 1024 * 1024

# tpu(x) = tanh(0.9 x + y) is a contraction (Lipschitz 0.9): a rounding difference between
# XLA's and PyTorch's tanh (a few ulp) is damped, never accumulated, so the loop state
# stays within ~10 ulp of the CPU one however long it runs
_TOL = {"rtol": 1e-5, "atol": 1e-5}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux: ``5`` into clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class _Compiles:
    def __init__(self) -> None:
        self.eager = 0
        self.all = 0
        self.evicted = 0

    def on_compile(self, info) -> None:
        self.all += 1
        if info.mode == "eager":
            self.eager += 1

    def on_evict(self, mode, name, key) -> None:
        self.evicted += 1


def _new_shape_block(k: int) -> None:
    """Ops on a shape of size ``k`` mod the cycle, through a strided view; checked on CPU."""
    n = 2 + k % _SHAPE_CYCLE
    host = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8) / n
    dev = host.to("tpu")
    torch.testing.assert_close((dev[:, 1::2] * 2).sum(0).cpu(), (host[:, 1::2] * 2).sum(0))


def _soak(logdir: Path, ops: int, compiled_calls: int) -> dict:
    torch.manual_seed(0)
    x_cpu, y_cpu = torch.randn(32, 32), torch.randn(32, 32) * 0.1
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    w_cpu = torch.randn(64, 16)
    w = w_cpu.to("tpu")

    def fn(a, b):
        return torch.relu(a @ b).sum(0)

    cfn = torch.compile(fn, backend="tpu_debug", dynamic=True)
    batches = [torch.randn(n, 64) for n in range(20, 32)]  # 12 sizes, none equal to 64 or 16
    steps = ops // 3  # three eager ops a step
    compiled_every = max(steps // compiled_calls, 1)
    new_shape_every = max(_NEW_SHAPE_EVERY // 3, 1)
    warm_at = steps // 10
    counts = _Compiles()
    probes.subscribe(counts)
    figures: dict = {}
    calls = blocks = 0
    start = time.perf_counter()
    try:
        with tpu_debug.trace(logdir=logdir) as session:
            for i in range(steps):
                x = torch.tanh(x * 0.9 + y)
                x_cpu = torch.tanh(x_cpu * 0.9 + y_cpu)
                if i % new_shape_every == 0:
                    _new_shape_block(blocks)
                    blocks += 1
                    torch.testing.assert_close(x.cpu(), x_cpu, **_TOL)
                if i % compiled_every == 0 and calls < compiled_calls:
                    batch = batches[(calls // 25) % len(batches)]  # a new size every 25 calls
                    torch.testing.assert_close(cfn(batch.to("tpu"), w).cpu(), fn(batch, w_cpu), **_TOL)
                    calls += 1
                if i == warm_at:
                    gc.collect()
                    figures["warm_rss"] = _status_kib("VmRSS") * 1024
                    figures["warm_compiles"] = counts.all
                    figures["peak_reset"] = _reset_peak()
                    figures["warm_seconds"] = time.perf_counter() - start
            gc.collect()
            figures["end_rss"] = _status_kib("VmRSS") * 1024
            figures["peak_rss"] = _status_kib("VmHWM") * 1024
        figures["seconds"] = time.perf_counter() - start
        figures["recorded_eager_compiles"] = len(session.compiles(mode="eager"))
        figures["internal_errors"] = session.internal_errors()
    finally:
        probes.unsubscribe(counts)
    torch.testing.assert_close(x.cpu(), x_cpu, **_TOL)
    figures.update(steps=steps, compiled_calls=calls, blocks=blocks, compiles=counts.eager, evictions=counts.evicted)
    figures["compiles_after_warm"] = counts.all - figures["warm_compiles"]
    return figures


@pytest.mark.parametrize(
    ("ops", "compiled_calls"),
    [
        pytest.param(_DEFAULT_OPS, max(_DEFAULT_OPS // _OPS_PER_COMPILED_CALL, 1), id="default"),
        pytest.param(_FULL_OPS, 10_000, id="full", marks=pytest.mark.slow),
    ],
)
def test_soak_memory_stays_flat(tmp_path, monkeypatch, ops, compiled_calls):
    # small bounds, so the run goes past each of them many times, and the eager cache is
    # full by the warm-up point (10 % of the default tier: 5 blocks, 10 executables, and the
    # loop's own ops)
    monkeypatch.setattr(config, "eager_cache_size", 12)
    monkeypatch.setattr(config, "compiled_cache_size", 4)
    monkeypatch.setattr(config, "index_cache_bytes", 32 * 1024)
    eager.clear_cache()
    before = {c.name: c.evicted for c in cache_counts()}
    figures = _soak(tmp_path / "runs", ops, compiled_calls)
    after = {c.name: c for c in cache_counts()}
    evicted = {name: after[name].evicted - before[name] for name in before}
    print(
        f"\nsoak {ops} eager ops, {figures['compiled_calls']} compiled calls: {figures['seconds']:.1f} s "
        f"(warm after {figures['warm_seconds']:.1f} s); RSS warm {figures['warm_rss'] / _MIB:.0f} MiB, "
        f"end {figures['end_rss'] / _MIB:.0f} MiB, peak after warm-up {figures['peak_rss'] / _MIB:.0f} MiB"
        f"{'' if figures['peak_reset'] else ' (peak since process start: clear_refs not writable)'}; "
        f"{figures['compiles']} eager compiles, {figures['compiles_after_warm']} compiles after warm-up; "
        f"evicted {evicted}"
    )
    assert not figures["internal_errors"], figures["internal_errors"]
    # every bound was exceeded, and what went was reported to the tracers
    assert evicted["eager executables"] > 0 and evicted["compiled programs"] > 0
    assert evicted["view index arrays"] > 0
    assert figures["evictions"] == evicted["eager executables"] + evicted["compiled programs"]
    assert figures["recorded_eager_compiles"] == figures["compiles"]
    assert after["eager executables"].entries <= 12 and after["compiled programs"].entries <= 4
    grown = (figures["peak_rss"] if figures["peak_reset"] else figures["end_rss"]) - figures["warm_rss"]
    allowed = _ALLOWANCE_MIB * _MIB + figures["compiles_after_warm"] * _PER_COMPILE_KIB * 1024
    assert grown <= allowed, f"RSS grew {grown / _MIB:.0f} MiB after warm-up (allowed {allowed / _MIB:.0f} MiB): {figures}"
    eager.clear_cache()
