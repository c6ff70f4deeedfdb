"""Train a small Llama with FSDP2 and tensor parallelism, the way TorchTPU scripts are written.

A plain torch script: ``import torch`` gives the `tpu` device, ``init_process_group()``
with no backend picks ``tpu_dist`` for it, and the model is parallelized with PyTorch's
own APIs over a 2-D device mesh ("dp" x "tp"): within a "tp" group each block's
attention q/k/v and MLP gate/up are split column-wise and the attention output and MLP
down projection row-wise (Megatron-style, ``parallelize_module``); across the "dp"
dimension the blocks are sharded with FSDP2 (``fully_shard``), each dp rank training on
its slice of the global batch. Only the device string differs from the CPU run
(``--device cpu``, gloo), which is the reference.

    torchrun --nproc-per-node 4 examples/distributed/train_llama_fsdp_tp.py          # dp=2 x tp=2
    torchrun --nproc-per-node 4 $(which tpu-debug) run examples/distributed/train_llama_fsdp_tp.py
    tpu-debug run --nproc 4 examples/distributed/train_llama_fsdp_tp.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.tiny_llama import LlamaConfig, TinyLlama

# per block, relative to the block (torchtitan's plan for Llama, without sequence parallelism)
BLOCK_PLAN = {
    "attn.q": ColwiseParallel(),
    "attn.k": ColwiseParallel(),
    "attn.v": ColwiseParallel(),
    "attn.o": RowwiseParallel(),
    "mlp.gate": ColwiseParallel(),
    "mlp.up": ColwiseParallel(),
    "mlp.down": RowwiseParallel(),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (the rest is data-parallel)")
    parser.add_argument("--save", help="write the losses and the full parameters here (rank 0)")
    args = parser.parse_args()

    dist.init_process_group()  # tpu_dist on tpu, gloo on cpu; env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp
    dp = world // tp
    mesh = init_device_mesh(args.device, (dp, tp), mesh_dim_names=("dp", "tp"))

    cfg = LlamaConfig()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLlama(cfg).to(args.device)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], BLOCK_PLAN)
        # column-wise q/k/v give each rank its own heads: the attention reshapes to those
        block.attn.heads //= tp
        block.attn.kv_heads //= tp
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    data = torch.Generator().manual_seed(1)
    per_rank, seq = 4, 16
    dp_rank = mesh["dp"].get_local_rank()
    losses = []
    for step in range(args.steps):
        tokens = torch.randint(0, cfg.vocab, (per_rank * dp, seq + 1), generator=data)
        mine = tokens[per_rank * dp_rank:per_rank * (dp_rank + 1)].to(args.device)  # this dp rank's slice
        logits = model(mine[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), mine[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the mean over the dp ranks (tp ranks agree)
        losses.append(total.item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}")

    full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for n, p in model.named_parameters()}
    if rank == 0 and args.save:
        torch.save({"losses": losses, "params": full}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
