"""The host engine of the `tpu` process group: gloo on host copies of its tensors.

A collective copies its `tpu` tensors to the host, runs the same collective there on a gloo
process group built on the same store, and writes the results back into the `tpu` tensors in
place. Gloo lacks some reductions XLA's all-reduce has: AVG and PREMUL_SUM run as SUM, with
the rest done on the host copies.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

__all__ = ["as_sum", "check_reduce", "flat", "host_group", "reduce_kind", "scaled", "to_host", "write_back"]

_RedOp = dist.ReduceOp.RedOpType
# ReduceOps gloo has itself; AVG and PREMUL_SUM are made from SUM (XLA's all-reduce has
# them all, and FSDP2 asks for AVG and PREMUL_SUM on float32 gradients)
_FLOAT_ONLY = (_RedOp.AVG, _RedOp.PREMUL_SUM)
_BITWISE = (_RedOp.BAND, _RedOp.BOR, _RedOp.BXOR)


def flat(value: Any) -> list[torch.Tensor]:
    """The tensors of an argument: a tensor, a list of them, or a list of lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flat(item)]
    return []


def to_host(value: Any, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``value`` with each non-CPU tensor replaced by a contiguous host copy (recorded in ``copies``)."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value
        host = value.detach().cpu().contiguous()
        copies.append((value, host))
        return host
    if isinstance(value, list):
        return [to_host(v, copies) for v in value]
    if isinstance(value, tuple):
        return tuple(to_host(v, copies) for v in value)
    return value


def scaled(value: Any, factor: float) -> Any:
    if isinstance(value, torch.Tensor):
        return value * factor
    return [scaled(v, factor) for v in value]


def write_back(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for device_tensor, host in copies:
            device_tensor.copy_(host)


def check_reduce(op: Any, tensors: Sequence[torch.Tensor]) -> None:
    kind = op if isinstance(op, _RedOp) else op.op
    for t in tensors:
        if kind in _FLOAT_ONLY and not (t.is_floating_point() or t.is_complex()):
            raise TypeError(
                f"ReduceOp.{kind.name} on a {t.dtype} tensor: the tpu backend averages floating "
                "point tensors only; reduce with ReduceOp.SUM and divide"
            )
        if kind in _BITWISE and (t.is_floating_point() or t.is_complex()):
            raise TypeError(
                f"ReduceOp.{kind.name} on a {t.dtype} tensor: bitwise reductions need an integer or "
                "bool tensor"
            )


def reduce_kind(reduce_op: Any) -> tuple[Any, float]:
    """(the reduce op's kind, its PREMUL_SUM factor); (None, 1.0) for a collective with none."""
    if reduce_op is None:
        return None, 1.0
    if isinstance(reduce_op, _RedOp):
        return reduce_op, 1.0
    factor = getattr(reduce_op, "factor", None) if reduce_op.op == _RedOp.PREMUL_SUM else None
    return reduce_op.op, float(factor) if factor is not None else 1.0


def as_sum(opts: Any, cls: type) -> Any:
    """``opts`` for gloo: AVG and PREMUL_SUM become SUM (the rest of each is done on the host copies)."""
    kind, _ = reduce_kind(opts.reduceOp)
    if kind not in _FLOAT_ONLY:
        return opts
    summed = cls()
    for field in ("timeout", "asyncOp"):
        if hasattr(opts, field):
            setattr(summed, field, getattr(opts, field))
    summed.reduceOp = dist.ReduceOp.SUM
    return summed


def host_group(store: Any, rank: int, size: int, timeout: datetime.timedelta, group_name: str,
               global_ranks: Sequence[int]) -> dist.ProcessGroup:
    """A gloo process group on ``store``, as ``init_process_group("gloo")`` would build it."""
    gloo = ProcessGroupGloo(store, rank, size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(global_ranks)
    gloo.options.group_name = group_name
    gloo._set_sequence_number_for_group()
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return group
