"""``torch_tpu._internal.sync``: run what is pending, wait for the device, show a computation.

In DEFER_AND_FUSE mode ops are recorded and run as one program when a value is needed;
``synchronize`` runs them now and (``wait=True``) waits until their results are computed,
as TorchTPU's does. ``computation_mlir`` shows the StableHLO of the program that computes
the tensors given.
"""

from __future__ import annotations

import os

import jax
import torch
from torch.utils import _pytree
from tpu_debug.runtime import lazy
from tpu_debug.runtime.tensor import LazyArray

__all__ = ["computation_mlir", "dump_computation_mlir", "is_materialized", "synchronize"]


def _flat(tensors) -> list[torch.Tensor]:
    return [t for t in _pytree.tree_leaves(tensors) if isinstance(t, torch.Tensor) and t.device.type == "tpu"]


def synchronize(tensors=None, wait: bool = True) -> None:
    """Run the pending ops (DEFER_AND_FUSE mode) and, with ``wait``, wait for the device.

    Args:
        tensors: the tensors to compute (a tensor or any nesting of lists and tuples of
            them); None: everything pending. The pending ops run as one program either way.
        wait: block until the results are computed (else return once they are dispatched).

    Example::

        torch_tpu._internal.sync.synchronize(list(model.parameters()), wait=True)
    """
    lazy.materialize("synchronize")
    if not wait:
        return
    if tensors is None:
        torch.tpu.synchronize()
        return
    for t in _flat(tensors):
        value = lazy.value_of(t)
        if hasattr(value, "block_until_ready"):
            value.block_until_ready()


def is_materialized(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s value is computed (not a pending op of DEFER_AND_FUSE mode)."""
    value = lazy.value_of(tensor)
    return type(value) is not LazyArray or value.array is not None


def computation_mlir(*tensors) -> str:
    """The StableHLO (MLIR text) of the program that computes ``tensors``.

    For tensors pending in DEFER_AND_FUSE mode, the fused program that would run them now
    (lowered, not compiled or run); for computed tensors, the program that returns them as
    they are (their values are its inputs: nothing is left to compute).

    Example::

        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            print(computation_mlir(x * 2 + 1))   # one fused func.func with mul and add
    """
    flat = _flat(tensors)
    values = [lazy.value_of(t) for t in flat]
    text = lazy.pending_stablehlo(values)
    if text is not None:
        return text
    specs = [jax.ShapeDtypeStruct(tuple(t.shape), v.dtype) for t, v in zip(flat, values)]
    return jax.jit(lambda *xs: xs).lower(*specs).as_text()


def dump_computation_mlir(tensors, file_name: str) -> None:
    """Write :func:`computation_mlir` of ``tensors`` to ``file_name`` (its folder is made)."""
    folder = os.path.dirname(file_name)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(file_name, "w") as f:
        f.write(computation_mlir(*_flat(tensors)))
