"""Functional collectives and PyTorch's parallel APIs inside ``torch.compile``, per rank.

    python compiled_collectives_cases.py DEVICE OUT_DIR [CASE ...]

starts two ranks (forked, with torchrun's ``env://`` variables). DEVICE ``tpu`` joins with
``init_process_group()`` (the device's default backend) and compiles with the ``tpu_debug``
backend; ``cpu`` joins with ``gloo`` and runs the same functions uncompiled, the reference:
PyTorch's eager kernels and gloo's collectives, the results a compiled program must give.
Each rank writes ``OUT_DIR/rank<r>.pt``, a dict of CPU tensors keyed by case.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import forked_ranks
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F
from torch import nn

WORLD = 2


def _compile(fn, device: str, **options):
    """``fn`` compiled with the ``tpu_debug`` backend on `tpu`; on CPU, the reference, ``fn`` as it is."""
    return torch.compile(fn, backend="tpu_debug", **options) if device == "tpu" else fn


def _values(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Small integers (exact in every dtype and every reduction order), rank-dependent."""
    return ((torch.arange(8) * (rank + 3)) % 7 + 1 + rank).to(dtype)


def _collectives(x: torch.Tensor, n: torch.Tensor, rank: int) -> dict[str, torch.Tensor]:
    group = dist.group.WORLD
    out = {f"all_reduce.{op}": fc.all_reduce(x, op, group) for op in ("sum", "max", "min", "product")}
    if x.device.type == "cpu":  # gloo has no AVG: the reference is its SUM over the group size
        out["all_reduce.avg"] = fc.all_reduce(x, "sum", group) / WORLD
    else:
        out["all_reduce.avg"] = fc.all_reduce(x, "avg", group)
    out["all_reduce.int64.sum"] = fc.all_reduce(n, "sum", group)
    out["all_reduce.int64.bxor"] = fc.all_reduce(n, "bxor", group)
    out["all_gather_tensor"] = fc.all_gather_tensor(x.view(2, 4) * 2, 0, group)
    out["all_gather_tensor.int64"] = fc.all_gather_tensor(n, 0, group)
    out["reduce_scatter_tensor"] = fc.reduce_scatter_tensor(x + 1, "sum", 0, group)
    out["all_to_all_single"] = fc.all_to_all_single(x, None, None, group)
    splits_in, splits_out = ([3, 5], [3, 2]) if rank == 0 else ([2, 6], [5, 6])
    out["all_to_all_single.uneven"] = fc.all_to_all_single(x, splits_out, splits_in, group)
    out["broadcast"] = fc.broadcast(x * 3, 1, group)
    # results used inside the graph, after the collectives (their waits are in the graph)
    chained = fc.all_reduce(out["all_reduce.sum"] * out["broadcast"], "sum", group)
    out["chained"] = chained.sum(0, keepdim=True)
    return out


def _funcol(device: str, rank: int, results: dict) -> None:
    x = _values(torch.float32, rank).to(device)
    n = _values(torch.int64, rank).to(device)
    step = _compile(lambda x, n: _collectives(x, n, rank), device, fullgraph=True)
    for name, value in step(x, n).items():
        results[f"funcol.{name}"] = fc.wait_tensor(value).cpu().clone()


def _recorded(device: str, rank: int, results: dict) -> None:
    """The compiled collectives as the rank's run records them (`tpu` only)."""
    if device != "tpu":
        return
    import tpu_debug

    def step(x):
        y = fc.all_reduce(x * 2, "sum", dist.group.WORLD)  # the first collective's line
        return fc.all_gather_tensor(y + 1, 0, dist.group.WORLD)  # the second's

    compiled = torch.compile(step, backend="tpu_debug")
    x = _values(torch.float32, rank).to(device)
    with tpu_debug.trace(logdir=Path(sys.argv[2]) / f"runs{rank}", hlo=False) as session:
        dist.all_reduce(x)  # an eager one first: the compiled ones continue its sequence
        compiled(x).cpu()
        compiled(x).cpu()
    results["recorded"] = [(c.op, c.seq, tuple(str(list(s)) for s in c.shapes), c.dtype, c.reduce_op, c.ranks,
                            c.location.file if c.location else None, c.location.line if c.location else None,
                            c.location.function if c.location else None)
                           for c in session.events("collective_call")]


class _Block(nn.Module):
    """A norm, an MLP and a head: sequence-parallel norms around a tensor-parallel MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.norm2 = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.down(F.relu(self.up(self.norm(x))))
        return self.head(self.norm2(h))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batches(rank: int, n: int = 3, shape: tuple = (6, 8), classes: tuple = (6,)):
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(*shape, generator=gen), torch.randint(0, 4, classes, generator=gen))
            for _ in range(n)]


def _train(step, params, device: str, batches, inputs=lambda x: x) -> list[float]:
    opt = torch.optim.SGD(params, lr=0.2)
    losses = []
    for x, y in batches:
        logits = step(inputs(x.to(device)))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()


def _fsdp_compiled(device: str, rank: int, results: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (WORLD,))
    model = _mlp().to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    step = _compile(model, device)
    results["fsdp_compiled.losses"] = torch.tensor(_train(step, model.parameters(), device, _batches(rank)))
    results["fsdp_compiled.params"] = [_full(p) for p in model.parameters()]


def _tp_sp(device: str, rank: int, results: dict, compiled: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device, (WORLD,))
    torch.manual_seed(0)
    model = _Block().to(device)
    parallelize_module(model, mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
        "norm2": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    step = _compile(model, device) if compiled else model
    name = "tp_sp_compiled" if compiled else "tp_sp_eager"
    # every rank sees the same batch and feeds its half of the sequence (SequenceParallel's input)
    batches = _batches(0, shape=(2, 6, 8), classes=(2, 6))
    results[f"{name}.losses"] = torch.tensor(_train(step, model.parameters(), device, batches,
                                                           inputs=lambda x: x[:, 3 * rank:3 * rank + 3]))
    results[f"{name}.params"] = [_full(p) for p in model.parameters()]


def _ddp_compiled_autograd(device: str, rank: int, results: dict) -> None:
    """DDP with its bucket all-reduces inside the compiled backward: compiled autograd and
    dynamo's ``python_reducer``, whose graph holds them as functional collectives (on `tpu`;
    the reference is DDP's own reducer, eager)."""
    from torch._dynamo import compiled_autograd
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    # DDP reads the reducer it uses from dynamo's config when it is built
    with contextlib.ExitStack() as compiling:
        if device == "tpu":
            compiling.enter_context(torch._dynamo.config.patch(optimize_ddp="python_reducer"))
            compiling.enter_context(compiled_autograd._enable(torch.compile(backend="tpu_debug")))
        ddp = DDP(model)

        def step(x, y):
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            return loss

        compiled = _compile(step, device)
        for x, y in _batches(rank):
            losses.append(compiled(x.to(device), y.to(device)).item())
            opt.step()
            opt.zero_grad()
    results["ddp_compiled_autograd.losses"] = torch.tensor(losses)
    results["ddp_compiled_autograd.params"] = [p.detach().cpu() for p in model.parameters()]


def _desync_compiled(device: str, rank: int, results: dict) -> None:
    """Ranks all-reducing tensors of other sizes inside a compiled graph (`tpu` only: gloo
    itself would abort on it): the error, as raised, and the failed-callback logs JAX wrote."""
    if device != "tpu":
        return
    import logging

    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    logging.getLogger("jax._src.callback").addHandler(handler)
    step = torch.compile(lambda x: fc.all_reduce(x * 2, "sum", dist.group.WORLD) + 1, backend="tpu_debug")
    try:
        step(torch.ones(4 if rank == 0 else 3, device="tpu")).cpu()  # the sizes differ by rank
    except Exception as exc:  # noqa: BLE001 - the test reads what was raised
        results["desync_compiled"] = {"type": type(exc).__name__, "text": str(exc), "logged": len(logged)}
    finally:
        logging.getLogger("jax._src.callback").removeHandler(handler)


CASES = {
    "funcol": _funcol,
    "recorded": _recorded,
    "fsdp_compiled": _fsdp_compiled,
    "tp_sp_compiled": functools.partial(_tp_sp, compiled=True),
    # eager too: sequence parallel's layer norm backward returns its masked-off gradients as None
    "tp_sp_eager": functools.partial(_tp_sp, compiled=False),
    "ddp_compiled_autograd": _ddp_compiled_autograd,
    "desync_compiled": _desync_compiled,
}


def _rank(rank: int, device: str, out_dir: str, cases: list[str]) -> None:
    if device == "tpu":
        dist.init_process_group()  # no backend: the tpu device's default, tpu_dist
    else:
        dist.init_process_group("gloo")
    assert dist.get_rank() == rank
    results: dict = {}
    for name in cases:
        CASES[name](device, rank, results)
    dist.barrier()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def main() -> None:
    device, out_dir, *cases = sys.argv[1:]
    forked_ranks.start(_rank, WORLD, device, out_dir, cases or list(CASES))


if __name__ == "__main__":
    main()
