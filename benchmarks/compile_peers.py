"""The tiny Llama compiled three ways: ``torch.compile(backend="tpu_debug")``, ``tpu_debug.compile``
and torchax's ``jax.jit`` of the same module, inference and training, side by side.

    python benchmarks/compile_peers.py [--repeat 15] [--calls 200] [--torchax PYTHON]
    python benchmarks/compile_peers.py --fast-paths [--repeat 15] [--calls 40]

``--torchax PYTHON`` names an interpreter with torchax installed (benchmarks/README.md says
how: ``/work/venv-torchax/bin/python``, say); without it the torchax rows are left out.
torchax renames PyTorch's PrivateUse1 backend to ``jax`` on import, which the ``tpu`` device
already holds, so it runs in a child process of its own (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)
that this script drives round by round: every round times each variant once, the order
rotating, torchax's sample taken in the child between this process's samples. A sample is
``calls`` calls in a row and one sync, as a loop makes them: XLA's CPU client runs a program
on a thread of its own while the caller goes on, so the host's work per call hides under the
program's as long as the two threads run on different cores. After the pause between samples
the OS may put them on one core for a while (then host and program take turns); ``calls``
200 (a sample of 15-150 ms) leaves that start-up to a small part of the sample, where 10-50
calls measure mostly it (benchmarks/README.md has both). Ratios are medians over rounds of
the ratio of two samples of the same round; CPU time is each process's own
(``time.process_time``: XLA's threads included).

- inference: the model in eval mode under ``torch.no_grad()``, tokens -> logits;
- training: forward, cross entropy and backward (``torch.compile``: forward and loss
  compiled, ``loss.backward()`` by autograd after it, a forward and a backward program;
  ``tpu_debug.compile``: a function doing forward, loss and backward, one program; torchax:
  ``jax.jit(jax.value_and_grad(loss))`` of the module's functional form).

Training's ``.grad`` accumulates from call to call, in every variant (torchax returns fresh
gradients); the row "``.grad`` None before each step" is the user's loop after
``optimizer.zero_grad()``, where autograd stores each gradient without an op.

Also measured, beside the default guards: dynamo's guard filters (``torch.compile(...,
options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})``) and
``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (only the guards that tell cache
entries apart run). Both are PyTorch's "unsafe" knobs: they trade dynamo's guarantee that a
changed module or input recompiles for less work per call.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SEED, SEQ = 0, 32


def _model_and_batch():
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    cfg = LlamaConfig()
    torch.manual_seed(SEED)
    model = TinyLlama(cfg)
    torch.manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (1, SEQ + 1))
    return cfg, model, tokens[:, :-1], tokens[:, 1:]


def _cpu_reference():
    import torch
    import torch.nn.functional as F

    cfg, model, x, y = _model_and_batch()
    with torch.no_grad():
        logits = model.eval()(x)
    model.train()
    loss = F.cross_entropy(model(x).reshape(-1, cfg.vocab), y.reshape(-1))
    loss.backward()
    return logits, loss.detach(), [p.grad for p in model.parameters()]


# -- torchax, in a child process ---------------------------------------------------------------


def torchax_child() -> None:
    """Serve timing requests on stdin: ``infer N`` / ``train N`` -> ``wall cpu`` seconds."""
    import jax
    import numpy as np
    import torchax

    cfg, model, x, y = _model_and_batch()
    ref_logits, ref_loss, ref_grads = _cpu_reference()
    states, fwd = torchax.extract_jax(model.eval())
    jx, jy = jax.numpy.asarray(x.numpy()), jax.numpy.asarray(y.numpy())
    infer = jax.jit(lambda s, t: fwd(s, (t,)))
    states_t, fwd_t = torchax.extract_jax(copy.deepcopy(model).train())

    def loss_fn(s, t, target):
        logits = fwd_t(s, (t,)).reshape(-1, cfg.vocab)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jax.numpy.take_along_axis(logp, target.reshape(-1, 1), axis=1).mean()

    train = jax.jit(jax.value_and_grad(loss_fn))
    np.testing.assert_allclose(np.asarray(infer(states, jx)), ref_logits.numpy(), rtol=1e-4, atol=1e-4)
    loss, grads = train(states_t, jx, jy)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-4)
    names = [n for n, _ in model.named_parameters()]
    for n, g in zip(names, ref_grads):
        np.testing.assert_allclose(np.asarray(grads[n]), g.numpy(), rtol=1e-3, atol=1e-5)
    calls = {"infer": lambda: infer(states, jx), "train": lambda: train(states_t, jx, jy)}
    print("ready", flush=True)
    for line in sys.stdin:
        what, n = line.split()
        fn = calls[what]
        for _ in range(2):
            jax.block_until_ready(fn())
        w, c = time.perf_counter(), time.process_time()
        for _ in range(int(n) - 1):
            fn()
        jax.block_until_ready(fn())
        print(f"{time.perf_counter() - w} {time.process_time() - c}", flush=True)


class _Child:
    def __init__(self, python: str) -> None:
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen([python, __file__, "--child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the torchax child did not start (said {line!r}); see its stderr above")

    def sample(self, what: str, calls: int) -> tuple[float, float]:
        self.proc.stdin.write(f"{what} {calls}\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# -- ours, in this process ---------------------------------------------------------------------


def _sampler(fn, stance=None, also=()):
    """sample(calls) -> (wall, cpu) seconds of ``calls`` calls of ``fn`` and one sync, after
    two untimed calls and a sync (as the torchax child samples: XLA's CPU client dispatches
    asynchronously, so an untimed call not waited for would run inside the timing); inside
    ``stance()`` when given. The sync waits for the returned tensor and for the ``.grad`` of
    each of ``also`` (a backward's program ends after the loss's)."""
    from tpu_debug.runtime import lazy
    from tpu_debug.runtime.tensor import to_jax

    def wait(r) -> None:
        for t in (r, *(p.grad for p in also)):
            if t is not None:
                lazy.computed(t)
                to_jax(t).block_until_ready()

    def sample(calls: int) -> tuple[float, float]:
        with (stance() if stance is not None else contextlib.nullcontext()):
            for _ in range(2):
                r = fn()
            wait(r)
            w, c = time.perf_counter(), time.process_time()
            for _ in range(calls - 1):
                fn()
            wait(fn())
            return time.perf_counter() - w, time.process_time() - c
    return sample


def _skip_guards():
    # dynamo runs only the guards that tell its cache entries apart (none, with one entry)
    import torch

    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)


def _guard_filter() -> dict:
    import torch

    return {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


def _inference_variants(model, xd, ref_logits) -> dict:
    import torch

    import tpu_debug

    out = {}
    for name, make in (
        ("torch.compile", lambda m: torch.compile(m, backend="tpu_debug")),
        ("tpu_debug.compile", tpu_debug.compile),
        ("torch.compile, nn-module guards skipped",
         lambda m: torch.compile(m, backend="tpu_debug", options=_guard_filter())),
    ):
        m = copy.deepcopy(model).to("tpu").eval()
        c = make(m)
        with torch.no_grad():
            torch.testing.assert_close(c(xd).cpu(), ref_logits, rtol=1e-4, atol=1e-4)

        def infer(c=c):
            with torch.no_grad():
                return c(xd)

        out[("inference", name)] = _sampler(infer)
        if name == "torch.compile":
            out[("inference", "torch.compile, skip_guard_eval_unsafe")] = _sampler(infer, _skip_guards)
    return out


def _training_variants(cfg, model, xd, yd, ref_loss, ref_grads) -> dict:
    import torch
    import torch.nn.functional as F

    import tpu_debug

    def loss_of(m, x, y):
        return F.cross_entropy(m(x).reshape(-1, cfg.vocab), y.reshape(-1))

    out = {}
    for name in ("torch.compile", "tpu_debug.compile", "torch.compile, nn-module guards skipped",
                 "torch.compile of the whole step, trace_autograd_ops"):
        m = copy.deepcopy(model).to("tpu").train()
        if name == "tpu_debug.compile" or "whole step" in name:
            def step(x, y, m=m):
                loss = loss_of(m, x, y)
                loss.backward()
                return loss.detach()  # a loss returned attached would make dynamo break at backward

            if name == "tpu_debug.compile":
                fn = tpu_debug.compile(step)
            else:
                # dynamo traces loss.backward() (as autograd.grad and the .grad writes) into the
                # graph: one program, as tpu_debug.compile makes; read when a frame is traced
                torch._dynamo.config.trace_autograd_ops = True
                fn = torch.compile(step, backend="tpu_debug")
            train = (lambda fn=fn: fn(xd, yd))
        else:
            opts = {"options": _guard_filter()} if "skipped" in name else {}
            fwd_loss = torch.compile(lambda x, y, m=m: loss_of(m, x, y), backend="tpu_debug", **opts)

            def train(fwd_loss=fwd_loss):
                loss = fwd_loss(xd, yd)
                loss.backward()  # the compiled backward program, run by autograd
                return loss.detach()

        loss = train()
        torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-4, atol=1e-4)
        train()  # a second step sums into .grad (a graph of its own under trace_autograd_ops)
        for p, g in zip(m.parameters(), ref_grads):
            torch.testing.assert_close(p.grad.cpu(), 2 * g, rtol=1e-3, atol=2e-5)
            p.grad = None
        params = list(m.parameters())
        out[("training", name)] = _sampler(train, also=params)
        if name == "torch.compile":
            out[("training", "torch.compile, skip_guard_eval_unsafe")] = _sampler(train, _skip_guards, params)

            def fresh(train=train, params=params):
                # as after optimizer.zero_grad(): autograd hands each gradient to .grad with
                # no op, where accumulating into an existing .grad is a sum per parameter (the
                # step's sums one program, run at the end of the backward)
                for p in params:
                    p.grad = None
                return train()

            out[("training", "torch.compile, .grad None before each step")] = _sampler(fresh, also=params)
    return out


def our_variants() -> dict:
    """{(task, name): sample(calls) -> (wall, cpu)} for this process's variants, each checked
    against PyTorch CPU first."""
    cfg, model, x, y = _model_and_batch()
    ref_logits, ref_loss, ref_grads = _cpu_reference()
    xd, yd = x.to("tpu"), y.to("tpu")
    return {**_inference_variants(model, xd, ref_logits),
            **_training_variants(cfg, model, xd, yd, ref_loss, ref_grads)}


def fast_paths(rounds: int, calls: int) -> None:
    """``--fast-paths``: the runtime's ``torch.compile`` fast path against the path it
    replaces, in one process, rounds interleaved: the calling thread's CPU per call
    (``time.thread_time``, steadier than wall time on a shared machine). The user-style
    training step with ``.grad`` accumulating, its sums into ``.grad`` run as one program
    against one eager add per parameter. Each variant checked against PyTorch CPU first."""
    import torch
    import torch.nn.functional as F

    from tpu_debug.runtime import eager

    cfg, model, x, y = _model_and_batch()
    _, _, ref_grads = _cpu_reference()
    xd, yd = x.to("tpu"), y.to("tpu")
    sums = eager._defer_accumulation
    variants = {}
    m = copy.deepcopy(model).to("tpu").train()
    step = torch.compile(lambda a, b: F.cross_entropy(m(a).reshape(-1, cfg.vocab), b.reshape(-1)),
                         backend="tpu_debug")

    def train():
        loss = step(xd, yd)
        loss.backward()
        return loss.detach()

    train()
    for p, g in zip(m.parameters(), ref_grads):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-3, atol=1e-5)
    for name, defer in (("sums as one program", sums), ("one eager add per parameter", lambda *a: None)):
        variants[("training, .grad accumulating", name)] = (train, defer)
        train()  # its sums' program compiled
        eager._defer_accumulation = defer
        before = [p.grad.cpu() for p in m.parameters()]
        train()  # each step adds the same gradients
        for p, b, g in zip(m.parameters(), before, ref_grads):
            torch.testing.assert_close(p.grad.cpu(), b + g, rtol=1e-3, atol=1e-5)
    eager._defer_accumulation = sums
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    times = {k: [] for k in variants}
    for r in range(rounds):
        for k, (fn, defer) in variants.items():
            eager._defer_accumulation = defer
            n = calls
            for _ in range(3):
                fn()
            start = time.thread_time()
            for _ in range(n):
                fn()
            times[k].append((time.thread_time() - start) / n)
    eager._defer_accumulation = sums
    print("| task | variant | calling thread's CPU per call, µs (median of rounds) | / the path it replaces |")
    print("|---|---|---:|---:|")
    for (task, name), series in times.items():
        # the ratio of the two samples of one round, median over rounds: steadier than either
        other = next(v for (t, n), v in times.items() if t == task and n != name)
        ratio = statistics.median(a / b for a, b in zip(series, other))
        print(f"| {task} | {name} | {statistics.median(series) * 1e6:.1f} | {ratio:.2f}x |")
    print(f"\nload average: {load} before, {' '.join(f'{v:.2f}' for v in os.getloadavg())} after (2 CPUs)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--calls", type=int, help="calls per sample (default 200; 40 with --fast-paths)")
    parser.add_argument("--torchax", metavar="PYTHON", help="an interpreter with torchax installed")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fast-paths", action="store_true",
                        help="the runtime's fast paths against the paths they replace (see fast_paths)")
    args = parser.parse_args(argv)
    if args.child:
        torchax_child()
        return
    if args.fast_paths:
        fast_paths(args.repeat, args.calls or 40)
        return
    args.calls = args.calls or 200
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    child = _Child(args.torchax) if args.torchax else None
    ours = our_variants()
    tasks = {}
    for (task, name), fn in ours.items():
        tasks.setdefault(task, {})[name] = fn
    if child is not None:
        for task, what in (("inference", "infer"), ("training", "train")):
            tasks[task]["torchax jax.jit"] = lambda calls, what=what: child.sample(what, calls)
    base = "tpu_debug.compile"
    try:
        for task, variants in tasks.items():
            names = list(variants)
            wall = {n: [] for n in names}
            cpu = {n: [] for n in names}
            for r in range(args.repeat):
                for n in names[r % len(names):] + names[: r % len(names)]:
                    time.sleep(0.01)
                    w, c = variants[n](args.calls)
                    wall[n].append(w / args.calls)
                    cpu[n].append(c / args.calls)
            print(f"\n{task} (tiny Llama, batch 1 x {SEQ}), ms per call; ratios: median over rounds")
            print(f"| variant | wall ms | CPU ms | / {base}, wall | / {base}, CPU "
                  "| / torchax, wall | / torchax, CPU |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for n in names:
                def ratio(other, series, n=n):
                    if other not in series:
                        return "-"
                    return f"{statistics.median(a / b for a, b in zip(series[n], series[other])):.2f}x"
                print(f"| {n} | {statistics.median(wall[n]) * 1e3:.3f} | {statistics.median(cpu[n]) * 1e3:.3f} "
                      f"| {ratio(base, wall)} | {ratio(base, cpu)} | {ratio('torchax jax.jit', wall)} "
                      f"| {ratio('torchax jax.jit', cpu)} |", flush=True)
    finally:
        if child is not None:
            child.close()
    print(f"\nload average: {load} before, {' '.join(f'{v:.2f}' for v in os.getloadavg())} after (2 CPUs)")


if __name__ == "__main__":
    main()
