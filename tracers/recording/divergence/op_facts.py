"""What the divergence tracer needs to know about an aten op: read once from its schema,
and which tensors one call of it produced."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tpu_debug.tracers.recording.divergence.values import on_tpu, tensors, value_at

__all__ = ["OpInfo", "device_outputs", "op_info", "tpu_tensors"]

# ops whose device values are copied into the shadow instead of compared: their
# values are random (the device's generator is not PyTorch's)...
_RANDOM = frozenset(
    {
        "bernoulli",
        "bernoulli_",
        "dropout",
        "native_dropout",
        "_fused_dropout",
        "feature_dropout",
        "alpha_dropout",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform",
        "uniform_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "multinomial",
        "poisson",
        "binomial",
        "rrelu_with_noise",
        "_standard_gamma",
    }
)
# ... or memory nobody wrote yet
_UNINITIALISED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"}
)
# copies: op -> position of its source argument (a source on the host is data loaded
# onto the device, copied into the shadow too)
_COPIES = {"copy_": 1, "_to_copy": 0}


@dataclasses.dataclass(frozen=True, slots=True)
class OpInfo:
    """An aten overload as the tracer sees it."""

    name: str  # "add.Tensor"; the base name alone for a default overload ("silu")
    writes: tuple[tuple[int, str, bool], ...]  # the arguments it writes: (position, name, is a list)
    skip: str | None  # not compared: None | "random" | "uninitialised"
    copy_source: int | None  # a copy: the position of its source argument


_infos: dict[Any, OpInfo] = {}


def op_info(op: Any) -> OpInfo:
    """The :class:`OpInfo` of aten overload ``op`` (cached per overload)."""
    info = _infos.get(op)
    if info is None:
        schema = op._schema
        base = schema.name.split("::", 1)[-1]
        name = base if op._overloadname == "default" else f"{base}.{op._overloadname}"
        writes = tuple(
            (i, a.name, isinstance(a.type, torch.ListType))
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        skip = None
        if base in _RANDOM or any(a.name == "generator" for a in schema.arguments):
            skip = "random"
        elif base in _UNINITIALISED:
            skip = "uninitialised"
        info = _infos[op] = OpInfo(name, writes, skip, _COPIES.get(base))
    return info


def device_outputs(
    info: OpInfo, args: tuple, kwargs: dict, out: Any
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, int, str, int]]]:
    """What an op call produced: the tensors it returned (on any device), and the ``tpu``
    tensors it wrote and did not return, as (tensor, argument position, argument name,
    index in a list argument)."""
    returned = [out] if isinstance(out, torch.Tensor) else list(tensors(out))
    written: list[tuple[torch.Tensor, int, str, int]] = []
    seen = {id(t) for t in returned} if info.writes else None
    for pos, name, is_list in info.writes:
        value = value_at(args, kwargs, pos, name)
        for i, t in enumerate(value if is_list and value is not None else [value]):
            if on_tpu(t) and id(t) not in seen:
                written.append((t, pos, name, i))
                seen.add(id(t))
    return returned, written


def tpu_tensors(returned: list[torch.Tensor], written: list[tuple]) -> list[torch.Tensor]:
    """The device results of :func:`device_outputs`, in the order they are compared: returned, then written."""
    return [t for t in returned if on_tpu(t)] + [w[0] for w in written]
