"""Two ranks run torch.distributed's collectives and parallel APIs; each saves what it got.

    python torch_dist_cases.py DEVICE OUT_DIR [CASE ...]

DEVICE ``tpu`` joins with ``init_process_group()`` and no backend (``tpu_dist``, the
device's default); ``cpu`` with ``init_process_group("gloo")``, the reference. The
script is the same for both: only the device string and the backend differ. Each rank
writes ``OUT_DIR/rank<r>.pt``, a dict of CPU tensors (and lists of floats) keyed by case.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import forked_ranks
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WORLD = 2
R = dist.ReduceOp
FLOAT_OPS = {"sum": R.SUM, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX}
INT_OPS = {**FLOAT_OPS, "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def _values(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Small integers (exact in every dtype and every reduction order), rank-dependent."""
    return ((torch.arange(6) * (rank + 3)) % 7 + 1 + rank).to(dtype)


def _all_reduce(device: str, rank: int, out: dict) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.int32):
        ops = FLOAT_OPS if dtype.is_floating_point else INT_OPS
        for name, op in ops.items():
            t = _values(dtype, rank).to(device)
            dist.all_reduce(t, op=op)
            out[f"all_reduce.{name}.{dtype}"] = t.cpu()
    t = _values(torch.float32, rank).to(device)
    if device == "cpu":  # gloo has no AVG: the reference is its SUM over the group size
        dist.all_reduce(t)
        t /= WORLD
    else:
        dist.all_reduce(t, op=R.AVG)
    out["all_reduce.avg.float32"] = t.cpu()
    # a view into a bigger tensor: the result lands in place, the rest stays
    base = torch.zeros(10).to(device)
    view = base[2:8]
    view.copy_(_values(torch.float32, rank).to(device))
    dist.all_reduce(view)
    out["all_reduce.view"] = base.cpu()
    work = dist.all_reduce(_values(torch.float32, rank).to(device), async_op=True)
    out["async.wait"] = torch.tensor(work.wait())


def _gathers(device: str, rank: int, out: dict) -> None:
    x = _values(torch.float32, rank).to(device)
    gathered = [torch.empty(6).to(device) for _ in range(WORLD)]
    dist.all_gather(gathered, x)
    out["all_gather"] = torch.stack([g.cpu() for g in gathered])
    flat = torch.empty(6 * WORLD).to(device)
    dist.all_gather_into_tensor(flat, x)
    out["all_gather_into_tensor"] = flat.cpu()
    inputs = [(_values(torch.float32, rank) * (i + 1)).to(device) for i in range(WORLD)]
    mine = torch.empty(6).to(device)
    dist.reduce_scatter(mine, inputs)
    out["reduce_scatter"] = mine.cpu()
    big = torch.cat([_values(torch.float32, rank), _values(torch.float32, rank) * 2]).to(device)
    half = torch.empty(6).to(device)
    dist.reduce_scatter_tensor(half, big)
    out["reduce_scatter_tensor"] = half.cpu()
    b = _values(torch.int64, rank).to(device)
    dist.broadcast(b, src=1)
    out["broadcast"] = b.cpu()


def _point_to_point(device: str, rank: int, out: dict) -> None:
    a = (torch.arange(4.0) + 10 * rank).to(device)
    got = torch.empty(4).to(device)
    dist.all_to_all_single(got, a)
    out["all_to_all_single"] = got.cpu()
    uneven_in = [1, 3] if rank == 0 else [2, 2]
    uneven_out = [1, 2] if rank == 0 else [3, 2]
    got = torch.empty(sum(uneven_out)).to(device)
    dist.all_to_all_single(got, a, uneven_out, uneven_in)
    out["all_to_all_single.uneven"] = got.cpu()
    dist.barrier()
    if rank == 0:
        dist.send(torch.tensor([5.0, 6.0, 7.0]).to(device), dst=1)
        got = torch.empty(2, dtype=torch.int64).to(device)
        dist.recv(got, src=1)
    else:
        got = torch.empty(3).to(device)
        dist.recv(got, src=0)
        dist.send(torch.tensor([8, 9]).to(device), dst=0)
    out["send_recv"] = got.cpu()
    # a ring: each rank sends to the next and receives from the one before, both posted first
    send = (torch.arange(4.0) + 10 * rank).to(device)
    got = torch.empty(4).to(device)
    for work in [dist.isend(send, (rank + 1) % WORLD), dist.irecv(got, (rank - 1) % WORLD)]:
        work.wait()
    out["ring.isend_irecv"] = got.cpu()
    got = torch.empty(4).to(device)
    ops = [dist.P2POp(dist.isend, send * 2, (rank + 1) % WORLD), dist.P2POp(dist.irecv, got, (rank - 1) % WORLD)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["ring.batch_isend_irecv"] = got.cpu()


def _rooted(device: str, rank: int, out: dict) -> None:
    t = _values(torch.float32, rank).to(device)
    dist.reduce(t, dst=1, op=R.MAX)
    out["reduce"] = t.cpu()  # the root's is the reduction; the others' are left as gloo leaves them
    x = _values(torch.int64, rank).to(device)
    gathered = [torch.empty(6, dtype=torch.int64).to(device) for _ in range(WORLD)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    out["gather"] = torch.stack([g.cpu() for g in gathered]) if rank == 0 else torch.zeros(0)
    pieces = [(_values(torch.float32, 1) * (i + 1)).to(device) for i in range(WORLD)] if rank == 1 else None
    mine = torch.empty(6).to(device)
    dist.scatter(mine, pieces, src=1)
    out["scatter"] = mine.cpu()
    outs = [torch.empty(3).to(device) for _ in range(WORLD)]
    dist.all_to_all(outs, [(torch.arange(3.0) + 10 * rank + i).to(device) for i in range(WORLD)])
    out["all_to_all"] = torch.stack([o.cpu() for o in outs])


def _groups(device: str, rank: int, out: dict) -> None:
    pair = dist.new_group([0, 1])
    alone = [dist.new_group([r]) for r in range(WORLD)][rank]
    t = _values(torch.float32, rank).to(device)
    dist.all_reduce(t, group=pair)
    out["new_group.pair"] = t.cpu()
    t = _values(torch.float32, rank).to(device)
    dist.all_reduce(t, group=alone)
    out["new_group.alone"] = t.cpu()
    import torch.distributed._functional_collectives as fc

    def waited(t: torch.Tensor) -> torch.Tensor:  # an AsyncCollectiveTensor is not saved as such
        return fc.wait_tensor(t).cpu().clone()

    x = _values(torch.float32, rank).to(device)
    out["functional.all_reduce"] = waited(fc.all_reduce(x, "sum", dist.group.WORLD))
    out["functional.all_gather_tensor"] = waited(fc.all_gather_tensor(x, 0, dist.group.WORLD))
    big = torch.cat([x, x * 2])
    out["functional.reduce_scatter_tensor"] = waited(fc.reduce_scatter_tensor(big, "sum", 0, dist.group.WORLD))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batches(rank: int, n: int = 3, per_rank: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + (rank if per_rank else 0))
    return [(torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)) for _ in range(n)]


def _train(model: nn.Module, params, device: str, batches) -> list[float]:
    opt = torch.optim.SGD(params, lr=0.2)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()


def _ddp(device: str, rank: int, out: dict) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _mlp().to(device)
    out["ddp.losses"] = torch.tensor(_train(DDP(model), model.parameters(), device, _batches(rank)))
    out["ddp.params"] = [p.detach().cpu() for p in model.parameters()]


def _ddp_compiled(device: str, rank: int, out: dict) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _mlp().to(device)
    # the form that compiles: dynamo does not trace DDP's own forward in this PyTorch (it breaks
    # the graph on DDP's logger and compiles nothing of torch.compile(DDP(model))), so the module
    # is compiled inside DDP. The reference runs it uncompiled: what the compiled module must compute
    step = DDP(torch.compile(model, backend="tpu_debug") if device == "tpu" else model)
    out["ddp_compiled.losses"] = torch.tensor(_train(step, model.parameters(), device, _batches(rank)))
    out["ddp_compiled.params"] = [p.detach().cpu() for p in model.parameters()]


def _fsdp(device: str, rank: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (WORLD,))
    model = _mlp().to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out["fsdp.losses"] = torch.tensor(_train(model, model.parameters(), device, _batches(rank)))
    out["fsdp.params"] = [_full(p) for p in model.parameters()]


def _tensor_parallel(device: str, rank: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device, (WORLD,))
    d = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [Shard(0)])
    out["dtensor.local"] = d.to_local().cpu()
    out["dtensor.full"] = d.full_tensor().cpu()
    out["dtensor.sum"] = (d * 2).sum().full_tensor().cpu()
    model = _mlp().to(device)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    # tensor parallelism: every rank sees the same batch
    out["tp.losses"] = torch.tensor(_train(model, model.parameters(), device, _batches(0, per_rank=False)))
    out["tp.params"] = [_full(p) for p in model.parameters()]


def _pipeline(device: str, rank: int, out: dict) -> None:
    """A two-stage pipeline, PyTorch's GPipe schedule over two microbatches (its stages send
    activations and gradients with batch_isend_irecv), trained two steps."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    stages = [nn.Linear(8, 8), nn.Linear(8, 4)]  # few ops: each eager op compiles once on tpu
    module = stages[rank].to(device)
    schedule = ScheduleGPipe(PipelineStage(module, rank, WORLD, torch.device(device)), n_microbatches=2,
                             loss_fn=F.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.2)
    losses = []
    gen = torch.Generator().manual_seed(7)
    for x, y in [(torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)) for _ in range(2)]:
        opt.zero_grad()
        if rank == 0:
            schedule.step(x.to(device))
        else:
            step: list[torch.Tensor] = []
            schedule.step(target=y.to(device), losses=step)
            losses.append(sum(loss.item() for loss in step))
        opt.step()
    out["pipeline.losses"] = torch.tensor(losses)
    out["pipeline.params"] = [p.detach().cpu() for p in module.parameters()]


CASES = {
    "all_reduce": _all_reduce,
    "gathers": _gathers,
    "point_to_point": _point_to_point,
    "rooted": _rooted,
    "groups": _groups,
    "ddp": _ddp,
    "ddp_compiled": _ddp_compiled,
    "fsdp": _fsdp,
    "tp": _tensor_parallel,
    "pipeline": _pipeline,
}


def _rank(rank: int, device: str, out_dir: str, cases: list[str]) -> None:
    if device == "tpu":
        dist.init_process_group()  # no backend: the tpu device's default, tpu_dist
    else:
        dist.init_process_group("gloo")
    results: dict = {"backend": dist.get_backend()}
    for name in cases:
        CASES[name](device, rank, results)
    dist.barrier()
    if os.environ.get("TORCH_FR_BUFFER_SIZE") and device == "cpu":
        # gloo's Flight Recorder: each rank's dump, written as a job writes it on demand
        with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def main() -> None:
    device, out_dir, *cases = sys.argv[1:]
    forked_ranks.start(_rank, WORLD, device, out_dir, cases or list(CASES))


if __name__ == "__main__":
    main()
