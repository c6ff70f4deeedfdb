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


def _sync(out):
    if isinstance(out, torch.Tensor) and out.device.type == "tpu":
        from tpu_debug.runtime.tensor import to_jax

        to_jax(out).block_until_ready()
    return out


def llama_forward(repeat: int) -> dict[str, float]:
    cfg = LlamaConfig()
    torch.manual_seed(0)
    cpu = TinyLlama(cfg).eval()
    dev = copy.deepcopy(cpu).to("tpu")
    comp = tpu_debug.compile(dev)
    tokens = torch.randint(0, cfg.vocab, (1, 32))
    tdev = tokens.to("tpu")
    with torch.no_grad():
        return {
            "torch CPU eager": _time(lambda: cpu(tokens), repeat, _sync),
            "tpu eager": _time(lambda: dev(tdev), repeat, _sync),
            "tpu compiled": _time(lambda: comp(tdev), repeat, _sync),
        }


def _train_step(model, fwd, opt, x, y, loss_fn):
    opt.zero_grad()
    loss = loss_fn(fwd(x), y)
    loss.backward()
    opt.step()
    return loss


def train_steps(make, batch, loss_fn, repeat: int) -> dict[str, float]:
    cpu = make()
    dev = copy.deepcopy(cpu).to("tpu")
    dev_c = copy.deepcopy(cpu).to("tpu")
    comp = tpu_debug.compile(dev_c)
    x, y = batch
    xd, yd = x.to("tpu"), y.to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-3)
    opt_c = torch.optim.AdamW(dev_c.parameters(), lr=1e-3)
    return {
        "torch CPU eager": _time(lambda: _train_step(cpu, cpu, opt_cpu, x, y, loss_fn), repeat, _sync),
        "tpu eager": _time(lambda: _train_step(dev, dev, opt_dev, xd, yd, loss_fn), repeat, _sync),
        "tpu compiled": _time(lambda: _train_step(dev_c, comp, opt_c, xd, yd, loss_fn), repeat, _sync),
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


if __name__ == "__main__":
    main()
