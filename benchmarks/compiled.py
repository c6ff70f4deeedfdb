"""Compiled mode speed: tiny-Llama forward and training steps, compiled `tpu`
vs eager `tpu` vs torch CPU eager, measured in this one process.

    python benchmarks/compiled.py [--repeat 20]

Tiny Llama: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads,
vocab 256; batch 1, seq 32. MLP: 256 -> 512 -> 512 -> 10, batch 64.
"""

from __future__ import annotations

import argparse
import copy
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


def jax_llama_forward(model: TinyLlama):
    """The same forward written directly in JAX and jitted: the XLA program any
    jitted JAX path (torchax's included) runs for this model, with no PyTorch around it.
    Its time is the floor for our compiled mode on this machine."""
    import jax
    import jax.numpy as jnp

    cfg = model.cfg
    p = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    p["cos"], p["sin"] = jnp.asarray(model.cos.numpy()), jnp.asarray(model.sin.numpy())
    hd, rep = cfg.hidden // cfg.heads, cfg.heads // cfg.kv_heads

    def norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.eps) * w

    def rot(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def fwd(p, tokens):
        b, s = tokens.shape
        x = p["embed.weight"][tokens]
        cos, sin = p["cos"][:s], p["sin"][:s]
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

    jitted = jax.jit(fwd)
    return lambda tokens: jitted(p, tokens)


def llama_forward(repeat: int) -> dict[str, float]:
    cfg = LlamaConfig()
    torch.manual_seed(0)
    cpu = TinyLlama(cfg).eval()
    dev = copy.deepcopy(cpu).to("tpu")
    comp = tpu_debug.compile(dev)
    tokens = torch.randint(0, cfg.vocab, (1, 32))
    tdev = tokens.to("tpu")
    ref = jax_llama_forward(cpu)
    jtokens = np.asarray(tokens.numpy(), np.int32)
    with torch.no_grad():
        # the reference computes the same function (checked against PyTorch CPU)
        torch.testing.assert_close(torch.from_numpy(np.asarray(ref(jtokens))), cpu(tokens), rtol=1e-4, atol=1e-4)
        return {
            "torch CPU eager": _time(lambda: cpu(tokens), repeat, _sync),
            "tpu eager": _time(lambda: dev(tdev), repeat, _sync),
            "tpu compiled": _time(lambda: comp(tdev), repeat, _sync),
            "jax.jit reference": _time(lambda: ref(jtokens), repeat, _block),
        }


def train_steps(make, batch, loss_fn, repeat: int) -> dict[str, float]:
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

    return {
        "torch CPU eager": _time(lambda: eager_step(cpu, opt_cpu, x, y), repeat, _sync),
        "tpu eager": _time(lambda: eager_step(dev, opt_dev, xd, yd), repeat, _sync),
        "tpu compiled": _time(compiled_step, repeat, _sync),
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
            make_mlp, (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy, args.repeat
        ),
        "tiny-Llama train step (fwd+bwd+AdamW)": train_steps(
            make_llama, (tokens[:, :-1], tokens[:, 1:]), llama_loss, args.repeat
        ),
    }
    print("| workload | torch CPU eager (ms) | tpu eager (ms) | tpu compiled (ms) | CPU / compiled |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        ratio = r["torch CPU eager"] / r["tpu compiled"]
        print(f"| {name} | {r['torch CPU eager']:.2f} | {r['tpu eager']:.2f} | {r['tpu compiled']:.2f} | {ratio:.2f}x |")
    fwd = rows["tiny-Llama forward"]
    ref = fwd["jax.jit reference"]
    print()
    print(f"tiny-Llama forward as hand-written jax.jit: {ref:.2f} ms = {fwd['torch CPU eager'] / ref:.2f}x "
          f"torch CPU eager; tpu compiled / jax.jit = {fwd['tpu compiled'] / ref:.2f}x")


if __name__ == "__main__":
    main()
