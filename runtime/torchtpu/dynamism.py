"""``torch_tpu._internal.dynamism``: TorchTPU's bounded dynamism (``mark_dynamic``).

``mark_dynamic(t, dimension=d, lower_bound=lo, upper_bound=hi)`` says that dimension ``d`` of
``t`` takes sizes in ``[lo, hi]`` from call to call (a KV cache that grows each decode step).
Here the bounds are kept on the tensor (``get_dynamism_info``) and given to dynamo
(``torch._dynamo.mark_dynamic(t, d, min=lo, max=hi)``), so ``torch.compile`` captures one
graph for every size in the range instead of one per size.

TorchTPU compiles that graph once, with the dimension padded to ``hi`` by XLA's bounded
dynamic shapes. XLA:CPU under JAX compiles static shapes only, so this runtime compiles the
captured graph once per size it meets (each a compile event a trace shows); the program for
``hi`` is what ``tpu-debug run --target`` sizes for the TPU.
"""

from __future__ import annotations

import dataclasses

import torch
from tpu_debug.core.errors import TpuArgumentError

__all__ = ["BoundedDynamicDimension", "get_dynamism_info", "mark_dynamic"]

_ATTR = "_tpu_debug_dynamism"


@dataclasses.dataclass(frozen=True, slots=True)
class BoundedDynamicDimension:
    """One dimension marked dynamic, with its bounds (both included)."""

    dimension: int
    lower_bound: int
    upper_bound: int


def mark_dynamic(tensor: torch.Tensor, dimension: int, lower_bound: int, upper_bound: int) -> None:
    """Mark ``tensor``'s ``dimension`` as taking sizes in ``[lower_bound, upper_bound]``.

    Raises:
        TpuArgumentError: ``tensor`` is not on the ``tpu`` device, ``dimension`` is out of
            range, or the bounds are not ``0 <= lower_bound <= size <= upper_bound``.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        raise TpuArgumentError("mark_dynamic: tensor is not on the tpu device")
    if not -tensor.dim() <= dimension < tensor.dim():
        raise TpuArgumentError(f"mark_dynamic: dimension {dimension} is out of range for a {tensor.dim()}-d tensor")
    dimension %= tensor.dim()
    size = tensor.shape[dimension]
    if not 0 <= lower_bound <= size <= upper_bound:
        raise TpuArgumentError(f"mark_dynamic: dimension {dimension} has size {size}; the bounds must hold it "
                               f"(0 <= lower_bound <= size <= upper_bound), got [{lower_bound}, {upper_bound}]")
    marks = [m for m in getattr(tensor, _ATTR, ()) if m.dimension != dimension]
    marks.append(BoundedDynamicDimension(dimension, lower_bound, upper_bound))
    setattr(tensor, _ATTR, tuple(sorted(marks, key=lambda m: m.dimension)))
    # dynamo's bounds exclude sizes 0 and 1, which it always specializes on
    torch._dynamo.mark_dynamic(tensor, dimension, min=max(lower_bound, 2), max=max(upper_bound, 2))


def get_dynamism_info(tensor: torch.Tensor) -> list[BoundedDynamicDimension]:
    """The dimensions of ``tensor`` marked dynamic, with their bounds (empty if none).

    Raises:
        TpuArgumentError: ``tensor`` is not on the ``tpu`` device.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        raise TpuArgumentError("get_dynamism_info: tensor is not on the tpu device")
    return list(getattr(tensor, _ATTR, ()))
