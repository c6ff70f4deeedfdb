"""Tracing overhead per execution mode: the same work untraced and inside ``tpu_debug.trace()``.

    python benchmarks/tracing_modes.py [--repeat 15] [--rows chain,llama,hf] [--modes never,fuse,compiled]
    python benchmarks/tracing_modes.py --profile chain:fuse     # where the traced path spends its time
    python benchmarks/tracing_modes.py --without steps,collectives  # each tracer's cost: the trace without it

Workloads (each checked against PyTorch on CPU before it is timed):

- ``chain``: 150 small ops (50 times sin, mul, add on 64x64), 40 chains per sample,
  each chain synchronized at its end;
- ``llama``: benchmarks/compiled.py's tiny Llama, a training step (forward, cross
  entropy, backward, AdamW with ``capturable=True``), 5 steps per sample;
- ``hf``: a Hugging Face Llama from tests/models' zoo (hidden 32, 2 layers, batch 2 x 8),
  a training step (forward with labels, backward, SGD), 5 steps per sample.

Modes: ``never`` op by op (``DEFER_NEVER``), ``fuse`` lazy fused (``DEFER_AND_FUSE``, one
graph per chain or step), ``compiled`` (``tpu_debug.compile`` of the chain or of the whole
step: one program).

A pair is one untraced sample and one traced sample (the order alternating, the collector
paused); the traced one enters ``tpu_debug.trace(eager_mode=...)`` with its default
tracers (no TPU target, no divergence), runs one untimed sample, then the timed one, and
leaves: entering and leaving (run directory, database, writer thread, programs replayed to
the tracers, final flush) is a fixed cost per trace, not per op. The untraced side runs the
same two samples. A workload's sample is repeated until one timing lasts ``--min-ms``
(20 ms) untraced. The figures are the medians over pairs of traced /
untraced wall time and process CPU time (every thread: the store's writer included).
``--without TRACER`` adds rows whose traced side leaves one default tracer out: its cost is
the difference from the full trace's row.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tpu_debug.runtime import lazy, probes
from tpu_debug.runtime.tensor import to_jax

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama

# the default tracers, by the Trace attribute holding each (--without leaves one out)
TRACERS = {"recorder": "_recorder", "steps": "_steps", "collectives": "_collectives"}
MODES = {"never": "defer_never", "fuse": "defer_and_fuse", "compiled": "defer_never"}
SETS = {"never": torch.tpu.EagerMode.DEFER_NEVER, "fuse": torch.tpu.EagerMode.DEFER_AND_FUSE,
        "compiled": torch.tpu.EagerMode.DEFER_NEVER}


def _sync(t: torch.Tensor) -> None:
    lazy.computed(t)  # lazy mode: the pending graph runs now
    to_jax(t).block_until_ready()


# -- workloads: each returns {mode: sample()}, every variant checked against CPU ---------------


def chain_workload(modes: list[str], chains: int = 40) -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    # |w| < 0.9 keeps the chain contracting, so float32 rounding does not grow along it
    x, w, y = torch.randn(64, 64), torch.rand(64, 64) * 0.9, torch.randn(64, 64)

    def chain(x, w, y):
        for _ in range(50):
            x = torch.sin(x)
            x = x * w
            x = x + y
        return x

    ref = chain(x, w, y)
    xd, wd, yd = x.to("tpu"), w.to("tpu"), y.to("tpu")
    compiled = tpu_debug.compile(chain)
    out = {}
    for mode in modes:
        fn = compiled if mode == "compiled" else chain
        with torch.tpu.set_eager_mode(SETS[mode]):
            torch.testing.assert_close(fn(xd, wd, yd).cpu(), ref, rtol=1e-4, atol=1e-4)

        def sample(fn=fn):
            for _ in range(chains):
                _sync(fn(xd, wd, yd))

        out[mode] = sample
    return out


def _train_variants(modes, make, batch, loss_of, make_opt, steps: int, tol: float):
    """Per mode a sample of ``steps`` training steps on its own copy of the model, each mode's
    first step checked against the same step on CPU (loss and parameters)."""
    cpu = make()
    x, y = batch
    xd, yd = x.to("tpu"), y.to("tpu")

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        return loss.detach()

    ref_model = copy.deepcopy(cpu)
    ref_loss = step(ref_model, make_opt(ref_model, False), x, y)
    out = {}
    for mode in modes:
        model = copy.deepcopy(cpu).to("tpu")
        opt = make_opt(model, True)
        fn = tpu_debug.compile(lambda x, y, m=model, o=opt: step(m, o, x, y)) if mode == "compiled" else (
            lambda x, y, m=model, o=opt: step(m, o, x, y))
        with torch.tpu.set_eager_mode(SETS[mode]):
            torch.testing.assert_close(fn(xd, yd).cpu(), ref_loss, rtol=tol, atol=tol)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=tol, atol=tol)

        def sample(fn=fn):
            for _ in range(steps):
                loss = fn(xd, yd)
            _sync(loss)

        out[mode] = sample
    return out


def llama_workload(modes: list[str], steps: int = 5):
    cfg = LlamaConfig()

    def make():
        torch.manual_seed(0)
        return TinyLlama(cfg)

    torch.manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (1, 33))

    def loss_of(model, x, y):
        return F.cross_entropy(model(x).reshape(-1, cfg.vocab), y.reshape(-1))

    def make_opt(model, device):
        return torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=device)

    return _train_variants(modes, make, (tokens[:, :-1], tokens[:, 1:]), loss_of, make_opt, steps, 1e-4)


def hf_workload(modes: list[str], steps: int = 5):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
    import hf_common

    spec = hf_common.SPECS["llama"]
    config = spec.make_config()
    inputs = spec.batch(config)

    def loss_of(model, x, y):
        return model(input_ids=x, labels=y).loss

    def make_opt(model, device):
        return torch.optim.SGD(model.parameters(), lr=hf_common.LR)

    return _train_variants(modes, spec.build, (inputs["input_ids"], inputs["labels"]), loss_of, make_opt,
                           steps, 1e-4)


WORKLOADS = {"chain": ("150-op chain (sin, mul, add 64x64), 40 chains", chain_workload),
             "llama": ("tiny-Llama train step (fwd+bwd+AdamW), 5 steps", llama_workload),
             "hf": ("HF Llama (tests/models) train step (fwd+bwd+SGD), 5 steps", hf_workload)}


# -- measuring -----------------------------------------------------------------------------


def _timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def lengthened(sample, mode: str, min_ms: float) -> tuple[Callable[[], None], int]:
    """``sample`` repeated often enough that one timing lasts at least ``min_ms`` untraced (a
    compiled tiny-Llama step takes half a millisecond: five of them are too short a sample
    for a stable ratio), and the repeat count."""
    with torch.tpu.set_eager_mode(SETS[mode]):
        sample()
        took = min(_timed(sample)[0] for _ in range(3))
    count = max(1, math.ceil(min_ms / 1e3 / max(took, 1e-9)))
    if count == 1:
        return sample, 1

    def repeated():
        for _ in range(count):
            sample()

    return repeated, count


def overhead(sample, mode: str, logdir: str, repeat: int, without: str | None = None,
             **options) -> dict[str, float]:
    """Medians over ``repeat`` interleaved (untraced, traced) pairs of the traced / untraced
    wall and CPU time of ``sample``, and the untraced sample's median wall time. ``without``
    names a default tracer the traced side leaves out (unsubscribed once the trace began),
    so the difference from the full trace is that tracer's cost."""

    # each side runs one untimed sample before the timed one: in a trace, the first sample
    # after entering also pays for the run's start (the writer thread storing the run's
    # header and the programs replayed to the tracers), a fixed cost per trace; the traced
    # side then waits for the writer to commit that start, which it otherwise stores beside
    # the timed sample on the other core (the replay grows with every program the process
    # has compiled, so the spill grows with the process's age, not with what the sample does)
    def off():
        with torch.tpu.set_eager_mode(SETS[mode]):
            sample()
            return _timed(sample)

    def on():
        recording = tpu_debug.trace(logdir=logdir, name="bench", eager_mode=MODES[mode], **options)
        with recording:
            if without is not None:
                tracer = getattr(recording, TRACERS[without])
                if tracer is not None:
                    probes.unsubscribe(tracer)
            sample()
            recording._writer.flush()
            return _timed(sample)

    for _ in range(2):
        off(), on()
    walls, cpus, base = [], [], []
    gc.collect()
    gc.disable()
    try:
        for i in range(repeat):
            if i % 2:
                b, t = on(), off()
            else:
                t, b = off(), on()
            walls.append(b[0] / t[0])
            cpus.append(b[1] / t[1])
            base.append(t[0])
            gc.collect()
    finally:
        gc.enable()
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus),
            "off ms": statistics.median(base) * 1e3, "min wall": min(walls)}


def profile(sample, mode: str, logdir: str, top: int) -> None:
    """cProfile of one traced sample (after a warm one): the functions that cost most, then
    each tracer's probe methods (time inside them, callees included) as a share of the
    sample. cProfile inflates Python calls against C ones, so the shares are an upper bound."""
    with tpu_debug.trace(logdir=logdir, name="bench", eager_mode=MODES[mode]):
        sample()
        prof = cProfile.Profile()
        prof.enable()
        sample()
        prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)
    total = stats.total_tt
    print("probe method (tracers/, callees included) | calls | share of the traced sample")
    for (file, _, func), (_, calls, _, cum, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][3]):
        if f"{os.sep}tracers{os.sep}" in file and (func.startswith("on_") or func == "snapshot"):
            print(f"{Path(file).stem}.{func} | {calls} | {cum / total:.1%}")


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rows", default="chain,llama,hf")
    parser.add_argument("--modes", default="never,fuse,compiled")
    parser.add_argument("--profile", metavar="ROW:MODE", help="profile one traced sample instead")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--min-ms", type=float, default=20.0,
                        help="repeat a workload's sample until one timing lasts this long untraced")
    parser.add_argument("--without", default="",
                        help="also measure the trace with each of these default tracers left out "
                             f"(comma-separated: {', '.join(TRACERS)}); the difference is its cost")
    args = parser.parse_args(argv)
    logdir = tempfile.mkdtemp(prefix="tracing_modes_")
    if args.profile:
        row, mode = args.profile.split(":")
        profile(WORKLOADS[row][1]([mode])[mode], mode, logdir, args.top)
        return
    modes = args.modes.split(",")
    print(f"load average before: {_load()} (2 CPUs)\n")
    left_out = [t for t in args.without.split(",") if t]
    for t in left_out:
        if t not in TRACERS:
            parser.error(f"--without {t}: the default tracers are {', '.join(TRACERS)}")
    print("| workload | mode | tracers | samples per timing | untraced (ms, median) "
          "| traced / untraced, wall | traced / untraced, CPU |")
    print("|---|---|---|---:|---:|---:|---:|")
    for row in args.rows.split(","):
        title, make = WORKLOADS[row]
        for mode, sample in make(modes).items():
            timed_sample, count = lengthened(sample, mode, args.min_ms)
            for without in [None, *left_out]:
                r = overhead(timed_sample, mode, logdir, args.repeat, without)
                tracers = "all default" if without is None else f"without {without}"
                print(f"| {title} | {mode} | {tracers} | {count} | {r['off ms']:.1f} | {r['wall']:.3f}x "
                      f"| {r['cpu']:.3f}x |", flush=True)
    print(f"\nload average after: {_load()} (2 CPUs)")


if __name__ == "__main__":
    main()
