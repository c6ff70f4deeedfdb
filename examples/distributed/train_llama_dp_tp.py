"""Train the tiny Llama with data and tensor parallelism on 8 devices (a 2x4 mesh).

The mesh has a data-parallel dimension "dp" (2 replicas, each batch split in
two) and a tensor-parallel dimension "tp" (4 devices share each layer): the
attention's q/k/v projections and the MLP's gate/up are split column-wise, the
attention output and the MLP's down projection row-wise, the embedding by rows
of the vocabulary and the LM head by its columns (Megatron-style). Only the
weights are annotated; XLA's sharding propagation places the activations and
inserts the collectives, which the run's report lists under "Collectives" with
the line that caused each. The same steps run on PyTorch's CPU in this process,
and the losses and final weights are compared.

    tpu-debug run --devices 8 examples/distributed/train_llama_dp_tp.py [--steps 5]
    python examples/distributed/train_llama_dp_tp.py     (simulates the 8 CPU devices itself)
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # run with plain `python`: 8 CPU devices, set before JAX starts (tpu-debug run --devices 8 does this)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import copy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tpu_debug.runtime import distributed as dist  # noqa: E402

import tpu_debug  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama  # noqa: E402

# Megatron-style tensor parallelism for every block, as torch.distributed.tensor.parallel spells it
PLAN = {
    "embed": dist.RowwiseParallel(),
    "blocks.*.attn.q": dist.ColwiseParallel(),
    "blocks.*.attn.k": dist.ColwiseParallel(),
    "blocks.*.attn.v": dist.ColwiseParallel(),
    "blocks.*.attn.o": dist.RowwiseParallel(),
    "blocks.*.mlp.gate": dist.ColwiseParallel(),
    "blocks.*.mlp.up": dist.ColwiseParallel(),
    "blocks.*.mlp.down": dist.RowwiseParallel(),
    "lm_head": dist.ColwiseParallel(),
}


def batches(cfg: LlamaConfig, steps: int, batch: int, seq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g) for _ in range(steps)]


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train_cpu(model, data, lr: float) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for tokens in data:
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def train_sharded(model, data, lr: float, dp: int, tp: int) -> list[float]:
    mesh = dist.init_device_mesh("tpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model.to("tpu")
    dist.parallelize_module(model, mesh["tp"], PLAN)
    dist.distribute_module(model, mesh)  # norms and rotary tables: replicated
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def train_step(tokens):
        loss = loss_of(model, tokens)
        loss.backward()
        return loss.detach()

    step = tpu_debug.compile(train_step)
    opt_step = tpu_debug.compile(opt.step)
    losses = []
    for tokens in data:
        loss = step(dist.mark_sharding(tokens.to("tpu"), mesh, ("dp", None)))
        opt_step()
        opt.zero_grad()
        losses.append(loss)
    return [float(v) for v in torch.stack(losses).cpu()]  # one transfer at the end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=4)
    args = parser.parse_args(argv)
    cfg = LlamaConfig()
    torch.manual_seed(0)
    reference = TinyLlama(cfg)
    model = copy.deepcopy(reference)
    data = batches(cfg, args.steps, batch=4 * args.dp, seq=16)
    print(f"{torch.tpu.device_count()} devices ({torch.tpu.get_device_name()}), mesh dp={args.dp} x tp={args.tp}")
    tpu = train_sharded(model, data, 0.1, args.dp, args.tp)
    cpu = train_cpu(reference, data, 0.1)
    diff = max(abs(a - b) for a, b in zip(tpu, cpu))
    weights = max(
        (p.detach().cpu() - q.detach()).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters())
    )
    print(f"loss {tpu[0]:.4f} -> {tpu[-1]:.4f} sharded, {cpu[0]:.4f} -> {cpu[-1]:.4f} on cpu; "
          f"max |loss difference| {diff:.2e}, max |weight difference| {weights:.2e}")
    # float32 sums taken in another order (per shard, then across devices): differences of a
    # few ULPs of the values summed, far below these bounds
    ok = diff < 1e-4 and weights < 1e-4
    print("sharded training matches CPU" if ok else "sharded training DIVERGES from CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
