"""Sharding `tpu` tensors over a mesh: PyTorch/XLA's and DTensor's ways to say it.

Two spellings of one thing, a ``jax.sharding.NamedSharding`` on the tensor's payload:

- PyTorch/XLA's ``mark_sharding(t, mesh, ("dp", None))``: one entry per tensor
  dimension, naming the mesh dimension(s) it is split over (a name, an index
  into the mesh's dimensions, a tuple of them, or None for not split). The
  tensor is sharded in place.
- DTensor's placements, one per mesh dimension: ``Shard(d)`` splits tensor
  dimension ``d`` over that mesh dimension, ``Replicate()`` copies it there.
  ``distribute_tensor`` returns a new sharded tensor.

A dimension must divide evenly over the devices it is split on. In a
multi-process run every process passes the same (global) value and keeps the
shards of its own devices; the values are not compared across processes (that
would be a collective inside a call that looks local).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec
from tpu_debug.runtime.distributed.errors import ShardingError
from tpu_debug.runtime.distributed.mesh import DeviceMesh
from tpu_debug.runtime.distributed.placement import placement, put
from tpu_debug.runtime.tensor import PAYLOAD_ATTR, from_jax, to_jax

__all__ = [
    "Placement",
    "Shard",
    "Replicate",
    "mark_sharding",
    "clear_sharding",
    "distribute_tensor",
    "sharding_spec",
    "partition_spec",
    "spec_from_placements",
    "is_sharded",
    "local_shape",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """How a tensor lies along one mesh dimension (DTensor's ``Placement``)."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class Shard(Placement):
    """Tensor dimension ``dim`` is split evenly over the mesh dimension."""

    dim: int

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim


@dataclasses.dataclass(frozen=True, slots=True)
class Replicate(Placement):
    """Every device of the mesh dimension holds the whole tensor."""

    def is_replicate(self) -> bool:
        return True


def partition_spec(mesh: DeviceMesh, shape: Sequence[int], spec: Sequence[Any]) -> PartitionSpec:
    """The JAX ``PartitionSpec`` of a PyTorch/XLA partition spec for a tensor of ``shape``.

    Raises:
        ShardingError: the spec does not fit the tensor or the mesh (wrong length,
            an unknown or repeated mesh dimension, a size that does not divide).
    """
    shape = tuple(shape)
    spec = tuple(spec)
    if len(spec) != len(shape):
        raise ShardingError(
            f"partition spec {spec!r} has {len(spec)} entries for a {len(shape)}-d tensor of shape "
            f"{list(shape)}: give one per tensor dimension (None for a dimension not split)"
        )
    used: set[str] = set()
    entries: list[Any] = []
    for dim, entry in enumerate(spec):
        if entry is None:
            entries.append(None)
            continue
        parts = entry if isinstance(entry, (tuple, list)) else (entry,)
        names = []
        for part in parts:
            name = mesh.dim_name(part) if isinstance(part, (str, int)) else None
            if name is None:
                raise ShardingError(f"partition spec entry {part!r}: use a mesh dimension name or index, or None")
            if name in used:
                raise ShardingError(f"partition spec {spec!r} uses mesh dimension {name!r} twice")
            used.add(name)
            names.append(name)
        ways = math.prod(mesh.jax_mesh.shape[n] for n in names)
        if shape[dim] % ways:
            raise ShardingError(
                f"tensor dimension {dim} of size {shape[dim]} does not split evenly over {'x'.join(names)} "
                f"({ways} devices); use a size that is a multiple of {ways}, or split another dimension"
            )
        entries.append(names[0] if len(names) == 1 else tuple(names))
    return PartitionSpec(*entries)


def spec_from_placements(mesh: DeviceMesh, ndim: int, placements: Sequence[Placement]) -> tuple:
    """The PyTorch/XLA partition spec of DTensor ``placements`` (one per dimension of ``mesh``).

    Raises:
        ShardingError: not one placement per mesh dimension, or a ``Shard`` of a
            dimension the tensor does not have.
    """
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ShardingError(
            f"{len(placements)} placement(s) for a {mesh.ndim}-d mesh ({', '.join(mesh.mesh_dim_names)}): "
            "give one Shard(dim) or Replicate() per mesh dimension"
        )
    per_dim: list[list[str]] = [[] for _ in range(ndim)]
    for name, p in zip(mesh.mesh_dim_names, placements):
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise ShardingError(f"Shard({p.dim}) on mesh dimension {name!r}: the tensor has {ndim} dimensions")
            per_dim[d].append(name)
        elif not isinstance(p, Replicate):
            raise ShardingError(f"placement {p!r}: use Shard(dim) or Replicate()")
    return tuple(None if not names else names[0] if len(names) == 1 else tuple(names) for names in per_dim)


def _owned_payload(t: torch.Tensor, what: str) -> Any:
    """The payload of ``t``, which must be a `tpu` tensor owning its whole storage."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise ShardingError(f"{what} needs a tpu tensor, got one on {where}: move it with .to('tpu') first")
    arr = to_jax(t)
    if getattr(t.untyped_storage(), PAYLOAD_ATTR, None) is not arr:
        raise ShardingError(
            f"{what}: the tensor of shape {list(t.shape)} is a view of a larger storage; shard the tensor "
            "that owns the storage, or a copy (.clone())"
        )
    return arr


def mark_sharding(t: torch.Tensor, mesh: DeviceMesh, partition_spec_: Sequence[Any]) -> torch.Tensor:
    """Shard `tpu` tensor ``t`` over ``mesh`` in place (PyTorch/XLA's ``xs.mark_sharding``).

    Args:
        t: a `tpu` tensor that owns its storage (a parameter, a batch; not a view).
        mesh: from :func:`init_device_mesh`.
        partition_spec_: one entry per dimension of ``t``: a mesh dimension's name or
            index, a tuple of them, or None.

    Returns:
        ``t``, whose payload is now split over the mesh.

    Raises:
        ShardingError: ``t`` is not a `tpu` tensor owning its storage, or the spec
            does not fit it (see :func:`partition_spec`).

    Example::

        mark_sharding(batch, mesh, ("dp", None))        # data parallel
        mark_sharding(linear.weight, mesh, ("tp", None)) # column-wise
    """
    arr = _owned_payload(t, "mark_sharding")
    spec = partition_spec(mesh, t.shape, partition_spec_)
    sharded = put(arr, NamedSharding(mesh.jax_mesh, spec))
    setattr(t.untyped_storage(), PAYLOAD_ATTR, sharded)
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Gather ``t``'s payload back onto one device (the first of its mesh), in place."""
    arr = _owned_payload(t, "clear_sharding")
    sh = placement(arr)
    if sh is not None:
        first = min(sh.device_set, key=lambda d: d.id)
        setattr(t.untyped_storage(), PAYLOAD_ATTR, jax.device_put(arr, first))
    return t


def distribute_tensor(
    tensor: torch.Tensor, device_mesh: DeviceMesh, placements: Sequence[Placement] | None = None
) -> torch.Tensor:
    """A new `tpu` tensor holding ``tensor`` laid out by DTensor ``placements`` over ``device_mesh``.

    Args:
        tensor: a CPU or `tpu` tensor.
        device_mesh: the mesh (or a sub-mesh, ``mesh["tp"]``: the other dimensions replicate).
        placements: one ``Shard(dim)`` or ``Replicate()`` per dimension of
            ``device_mesh`` (default: replicated).

    Raises:
        ShardingError: the placements do not fit the tensor or mesh.

    Example::

        w = distribute_tensor(torch.randn(256, 64), mesh["tp"], [Shard(0)])
    """
    placements = tuple(placements) if placements is not None else (Replicate(),) * device_mesh.ndim
    spec = spec_from_placements(device_mesh, tensor.dim(), placements)
    source = tensor.detach()
    source = source.to("tpu") if source.device.type != "tpu" else source
    value = to_jax(source)
    sharding = NamedSharding(device_mesh.jax_mesh, partition_spec(device_mesh, tensor.shape, spec))
    return from_jax(put(value, sharding), tensor.dtype)


def sharding_spec(t: torch.Tensor) -> tuple | None:
    """The partition spec ``t``'s payload has (one entry per dimension), None when on one device."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        return None
    sh = placement(to_jax(t))
    if sh is None or not isinstance(sh, NamedSharding):
        return None
    spec = tuple(sh.spec) + (None,) * (t.dim() - len(sh.spec))
    return spec


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t``'s payload spans several devices (sharded or replicated over a mesh)."""
    return isinstance(t, torch.Tensor) and t.device.type == "tpu" and placement(to_jax(t)) is not None


def local_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape of one device's shard of ``t`` (its whole shape when on one device)."""
    arr = to_jax(t)
    sh = placement(arr)
    return tuple(sh.shard_shape(arr.shape)) if sh is not None else tuple(arr.shape)
