"""Data and tensor parallelism for modules: DTensor's plan names over GSPMD.

``parallelize_module(model, mesh["tp"], {"mlp.up": ColwiseParallel(), ...})``
shards the weights of the named submodules the way Megatron-style tensor
parallelism does: a column-wise linear splits its output features (weight rows),
a row-wise linear its input features (weight columns). Only weights are
annotated; activations are left to XLA's sharding propagation, which inserts the
collectives the layout needs (the all-reduce after a row-wise linear, say) when
the step is compiled. ``distribute_module`` replicates every parameter and buffer
not sharded yet, which is all data parallelism needs besides a batch sharded on
the data dimension: the gradients of replicated weights come out reduced.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping

import torch
from torch import nn
from tpu_debug.runtime.distributed.errors import ShardingError
from tpu_debug.runtime.distributed.mesh import DeviceMesh
from tpu_debug.runtime.distributed.sharding import (
    Replicate,
    Shard,
    is_sharded,
    mark_sharding,
    spec_from_placements,
)

__all__ = [
    "ParallelStyle",
    "ColwiseParallel",
    "RowwiseParallel",
    "parallelize_module",
    "distribute_module",
]


@dataclasses.dataclass(frozen=True)
class ParallelStyle:
    """How one submodule's parameters are laid out over a (sub-)mesh."""

    def placements(self, module: nn.Module, name: str, param: torch.Tensor) -> tuple | None:
        """DTensor placements of parameter ``name`` over a 1-d mesh (None: leave it as it is)."""
        raise NotImplementedError

    def apply(self, module: nn.Module, mesh: DeviceMesh, fqn: str) -> None:
        if mesh.ndim != 1:
            raise ShardingError(
                f"{type(self).__name__} on {fqn!r}: give a 1-d mesh, e.g. mesh['tp'] "
                f"(this one has dimensions {', '.join(mesh.mesh_dim_names)})"
            )
        for name, param in list(module.named_parameters(recurse=False)):
            placements = self.placements(module, name, param)
            if placements is not None:
                mark_sharding(param, mesh, spec_from_placements(mesh, param.dim(), placements))


def _kind(style: ParallelStyle, module: nn.Module, fqn: str) -> str:
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding"
    raise ShardingError(
        f"{type(style).__name__} on {fqn!r}: a {type(module).__name__}; it applies to nn.Linear and nn.Embedding"
    )


@dataclasses.dataclass(frozen=True)
class ColwiseParallel(ParallelStyle):
    """Split a linear's output features (weight dim 0, and its bias) or an embedding's features (dim 1)."""

    def placements(self, module: nn.Module, name: str, param: torch.Tensor) -> tuple | None:
        kind = _kind(self, module, name)
        if kind == "embedding":
            return (Shard(1),)
        return (Shard(0),)

    def apply(self, module: nn.Module, mesh: DeviceMesh, fqn: str) -> None:
        _kind(self, module, fqn)
        super().apply(module, mesh, fqn)


@dataclasses.dataclass(frozen=True)
class RowwiseParallel(ParallelStyle):
    """Split a linear's input features (weight dim 1; the bias is replicated) or an
    embedding's rows (dim 0)."""

    def placements(self, module: nn.Module, name: str, param: torch.Tensor) -> tuple | None:
        kind = _kind(self, module, name)
        if kind == "embedding":
            return (Shard(0),)
        return (Shard(1),) if name == "weight" else (Replicate(),)

    def apply(self, module: nn.Module, mesh: DeviceMesh, fqn: str) -> None:
        _kind(self, module, fqn)
        super().apply(module, mesh, fqn)


def parallelize_module(
    module: nn.Module,
    device_mesh: DeviceMesh,
    parallelize_plan: ParallelStyle | Mapping[str, ParallelStyle],
) -> nn.Module:
    """Lay out ``module``'s parameters over ``device_mesh`` by a plan (in place).

    Args:
        module: a module on the `tpu` device.
        device_mesh: a 1-d mesh or sub-mesh (``mesh["tp"]``): the plan's shards go
            over it and replicate over the other dimensions of its parent.
        parallelize_plan: a style for ``module`` itself, or ``{name: style}`` where
            a name is a submodule path with ``*`` wildcards (``"blocks.*.mlp.up"``).

    Returns:
        ``module``.

    Raises:
        ShardingError: a plan entry matches no submodule, or a style does not fit
            the module it names.

    Example::

        parallelize_module(model, mesh["tp"], {
            "blocks.*.mlp.gate": ColwiseParallel(), "blocks.*.mlp.up": ColwiseParallel(),
            "blocks.*.mlp.down": RowwiseParallel()})
    """
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.apply(module, device_mesh, type(module).__name__)
        return module
    names = dict(module.named_modules())
    for pattern, style in parallelize_plan.items():
        matched = [n for n in names if n and fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ShardingError(
                f"plan entry {pattern!r} matches no submodule of {type(module).__name__}; "
                f"submodule names look like {', '.join([n for n in names if n][:4])}"
            )
        for name in matched:
            style.apply(names[name], device_mesh, name)
    return module


def distribute_module(module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
    """Replicate every parameter and buffer of ``module`` not sharded yet over ``device_mesh`` (in place).

    Data parallelism is this plus a batch sharded on the data dimension
    (``mark_sharding(x, mesh, ("dp", None))``); after ``parallelize_module`` it
    puts the rest of the model on the mesh.

    Raises:
        ShardingError: a parameter or buffer is not on the `tpu` device.
    """
    mesh = DeviceMesh(device_mesh.device_type, device_mesh.jax_mesh)  # the whole mesh
    for kind, tensors in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in tensors:
            if t.device.type != "tpu":
                raise ShardingError(
                    f"distribute_module: {kind} {name!r} is on {t.device}; move the module with .to('tpu') first"
                )
            if not is_sharded(t):
                mark_sharding(t, mesh, (None,) * t.dim())
    return module
