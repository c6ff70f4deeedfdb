"""Compiled mode speed: tiny-Llama forward and training steps, compiled `tpu`
vs eager `tpu` vs torch CPU eager, measured in this one process.

    python benchmarks/compiled.py [--repeat 20]

Each row also runs the same computation written directly in JAX and jitted (the
"jax.jit floor": the XLA program any jitted path, torchax's included, would run).

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


def _time(fn, repeat: int, sync) -> float:
    for _ in range(3):
        sync(fn())
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        sync(fn())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


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


def jax_train_step(fwd, params: dict, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """One jitted program: loss, gradients and torch.optim.AdamW's update (its defaults)."""
    import jax
    import jax.numpy as jnp

    state = {"p": params, "m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
             "t": jnp.zeros((), jnp.float32)}

    def step(state, x, y):
        loss, g = jax.value_and_grad(lambda p: _jax_cross_entropy(fwd(p, x), y))(state["p"])
        t = state["t"] + 1
        m = jax.tree.map(lambda m, g: betas[0] * m + (1 - betas[0]) * g, state["m"], g)
        v = jax.tree.map(lambda v, g: betas[1] * v + (1 - betas[1]) * g * g, state["v"], g)
        c1, c2 = 1 - betas[0] ** t, 1 - betas[1] ** t

        def update(p, m, v):
            p = p * (1 - lr * weight_decay)
            return p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)

        return {"p": jax.tree.map(update, state["p"], m, v), "m": m, "v": v, "t": t}, loss

    jitted = jax.jit(step, donate_argnums=0)
    box = [state]

    def run(x, y):
        box[0], loss = jitted(box[0], x, y)
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
        return {
            "torch CPU eager": _time(lambda: cpu(tokens), repeat, _sync),
            "tpu eager": _time(lambda: dev(tdev), repeat, _sync),
            "tpu compiled": _time(lambda: comp(tdev), repeat, _sync),
            "jax.jit floor": _time(lambda: ref(params, jtokens), repeat, _block),
        }


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
    # production style: forward and loss compiled together (one forward and one backward
    # program), the optimizer step compiled as its own program
    loss_c = tpu_debug.compile(lambda x, y: loss_fn(dev_c(x), y))
    step_c = tpu_debug.compile(opt_c.step)
    jx, jy = np.asarray(x.numpy()), np.asarray(y.numpy(), np.int32)
    if jx.dtype == np.int64:
        jx = jx.astype(np.int32)
    floor = jax_train_step(jax_fwd(cpu), _jax_params(cpu))

    def eager_step(model, opt, x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def compiled_step():
        opt_c.zero_grad()
        loss = loss_c(xd, yd)
        loss.backward()
        step_c()
        return loss

    # the floor trains the same model: its first loss is PyTorch's
    reference = loss_fn(copy.deepcopy(cpu)(x), y).item()
    np.testing.assert_allclose(float(floor(jx, jy)), reference, rtol=1e-4)
    return {
        "torch CPU eager": _time(lambda: eager_step(cpu, opt_cpu, x, y), repeat, _sync),
        "tpu eager": _time(lambda: eager_step(dev, opt_dev, xd, yd), repeat, _sync),
        "tpu compiled": _time(compiled_step, repeat, _sync),
        "jax.jit floor": _time(lambda: floor(jx, jy), repeat, _block),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
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

    rows = {
        "tiny-Llama forward": llama_forward(args.repeat),
        "MLP train step (fwd+bwd+AdamW)": train_steps(
            make_mlp, jax_mlp, (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy, args.repeat
        ),
        "tiny-Llama train step (fwd+bwd+AdamW)": train_steps(
            make_llama, jax_llama, (tokens[:, :-1], tokens[:, 1:]), llama_loss, args.repeat
        ),
    }
    print("| workload | torch CPU eager (ms) | tpu eager (ms) | tpu compiled (ms) | jax.jit floor (ms) "
          "| CPU / compiled | CPU / floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        cpu_ms, comp_ms, floor_ms = r["torch CPU eager"], r["tpu compiled"], r["jax.jit floor"]
        print(f"| {name} | {cpu_ms:.2f} | {r['tpu eager']:.2f} | {comp_ms:.2f} | {floor_ms:.2f} "
              f"| {cpu_ms / comp_ms:.2f}x | {cpu_ms / floor_ms:.2f}x |")
    print(f"\nload average {' '.join(f'{v:.1f}' for v in os.getloadavg())} (2 CPUs)")


if __name__ == "__main__":
    main()
