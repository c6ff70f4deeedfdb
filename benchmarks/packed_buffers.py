"""A training step's parameters and optimizer state passed to XLA as ~70 arrays, or packed into few.

    python benchmarks/packed_buffers.py [--repeat 15] [--steps 40] [--targets v5e,v6e]

The tiny Llama's step (forward, cross entropy, backward, AdamW; batch 1 x 32) as the runtime
lowers it (``tpu_debug.fit.trace_step``): 21 parameters, 2 buffers, their 42 AdamW
moments, the step count, tokens and labels in, the loss and the 64 new values out, each updated
value donated (written in place). Three ways to hand that state to the program:

- ``separate``: one array per parameter and moment, as the runtime passes them (68 inputs,
  65 outputs);
- ``by shape``: the arrays of one role (parameters, exp_avg, exp_avg_sq), shape and dtype
  stacked, ``[k, *shape]``, one array per group (each parameter keeps its own 2-D layout: the
  form a scan over layers takes);
- ``flat``: every float32 array raveled into one 1-D buffer per role (parameters, exp_avg,
  exp_avg_sq), sliced and reshaped inside the program, the new values concatenated back.

The packed variants keep the packed buffers across steps (what packing would need of the
runtime: parameters living in a shared buffer), so a step pays no packing on the host. The
separate layout's first step is checked against PyTorch on CPU (the loss, and every parameter
after ``loss.backward()`` and ``torch.optim.AdamW``'s step), each packed one's against it (the
same float32 operations on the same values; XLA may fuse and so order a reduction
differently, so a relative 1e-5).

On this machine (XLA's CPU client), per variant, rounds interleaved: the host's CPU for one
call (the calling thread, the call waited for before the next so the queue never blocks it)
and the wall time per step of ``--steps`` steps in a row (the calls asynchronous, one wait at
the end), as a training loop runs. For each TPU target (``--targets``, deviceless; needs
libtpu): the TPU compiler's own figures for the same three programs: the bytes its instructions
access, the HBM the program needs, the copies and transposes its optimized HLO holds, and the
roofline's bound on the step (``runtime.target.roofline``: max of the compiler's flops at the
matrix units' peak and its bytes at HBM bandwidth).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

SEQ = 32


def traced_step():
    import torch
    import torch.nn.functional as F
    from tpu_debug.fit import trace_step

    from examples.models.tiny_llama import LlamaConfig, TinyLlama

    cfg = LlamaConfig()
    torch.manual_seed(0)
    model = TinyLlama(cfg)
    tokens = torch.randint(0, cfg.vocab, (1, SEQ + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    traced = trace_step(model, (x,), train=True, targets=(y,),
                        loss_fn=lambda logits, labels: F.cross_entropy(logits.flatten(0, -2), labels.flatten()))
    values = [*(p.detach().numpy().copy() for p in model.parameters()), *(b.numpy() for b in model.buffers())]
    n_p = sum(1 for _ in model.parameters())
    values += [np.zeros_like(v) for v in values[:n_p]] * 2 + [np.zeros((), np.float32), x.numpy(), y.numpy()]
    # the oracle: the same step by PyTorch on CPU (loss.backward(), torch.optim.AdamW's defaults)
    loss = F.cross_entropy(model(x).flatten(0, -2), y.flatten())
    loss.backward()
    torch.optim.AdamW(model.parameters()).step()
    expected = {0: (loss.detach().numpy(), None),
                **{1 + i: (p.detach().numpy(), p.grad.numpy()) for i, p in enumerate(model.parameters())}}
    return traced, values, expected


class Packing:
    """How a variant lays the donated state out: ``groups`` (lists of flat input indices, one
    packed array each), the remaining inputs in order, and where each donated input's new
    value is among the step's outputs."""

    def __init__(self, traced, how: str) -> None:
        specs = traced.specs
        self.how, self.specs = how, specs
        state = [i for i in traced.donate if specs[i].shape]  # the scalar step count stays apart
        # the step returns (loss, *new values in donate order)
        self.out_of = {i: 1 + j for j, i in enumerate(traced.donate)}
        groups: dict = {}
        if how == "separate":
            self.groups = []
        else:
            n_p = len(traced.donate) // 3
            for i in state:
                role = traced.donate.index(i) // n_p  # parameters, exp_avg, exp_avg_sq
                key = (role, specs[i].dtype) if how == "flat" else (role, specs[i].shape, specs[i].dtype)
                groups.setdefault(key, []).append(i)
            self.groups = list(groups.values())
        packed = {i for g in self.groups for i in g}
        self.rest = [i for i in range(len(specs)) if i not in packed]
        self.rest_out = sorted(set(range(1 + len(traced.donate))) - {self.out_of[i] for i in packed})
        self.step = traced.function()

    def pack(self, values: list) -> list:
        arrays = []
        for g in self.groups:
            if self.how == "flat":
                arrays.append(np.concatenate([values[i].ravel() for i in g]))
            else:
                arrays.append(np.stack([values[i] for i in g]))
        return [*arrays, *(values[i] for i in self.rest)]

    def _unpacked(self, arrays: list) -> dict:
        """{flat input index: value} of the packed groups at the head of ``arrays``."""
        out = {}
        for g, buf in zip(self.groups, arrays):
            offset = 0
            for j, i in enumerate(g):
                if self.how == "flat":
                    size = math.prod(self.specs[i].shape)
                    out[i] = buf[offset:offset + size].reshape(self.specs[i].shape)
                    offset += size
                else:
                    out[i] = buf[j]
        return out

    def unpack(self, arrays: list) -> dict:
        """{flat input index: value} of a packed argument list."""
        return {**self._unpacked(arrays), **dict(zip(self.rest, arrays[len(self.groups):]))}

    def outputs(self, outs: list) -> dict:
        """{index among the unpacked step's outputs: value} of a packed step's outputs."""
        packed = {self.out_of[i]: v for i, v in self._unpacked(outs).items()}
        return {**packed, **dict(zip(self.rest_out, outs[len(self.groups):]))}

    def function(self):
        def packed_step(*arrays):
            by_index = self.unpack(list(arrays))
            outs = self.step(*(by_index[i] for i in range(len(self.specs))))
            new = []
            for g in self.groups:
                values = [outs[self.out_of[i]] for i in g]
                new.append(jnp.concatenate([v.ravel() for v in values]) if self.how == "flat" else jnp.stack(values))
            return (*new, *(outs[k] for k in self.rest_out))

        donate = list(range(len(self.groups)))
        donate += [len(self.groups) + r for r, i in enumerate(self.rest) if i in self.out_of]
        return packed_step, tuple(donate)

    def feed(self, args: list, outs) -> list:
        """The next step's arguments: the new state in place of the old."""
        n = len(self.groups)
        nxt = list(outs[:n])
        rest_new = dict(zip(self.rest_out, outs[n:]))
        for r, i in enumerate(self.rest):
            nxt.append(rest_new[self.out_of[i]] if i in self.out_of else args[n + r])
        return nxt


def _against_cpu(got: dict, expected: dict) -> None:
    """The step's loss and new parameters against PyTorch's on CPU. Gradients differ by about
    1e-6 relative (float32 sums in another order); AdamW's first update is lr * g / (|g| + eps)
    (lr 1e-3, eps 1e-8): where |g| is well above eps it is lr * sign(g) whatever that error,
    so those elements match to float32 rounding, and where |g| is near eps the update moves
    with it: each side's update is at most lr, so the two differ by at most 2 lr."""
    loss, _ = expected[0]
    np.testing.assert_allclose(got[0], loss, rtol=1e-5)
    for k, (param, grad) in expected.items():
        if grad is None:
            continue
        sure = np.abs(grad) > 1e-5
        np.testing.assert_allclose(got[k][sure], param[sure], rtol=1e-5, atol=1e-7)
        assert np.all(np.abs(got[k] - param) <= 2e-3), k


def cpu_variants(traced, values, expected: dict, steps: int):
    variants = {}
    reference = None
    for how in ("separate", "by shape", "flat"):
        packing = Packing(traced, how)
        fn, donate = packing.function()
        jitted = jax.jit(fn, donate_argnums=donate)
        with jax.enable_x64(True):
            args = [jnp.asarray(a) for a in packing.pack(values)]
            outs = jitted(*args)
            got = packing.outputs(list(outs))
            if reference is None:
                reference = {k: np.asarray(v) for k, v in got.items()}
                _against_cpu(reference, expected)
            for k, v in got.items():
                np.testing.assert_allclose(np.asarray(v), reference[k], rtol=1e-5, atol=1e-7)
        state = {"args": packing.feed(args, outs)}

        def call(packing=packing, jitted=jitted, state=state):
            outs = jitted(*state["args"])
            state["args"] = packing.feed(state["args"], outs)
            return outs

        def host(call=call) -> float:
            with jax.enable_x64(True):
                jax.block_until_ready(call())
                samples = []
                for _ in range(20):
                    t = time.thread_time_ns()
                    outs = call()
                    samples.append(time.thread_time_ns() - t)
                    jax.block_until_ready(outs)
            return statistics.median(samples) / 1e3

        def loop(call=call) -> float:
            with jax.enable_x64(True):
                jax.block_until_ready(call())
                t = time.perf_counter()
                for _ in range(steps):
                    outs = call()
                jax.block_until_ready(outs)
            return (time.perf_counter() - t) / steps * 1e6

        inputs = len(packing.groups) + len(packing.rest)
        variants[how] = (inputs, len(outs), host, loop)
    return variants


def tpu_figures(traced, target: str) -> dict:
    from tpu_debug.runtime.target import compile_for_target, roofline

    out = {}
    for how in ("separate", "by shape", "flat"):
        packing = Packing(traced, how)
        fn, donate = packing.function()
        specs = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in packing.pack(
            [np.zeros(s.shape, s.dtype) for s in traced.specs])]
        result = compile_for_target(fn, specs, target, donate_argnums=donate, x64=True, cache=False)
        if not result.ok:
            raise RuntimeError(f"{how} on {target}: {result.error}")
        moves = len(re.findall(r"= \S+ (?:copy|transpose)\(", result.hlo or ""))
        out[how] = (roofline(result).seconds, result.cost.bytes_accessed, result.memory.total_bytes, moves)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--targets", default="v5e,v6e", help="TPU targets to compile for ('' for none)")
    args = parser.parse_args(argv)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    traced, values, expected = traced_step()
    variants = cpu_variants(traced, values, expected, args.steps)
    hosts = {n: [] for n in variants}
    loops = {n: [] for n in variants}
    names = list(variants)
    for r in range(args.repeat):
        for n in names[r % len(names):] + names[:r % len(names)]:
            hosts[n].append(variants[n][2]())
            loops[n].append(variants[n][3]())
    print(f"\nCPU (XLA's CPU client), median of {args.repeat} rounds")
    print("| variant | inputs | outputs | host CPU per call, µs | / separate | wall per step, µs | / separate |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        h = statistics.median(hosts[n])
        w = statistics.median(loops[n])
        hr = statistics.median(a / b for a, b in zip(hosts[n], hosts["separate"]))
        wr = statistics.median(a / b for a, b in zip(loops[n], loops["separate"]))
        print(f"| {n} | {variants[n][0]} | {variants[n][1]} | {h:.1f} | {hr:.2f}x | {w:.1f} | {wr:.2f}x |")
    print(f"\nload average: {load} before, {' '.join(f'{v:.2f}' for v in os.getloadavg())} after")
    for target in filter(None, args.targets.split(",")):
        figures = tpu_figures(traced, target)
        base = figures["separate"]
        print(f"\n{target}: the TPU compiler's figures")
        print("| variant | roofline step, µs | / separate | bytes accessed | / separate | HBM needed, KiB "
              "| copies + transposes |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n, (sec, accessed, hbm, moves) in figures.items():
            est = f"{sec * 1e6:.2f} | {sec / base[0]:.2f}x" if sec and base[0] else "- | -"
            print(f"| {n} | {est} | {accessed:,.0f} | {accessed / base[1]:.2f}x | {hbm / 1024:.0f} | {moves} |")


if __name__ == "__main__":
    main()
