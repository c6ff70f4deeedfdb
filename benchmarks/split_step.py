"""The training step as users write it, beside torchax's one-program step and plain CPU PyTorch.

    python benchmarks/split_step.py --torchax PYTHON [--repeat 7] [--calls 40] [--rows mlp-sgd,...]
    python benchmarks/split_step.py --profile mlp-sgd [--calls 300]
    python benchmarks/split_step.py --traced llama-sgd,llama-adamw [--repeat 7] [--calls 30]

The split step on the `tpu` device, as a ``torch.compile`` user writes it::

    model = torch.compile(model)                  # the forward: one program
    opt.zero_grad(set_to_none=...)
    loss = F.cross_entropy(model(x), y)           # the loss: eager ops
    loss.backward()                               # the backward program, run by autograd
    opt.step()                                    # the optimizer's foreach ops

against torchax 0.0.13's one ``jax.jit`` of value-and-grad and the optimizer's update (the
module's functional form from ``torchax.extract_jax``, the update written in JAX, the
parameters and optimizer state donated), and against the same step in plain PyTorch on
CPU (one intra-op thread, see ``compare``). Workloads: benchmarks/compiled.py's MLP (256 -> 512 -> 512 -> 10, batch 64) and tiny
Llama (batch 1 x 32); optimizers SGD (lr 0.01) and AdamW (PyTorch's defaults, lr 1e-3);
our step with ``zero_grad(set_to_none=True)`` (PyTorch's default: autograd stores each
gradient) and ``set_to_none=False`` (the gradients zeroed in place and summed into).

Every variant is checked against PyTorch on CPU before it is timed: the first step's loss
and every parameter after three steps (torchax's in its own process, against the CPU
reference it computes there).

torchax renames PrivateUse1 to ``jax`` on import, which the ``tpu`` device holds, so it runs
in a child process (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) driven round by round: every round
times each variant once, the order rotating, the child's sample taken between this
process's. A sample is ``calls`` steps in a row and one wait (for the loss and every
parameter), after two untimed steps and a wait, as a training loop runs them. Ratios are
medians over rounds of the ratio of two samples of the same round; CPU is each process's
own (``time.process_time``: XLA's threads included). See benchmarks/README.md for
installing torchax beside the dev environment.

``--traced ROWS``: our split step (set_to_none=True) untraced and inside ``tpu_debug.trace()``
(default tracers, the invalid-values tracer among them: the tiny Llama's embedding and its
backward are checked ops), samples alternating, the order rotating; traced / untraced per
round, the median. The trace is entered and left around each traced sample, after two
untimed steps and the writer's commit of the run's start: entering and leaving is
tracing_overhead.py's fixed cost, not a step's.

``--profile ROW``: the calling thread's CPU per part of our split step (set_to_none=True:
zero_grad, forward call, loss, backward, optimizer step), our compiled graphs' calls and
JAX's calls within them, over ``calls`` steps; then cProfile's top functions by own time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROWS = ("mlp-sgd", "mlp-adamw", "llama-sgd", "llama-adamw")
SGD_LR, ADAMW_LR = 0.01, 1e-3


def _setup(row: str):
    """(model on CPU, x, y, loss(logits, y), optimizer factory) of a row."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    workload, optimizer = row.split("-")
    torch.manual_seed(0)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        torch.manual_seed(1)
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        vocab = 10
    else:
        cfg = LlamaConfig()
        model = TinyLlama(cfg)
        torch.manual_seed(1)
        tokens = torch.randint(0, cfg.vocab, (1, 33))
        x, y = tokens[:, :-1], tokens[:, 1:]
        vocab = cfg.vocab

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    if optimizer == "sgd":
        def make_opt(params):
            return torch.optim.SGD(params, lr=SGD_LR)
    else:
        def make_opt(params):
            return torch.optim.AdamW(params, lr=ADAMW_LR)
    return model, x, y, loss_fn, make_opt


def _reference(row: str, steps: int = 3):
    """PyTorch on CPU: the first step's loss and the parameters after ``steps`` steps (three:
    an in-place op's executable donates its buffers from its third call on)."""
    model, x, y, loss_fn, make_opt = _setup(row)
    opt = make_opt(model.parameters())
    first = None
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    return first, {n: p.detach().clone() for n, p in model.named_parameters()}


# -- torchax, in a child process ---------------------------------------------------------------


def _torchax_step(row: str):
    """torchax's one-program step: jit(value_and_grad + the update), state donated."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torchax

    model, x, y, _, _ = _setup(row)
    states, fwd = torchax.extract_jax(model)
    names = [n for n, _ in model.named_parameters()]
    params = {n: states[n] for n in names}
    buffers = {k: v for k, v in states.items() if k not in params}
    jx, jy = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def loss_of(p, xb, yb):
        logits = fwd({**buffers, **p}, (xb,))
        logits = logits.reshape(-1, logits.shape[-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, yb.reshape(-1, 1), axis=1).mean()

    if row.endswith("sgd"):
        state = {"p": params}

        def update(state, g):
            return {"p": jax.tree.map(lambda p, g: p - SGD_LR * g, state["p"], g)}
    else:
        b1, b2, eps, wd = 0.9, 0.999, 1e-8, 1e-2
        state = {"p": params, "m": jax.tree.map(jnp.zeros_like, params),
                 "v": jax.tree.map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.float32)}

        def update(state, g):
            t = state["t"] + 1
            m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], g)
            v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], g)

            def one(p, m, v):
                p = p * (1 - ADAMW_LR * wd)
                return p - ADAMW_LR * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)
            return {"p": jax.tree.map(one, state["p"], m, v), "m": m, "v": v, "t": t}

    def step(state, xb, yb):
        loss, g = jax.value_and_grad(loss_of)(state["p"], xb, yb)
        return update(state, g), loss

    jitted = jax.jit(step, donate_argnums=0)
    box = [state]

    def run():
        box[0], loss = jitted(box[0], jx, jy)
        return loss

    first = float(run())
    run()
    run()
    ref_loss, ref_params = _reference(row)
    np.testing.assert_allclose(first, ref_loss, rtol=1e-4)
    for n in names:
        np.testing.assert_allclose(np.asarray(box[0]["p"][n]), ref_params[n].numpy(), rtol=1e-3, atol=1e-4)
    return run, lambda out: jax.block_until_ready((out, box[0]))


def torchax_child(rows: list[str]) -> None:
    """Serve timing requests on stdin: ``ROW N`` -> ``wall cpu`` seconds."""
    steps = {row: _torchax_step(row) for row in rows}
    print("ready", flush=True)
    for line in sys.stdin:
        row, n = line.split()
        fn, wait = steps[row]
        for _ in range(2):
            wait(fn())
        w, c = time.perf_counter(), time.process_time()
        for _ in range(int(n) - 1):
            fn()
        wait(fn())
        print(f"{time.perf_counter() - w} {time.process_time() - c}", flush=True)


class _Child:
    def __init__(self, python: str, rows: list[str]) -> None:
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen([python, __file__, "--child", ",".join(rows)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the torchax child did not start (said {line!r}); see its stderr above")

    def sample(self, row: str, calls: int) -> tuple[float, float]:
        self.proc.stdin.write(f"{row} {calls}\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# -- ours and CPU PyTorch, in this process -----------------------------------------------------


def _split_step(row: str, device: str, set_to_none: bool, compiled: bool = True):
    """(step() -> loss, wait(loss)) of the user-written step on ``device``, checked first."""
    import torch

    model, x, y, loss_fn, make_opt = _setup(row)
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = make_opt(model.parameters())
    fwd = torch.compile(model) if compiled else model
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    def wait(loss) -> None:
        if device == "cpu":
            return
        from tpu_debug.runtime.tensor import to_jax

        for t in (loss, *params):
            to_jax(t).block_until_ready()

    ref_loss, ref_params = _reference(row)
    first = step().item()
    step()
    step()
    torch.testing.assert_close(first, ref_loss, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), ref_params[n], rtol=1e-3, atol=1e-4)
    return step, wait


def _sampler(step, wait):
    def sample(calls: int) -> tuple[float, float]:
        for _ in range(2):
            out = step()
        wait(out)
        w, c = time.perf_counter(), time.process_time()
        for _ in range(calls - 1):
            step()
        wait(step())
        return time.perf_counter() - w, time.process_time() - c
    return sample


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def compare(rows: list[str], python: str | None, repeat: int, calls: int) -> None:
    import torch

    # PyTorch on CPU with one intra-op thread: with two, its OpenMP workers spin against XLA's
    # threads (this process's and the torchax child's) on a 2-core machine, and a step that
    # takes 1-2 ms alone took 60-300 ms under load
    torch.set_num_threads(1)
    variants: dict = {}
    for row in rows:
        variants[(row, "CPU PyTorch eager")] = _sampler(*_split_step(row, "cpu", True, compiled=False))
        variants[(row, "tpu_debug split, set_to_none=True")] = _sampler(*_split_step(row, "tpu", True))
        variants[(row, "tpu_debug split, set_to_none=False")] = _sampler(*_split_step(row, "tpu", False))
    child = _Child(python, rows) if python else None
    if child:
        for row in rows:
            variants[(row, "torchax one jax.jit")] = lambda n, row=row: child.sample(row, n)
    load_before, start = _load(), time.strftime("%H:%M:%S", time.gmtime())
    wall = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    keys = list(variants)
    try:
        for r in range(repeat):
            for k in keys[r % len(keys):] + keys[: r % len(keys)]:
                time.sleep(0.02)  # let the previous variant's worker threads go idle
                w, c = variants[k](calls)
                wall[k].append(w / calls)
                cpu[k].append(c / calls)
    finally:
        if child:
            child.close()
    print(f"measured {start}-{time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
          f"{load_before} before, {_load()} after (2 CPUs); {repeat} rounds of {calls} steps a sample\n")

    def ratio(series, row, other):
        base = series.get((row, other))
        if base is None:
            return "-"
        return f"{statistics.median(a / b for a, b in zip(series[k], base)):.2f}x"

    print("| workload | variant | wall ms/step | CPU ms/step | / torchax, wall | / torchax, CPU "
          "| / CPU PyTorch, wall |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for k in keys:
        row, name = k
        print(f"| {row} | {name} | {statistics.median(wall[k]) * 1e3:.3f} | {statistics.median(cpu[k]) * 1e3:.3f} "
              f"| {ratio(wall, row, 'torchax one jax.jit')} | {ratio(cpu, row, 'torchax one jax.jit')} "
              f"| {ratio(wall, row, 'CPU PyTorch eager')} |", flush=True)


def traced(rows: list[str], repeat: int, calls: int) -> None:
    import tempfile

    import tpu_debug

    logdir = tempfile.mkdtemp(prefix="split_step_traces_")
    samples = {row: _sampler(*_split_step(row, "tpu", True)) for row in rows}
    load_before, start = _load(), time.strftime("%H:%M:%S", time.gmtime())
    times: dict = {(row, side): [] for row in rows for side in ("untraced", "traced")}
    keys = list(times)
    for r in range(repeat):
        for row, side in keys[r % len(keys):] + keys[: r % len(keys)]:
            time.sleep(0.02)
            if side == "traced":
                recording = tpu_debug.trace(logdir=logdir)
                with recording:
                    samples[row](2)
                    # the writer stores the run's start (its header, the programs replayed to the
                    # new trace's tracers, more with every program the process compiled) on the
                    # other core: a cost of entering the trace, left out of the timed sample, as
                    # tracing_modes.py does
                    recording._writer.flush()
                    times[(row, side)].append(samples[row](calls))
            else:
                samples[row](2)  # as the traced side
                times[(row, side)].append(samples[row](calls))
    print(f"measured {start}-{time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
          f"{load_before} before, {_load()} after (2 CPUs); {repeat} rounds of {calls} steps a sample\n")
    print("| workload | untraced wall ms/step | traced / untraced, wall | traced / untraced, CPU |")
    print("|---|---:|---:|---:|")
    for row in rows:
        on, off = times[(row, "traced")], times[(row, "untraced")]
        wall = statistics.median(a[0] / b[0] for a, b in zip(on, off))
        cpu = statistics.median(a[1] / b[1] for a, b in zip(on, off))
        print(f"| {row} | {statistics.median(b[0] for b in off) / calls * 1e3:.3f} | {wall:.3f}x | {cpu:.3f}x |")


def profile(row: str, calls: int) -> None:
    """Where our split step's host time goes: the calling thread's CPU per part of the step,
    and within them our compiled graphs' calls (JAX's call of the program included) and the
    JAX calls themselves, and the in-place eager ops' JAX calls; then cProfile's top."""
    import cProfile
    import pstats

    import torch
    from tpu_debug.runtime import compiled, eager

    model, x, y, loss_fn, make_opt = _setup(row)
    model = model.to("tpu")
    x, y = x.to("tpu"), y.to("tpu")
    opt = make_opt(model.parameters())
    fwd = torch.compile(model)
    clock = time.thread_time_ns
    inner = {"compiled graphs' calls (ours + JAX)": 0, "  of which JAX's call": 0,
             "in-place eager ops' JAX calls": 0}

    def timed(name, fn):
        def call(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                inner[name] += clock() - start
        return call

    patched = ((compiled.CompiledGraph, "__call__", "compiled graphs' calls (ours + JAX)"),
               (compiled.CompiledGraph, "_run", "  of which JAX's call"),
               (eager._Donor, "run", "in-place eager ops' JAX calls"))
    saved = [(cls, attr, getattr(cls, attr)) for cls, attr, _ in patched]
    parts = dict.fromkeys(("zero_grad", "forward (compiled call)", "loss (eager)", "backward", "optimizer step"), 0)

    def step(timed_parts: bool):
        t0 = clock()
        opt.zero_grad()
        t1 = clock()
        out = fwd(x)
        t2 = clock()
        loss = loss_fn(out, y)
        t3 = clock()
        loss.backward()
        t4 = clock()
        opt.step()
        t5 = clock()
        if timed_parts:
            for name, a, b in zip(parts, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
                parts[name] += b - a
        return loss

    for _ in range(10):
        step(False)
    try:
        for cls, attr, name in patched:
            setattr(cls, attr, timed(name, getattr(cls, attr)))
        for _ in range(calls):
            step(True)
    finally:
        for cls, attr, fn in saved:
            setattr(cls, attr, fn)
    print(f"load average {_load()}; the calling thread's CPU per step (µs), {calls} steps:")
    for name, ns in (*parts.items(), ("total", sum(parts.values())), *inner.items()):
        print(f"  {name:38s} {ns / calls / 1e3:8.1f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step(False)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS))
    parser.add_argument("--torchax", metavar="PYTHON", help="an interpreter with torchax installed")
    parser.add_argument("--profile", metavar="ROW")
    parser.add_argument("--traced", metavar="ROWS", help="traced / untraced of our split step on these rows")
    parser.add_argument("--child", metavar="ROWS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return torchax_child(args.child.split(","))
    if args.profile:
        return profile(args.profile, args.calls)
    rows = (args.traced or args.rows).split(",")
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")
    if args.traced:
        return traced(rows, args.repeat, args.calls)
    compare(rows, args.torchax, args.repeat, args.calls)


if __name__ == "__main__":
    main()
