"""Compiled mode speed: tiny-Llama forward and training steps, compiled `tpu`
vs eager `tpu` vs torch CPU eager, measured in this one process.

    python benchmarks/compiled.py [--repeat 20] [--rows llama-fwd,mlp-train,llama-train]

Each row also runs the same computation written directly in JAX and jitted (the
"jax.jit floor": the XLA program any jitted path, torchax's included, would run).
Training steps are compiled two ways: "model" (the model and loss compiled,
``loss.backward()`` outside: a forward and a backward program, autograd between
them) and "step" (forward, loss and ``loss.backward()`` in one compiled function:
one program); the AdamW step is compiled as its own program in both. A third,
"one program", compiles the whole step (``zero_grad``, forward, loss, ``backward`` and
``opt.step()`` in one function): a single XLA program, parameters and optimizer state
donated to it.

Tiny Llama: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads,
vocab 256; batch 1, seq 32. MLP: 256 -> 512 -> 512 -> 10, batch 64.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402


# the floor carrying the state PyTorch's step keeps (see jax_train_step's torch_state)
STATE_FLOOR = "jax.jit floor, PyTorch's state"


def _time_all(variants: dict, repeat: int, calls: int = 5) -> dict[str, float]:
    """Median ms per call of each variant: ``{name: (fn, sync)}``, with the median
    ratios of each to torch CPU eager ("CPU / name") and to the jax.jit floor ("name /
    floor", also in process CPU time: "name / floor CPU", all threads' CPU time, less
    moved by other jobs on the machine than the wall clock).

    Interleaved (one sample of every variant per round, the order rotating), so load
    from other jobs on the machine hits all of them alike. A sample is ``calls``
    calls in a row and one sync at the end, as a training loop runs them: device work
    of one call may overlap the host work of the next."""
    names = list(variants)
    for fn, sync in variants.values():
        for _ in range(3):
            sync(fn())
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu_samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, sync = variants[name]
            # XLA's and PyTorch's worker threads spin a while after their last task: let
            # the previous variant's go idle, then warm this one's up, untimed
            time.sleep(0.02)
            for _ in range(2):
                sync(fn())
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(calls - 1):
                fn()
            sync(fn())
            samples[name].append((time.perf_counter() - start) / calls)
            cpu_samples[name].append((time.process_time() - cpu_start) / calls)
    result = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
    # ratios to torch CPU eager per round (samples taken within ~0.1 s of each other),
    # then their median: steadier than a ratio of medians on a machine whose speed drifts
    base = samples["torch CPU eager"]
    floor, cpu_floor = samples["jax.jit floor"], cpu_samples["jax.jit floor"]
    for n, v in samples.items():
        result["CPU / " + n] = statistics.median(b / x for b, x in zip(base, v))
        result[n + " / floor"] = statistics.median(x / f for x, f in zip(v, floor))
        result[n + " / floor CPU"] = statistics.median(x / f for x, f in zip(cpu_samples[n], cpu_floor))
        if STATE_FLOOR in samples:
            result[n + " / state floor"] = statistics.median(x / f for x, f in zip(v, samples[STATE_FLOOR]))
    return result


def _block(out):
    return out.block_until_ready()


def _sync(out):
    if isinstance(out, torch.Tensor) and out.device.type == "tpu":
        from tpu_debug.runtime.tensor import to_jax

        to_jax(out).block_until_ready()
    return out


# ---- the floor: the same computations written directly in JAX and jitted ----------------
#
# The XLA programs any jitted JAX path (torchax's included) runs for these models, with no
# PyTorch around them: the floor for our compiled mode on this machine. Each is checked
# against PyTorch on CPU before it is timed.


def _jax_params(model: nn.Module) -> dict:
    import jax.numpy as jnp

    return {k: jnp.asarray(v.detach().numpy()) for k, v in model.named_parameters()}


def jax_llama(model: TinyLlama):
    """fwd(params, tokens) -> logits of the tiny Llama."""
    import jax
    import jax.numpy as jnp

    cfg = model.cfg
    cos_all, sin_all = jnp.asarray(model.cos.numpy()), jnp.asarray(model.sin.numpy())
    hd, rep = cfg.hidden // cfg.heads, cfg.heads // cfg.kv_heads

    def norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.eps) * w

    def rot(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def fwd(p, tokens):
        b, s = tokens.shape
        x = p["embed.weight"][tokens]
        cos, sin = cos_all[:s], sin_all[:s]
        mask = jnp.tril(jnp.ones((s, s), bool))
        for i in range(cfg.layers):
            pre = f"blocks.{i}."
            h = norm(x, p[pre + "attn_norm.weight"])
            q = (h @ p[pre + "attn.q.weight"].T).reshape(b, s, cfg.heads, hd).transpose(0, 2, 1, 3)
            k = (h @ p[pre + "attn.k.weight"].T).reshape(b, s, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
            v = (h @ p[pre + "attn.v.weight"].T).reshape(b, s, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
            q, k = rot(q, cos, sin), rot(k, cos, sin)
            k, v = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
            att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(hd), -jnp.inf)
            out = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)
            x = x + out @ p[pre + "attn.o.weight"].T
            h = norm(x, p[pre + "mlp_norm.weight"])
            gated = jax.nn.silu(h @ p[pre + "mlp.gate.weight"].T) * (h @ p[pre + "mlp.up.weight"].T)
            x = x + gated @ p[pre + "mlp.down.weight"].T
        return norm(x, p["norm.weight"]) @ p["lm_head.weight"].T

    return fwd


def jax_mlp(model: nn.Sequential):
    """fwd(params, x) -> logits of the 256-512-512-10 ReLU MLP."""
    import jax

    def fwd(p, x):
        h = jax.nn.relu(x @ p["0.weight"].T + p["0.bias"])
        h = jax.nn.relu(h @ p["2.weight"].T + p["2.bias"])
        return h @ p["4.weight"].T + p["4.bias"]

    return fwd


def _jax_cross_entropy(logits, target):
    import jax
    import jax.numpy as jnp

    logits = logits.reshape(-1, logits.shape[-1])
    target = target.reshape(-1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=1))


def jax_train_step(fwd, params: dict, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                   torch_state: bool = False):
    """One jitted program: loss, gradients and torch.optim.AdamW's update (its defaults).

    ``torch_state``: the state PyTorch's step keeps, which the one-program step carries:
    a step count per parameter (AdamW's, ``capturable=True``) and the gradients returned
    (they stay in ``.grad`` after the step). Without it, one step count and no gradients
    out: the least a jitted AdamW step can be."""
    import jax
    import jax.numpy as jnp

    count = {k: jnp.zeros((), jnp.float32) for k in params} if torch_state else jnp.zeros((), jnp.float32)
    state = {"p": params, "m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
             "t": count}

    def step(state, x, y):
        loss, g = jax.value_and_grad(lambda p: _jax_cross_entropy(fwd(p, x), y))(state["p"])
        t = jax.tree.map(lambda t: t + 1, state["t"])
        m = jax.tree.map(lambda m, g: betas[0] * m + (1 - betas[0]) * g, state["m"], g)
        v = jax.tree.map(lambda v, g: betas[1] * v + (1 - betas[1]) * g * g, state["v"], g)

        def update(p, m, v, t):
            c1, c2 = 1 - betas[0] ** t, 1 - betas[1] ** t
            p = p * (1 - lr * weight_decay)
            return p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)

        ts = t if torch_state else jax.tree.map(lambda _: t, state["p"])
        new = {"p": jax.tree.map(update, state["p"], m, v, ts), "m": m, "v": v, "t": t}
        return (new, loss, g) if torch_state else (new, loss)

    jitted = jax.jit(step, donate_argnums=0)
    box = [state]

    def run(x, y):
        box[0], loss, *grads = jitted(box[0], x, y)
        return loss

    return run


def llama_forward(repeat: int) -> dict[str, float]:
    cfg = LlamaConfig()
    torch.manual_seed(0)
    cpu = TinyLlama(cfg).eval()
    dev = copy.deepcopy(cpu).to("tpu")
    comp = tpu_debug.compile(dev)
    tokens = torch.randint(0, cfg.vocab, (1, 32))
    tdev = tokens.to("tpu")
    import jax

    params = _jax_params(cpu)
    ref = jax.jit(jax_llama(cpu))
    jtokens = np.asarray(tokens.numpy(), np.int32)
    with torch.no_grad():
        # the reference computes the same function (checked against PyTorch CPU)
        got = torch.from_numpy(np.array(ref(params, jtokens)))
        torch.testing.assert_close(got, cpu(tokens), rtol=1e-4, atol=1e-4)
        return _time_all({
            "torch CPU eager": (lambda: cpu(tokens), _sync),
            "tpu eager": (lambda: dev(tdev), _sync),
            "tpu compiled": (lambda: comp(tdev), _sync),
            "jax.jit floor": (lambda: ref(params, jtokens), _block),
        }, repeat)


def train_steps(make, jax_fwd, batch, loss_fn, repeat: int) -> dict[str, float]:
    cpu = make()
    dev = copy.deepcopy(cpu).to("tpu")
    dev_c = copy.deepcopy(cpu).to("tpu")
    x, y = batch
    xd, yd = x.to("tpu"), y.to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    # capturable: the step counts live on the device. Without it AdamW keeps them on the
    # host, and every step of a compiled optimizer copies each one back: a sync per parameter
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-3, capturable=True)
    opt_c = torch.optim.AdamW(dev_c.parameters(), lr=1e-3, capturable=True)
    # the model compiled (the usual style): one forward and one backward program, the
    # backward run by autograd after the compiled forward returns; the optimizer step
    # compiled as its own program
    loss_c = tpu_debug.compile(lambda x, y: loss_fn(dev_c(x), y))
    step_c = tpu_debug.compile(opt_c.step)
    # the step compiled: forward, loss and backward in one function, so one program
    # computes loss and gradients (tpu_debug.compile traces loss.backward() into the graph)
    dev_s = copy.deepcopy(cpu).to("tpu")
    opt_s = torch.optim.AdamW(dev_s.parameters(), lr=1e-3, capturable=True)

    def fwd_bwd(x, y):
        loss = loss_fn(dev_s(x), y)
        loss.backward()
        return loss.detach()

    fwd_bwd_c = tpu_debug.compile(fwd_bwd)
    step_s = tpu_debug.compile(opt_s.step)
    # the whole step compiled: zero_grad, forward, loss, backward and the AdamW step in
    # one function, one program; parameters and optimizer state donated to it
    dev_f = copy.deepcopy(cpu).to("tpu")
    opt_f = torch.optim.AdamW(dev_f.parameters(), lr=1e-3, capturable=True)

    def full_step(x, y):
        opt_f.zero_grad()
        loss = loss_fn(dev_f(x), y)
        loss.backward()
        opt_f.step()
        return loss.detach()

    full_c = tpu_debug.compile(full_step)
    jx, jy = np.asarray(x.numpy()), np.asarray(y.numpy(), np.int32)
    if jx.dtype == np.int64:
        jx = jx.astype(np.int32)
    floor = jax_train_step(jax_fwd(cpu), _jax_params(cpu))
    state_floor = jax_train_step(jax_fwd(cpu), _jax_params(cpu), torch_state=True)

    def eager_step(model, opt, x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def compiled_model_step():
        opt_c.zero_grad()
        loss = loss_c(xd, yd)
        loss.backward()
        step_c()
        return loss

    def compiled_fn_step():
        opt_s.zero_grad()
        loss = fwd_bwd_c(xd, yd)
        step_s()
        return loss

    # the floor trains the same model: its first loss is PyTorch's; so do both compiled
    # styles (their first step's loss, and parameters after it, against PyTorch's)
    ref_model = copy.deepcopy(cpu)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3)
    reference = eager_step(ref_model, ref_opt, x, y).item()
    np.testing.assert_allclose(float(floor(jx, jy)), reference, rtol=1e-4)
    np.testing.assert_allclose(float(state_floor(jx, jy)), reference, rtol=1e-4)
    for step, model in ((compiled_model_step, dev_c), (compiled_fn_step, dev_s), (lambda: full_c(xd, yd), dev_f)):
        np.testing.assert_allclose(step().item(), reference, rtol=1e-4)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-4)  # AdamW: lr 1e-3 per step
    parts = host_split(full_c, lambda: full_c(xd, yd), lambda: state_floor(jx, jy))
    result = _time_all({
        "torch CPU eager": (lambda: eager_step(cpu, opt_cpu, x, y), _sync),
        "tpu eager": (lambda: eager_step(dev, opt_dev, xd, yd), _sync),
        "tpu compiled": (compiled_model_step, _sync),
        "tpu compiled step": (compiled_fn_step, _sync),
        "tpu compiled one program": (lambda: full_c(xd, yd), _sync),
        "jax.jit floor": (lambda: floor(jx, jy), _block),
        STATE_FLOOR: (lambda: state_floor(jx, jy), _block),
    }, repeat)
    result["host"] = parts
    return result


def host_split(wrapper, step, floor, calls: int = 2000) -> dict[str, float]:
    """Where the calling thread's CPU time goes in one call of the one-program step (µs
    per call, the median of five runs of ``calls`` calls), and the floor's per call.

    Parts, measured by timing three nested calls with the thread's CPU clock:
    ``tpu_debug.compile``'s wrapper (the optimizer hooks, dynamo's
    ``trace_autograd_ops``), PyTorch (dynamo's guards and transformed frame,
    AOTAutograd's runtime wrapper: the dynamo-compiled function's time less the
    graph's call), the runtime (our graph call less the JAX call: reading ~90
    input payloads, making the output tensors, writing the new state back) and JAX's
    C++ call of the executable. The clocks themselves add about 1 µs per call."""
    from tpu_debug.runtime import compiled as runtime

    acc = {"dynamo": 0, "graph": 0, "jax": 0}

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += time.thread_time_ns() - start
        return call

    cell = wrapper.__closure__[wrapper.__code__.co_freevars.index("compiled")]
    compiled, graph_call, run = cell.cell_contents, runtime.CompiledGraph.__call__, runtime.CompiledGraph._run
    cell.cell_contents = timed("dynamo", compiled)
    runtime.CompiledGraph.__call__ = timed("graph", graph_call)
    runtime.CompiledGraph._run = timed("jax", run)
    runs = []
    try:
        for fn in (step, floor) * 5:
            for value in acc:
                acc[value] = 0
            start = time.thread_time_ns()
            for _ in range(calls):
                out = fn()
            elapsed = time.thread_time_ns() - start
            _block(out) if fn is floor else _sync(out)
            runs.append((fn is floor, elapsed, dict(acc)))
    finally:
        cell.cell_contents = compiled
        runtime.CompiledGraph.__call__, runtime.CompiledGraph._run = graph_call, run

    def median(values):
        return statistics.median(values) / calls / 1e3

    ours = [(t, a) for is_floor, t, a in runs if not is_floor]
    return {
        "total": median(t for t, _ in ours),
        "tpu_debug.compile wrapper": median(t - a["dynamo"] for t, a in ours),
        "PyTorch (dynamo, AOTAutograd)": median(a["dynamo"] - a["graph"] for _, a in ours),
        "runtime": median(a["graph"] - a["jax"] for _, a in ours),
        "JAX call": median(a["jax"] for _, a in ours),
        "floor": median(t for is_floor, t, _ in runs if is_floor),
    }


def _print_tables(rows: dict) -> None:
    columns = ("torch CPU eager", "tpu eager", "tpu compiled", "tpu compiled step", "tpu compiled one program",
               "jax.jit floor", STATE_FLOOR)
    heads = ("torch CPU eager", "tpu eager", "tpu compiled: model", "tpu compiled: step",
             "tpu compiled: one program", "jax.jit floor", STATE_FLOOR)

    def cell(r, key, fmt):
        return fmt.format(r[key]) if key in r else "-"

    print("| workload | " + " | ".join(f"{h} (ms)" for h in heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(cell(r, c, "{:.2f}") for c in columns) + " |")
    print("\nms: median per call (wall clock)\n")
    ratio_heads = ("CPU / compiled model", "CPU / compiled step", "CPU / one program", "CPU / floor",
                   "one program / floor", "one program / floor, CPU time", "one program / floor with PyTorch's state")
    keys = ("CPU / tpu compiled", "CPU / tpu compiled step", "CPU / tpu compiled one program", "CPU / jax.jit floor",
            "tpu compiled one program / floor", "tpu compiled one program / floor CPU",
            "tpu compiled one program / state floor")
    print("| workload | " + " | ".join(ratio_heads) + " |")
    print("|---|" + "---:|" * len(ratio_heads))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(cell(r, k, "{:.2f}x") for k in keys) + " |")
    print("\nratios: median over rounds of the ratio within a round; CPU time: the process's, all threads")
    parts = ("total", "tpu_debug.compile wrapper", "PyTorch (dynamo, AOTAutograd)", "runtime", "JAX call", "floor")
    print("\nOne program: the calling thread's CPU time per call (µs)\n")
    print("| workload | " + " | ".join(parts) + " |")
    print("|---|" + "---:|" * len(parts))
    for name, r in rows.items():
        if "host" in r:
            print(f"| {name} | " + " | ".join(f"{r['host'][k]:.1f}" for k in parts) + " |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rows", default="llama-fwd,mlp-train,llama-train",
                        help="comma-separated subset of: llama-fwd, mlp-train, llama-train")
    args = parser.parse_args(argv)
    wanted = set(args.rows.split(","))
    cfg = LlamaConfig()

    def make_mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def make_llama():
        torch.manual_seed(0)
        return TinyLlama(cfg)

    tokens = torch.randint(0, cfg.vocab, (1, 33))

    def llama_loss(logits, target):
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), target.reshape(-1))

    rows = {}
    if "llama-fwd" in wanted:
        rows["tiny-Llama forward"] = llama_forward(args.repeat)
    if "mlp-train" in wanted:
        rows["MLP train step (fwd+bwd+AdamW)"] = train_steps(
            make_mlp, jax_mlp, (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy, args.repeat
        )
    if "llama-train" in wanted:
        rows["tiny-Llama train step (fwd+bwd+AdamW)"] = train_steps(
            make_llama, jax_llama, (tokens[:, :-1], tokens[:, 1:]), llama_loss, args.repeat
        )
    _print_tables(rows)
    print(f"\nload average {' '.join(f'{v:.1f}' for v in os.getloadavg())} (2 CPUs)")


if __name__ == "__main__":
    main()
