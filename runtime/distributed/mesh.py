"""Device meshes: PyTorch's ``init_device_mesh`` names over a ``jax.sharding.Mesh``.

A mesh is a named grid of devices (``(2, 4)`` with dimensions ``("dp", "tp")``:
two data-parallel replicas of a four-way tensor-parallel group). The runtime
shards a `tpu` tensor by placing its ``jax.Array`` payload on the mesh with a
``NamedSharding``; compiled programs then take their input shardings from their
inputs and XLA's sharding propagation (GSPMD) decides everything else, inserting
the collectives the layout needs. JAX's mesh is the engine: nothing here moves
data itself.

``mesh["tp"]`` is the same devices seen through one dimension, as in PyTorch: a
placement on it shards over ``"tp"`` and replicates over the other dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from tpu_debug.runtime.distributed import placement
from tpu_debug.runtime.distributed.errors import MeshError
from tpu_debug.runtime.startup import start

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """A named grid of devices (``torch.distributed.device_mesh.DeviceMesh``'s interface).

    Build one with :func:`init_device_mesh`. ``jax_mesh`` is the JAX mesh under it;
    ``mesh_dim_names`` are the dimensions this mesh (or sub-mesh) spans.

    Example::

        mesh = init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
        mesh.size(), mesh["tp"].size(), mesh.shape
        # (8, 4, (2, 4))
    """

    def __init__(self, device_type: str, jax_mesh: Any, dims: tuple[str, ...] | None = None) -> None:
        self.device_type = device_type
        self.jax_mesh = jax_mesh
        self._dims = tuple(jax_mesh.axis_names) if dims is None else dims
        placement.active = True

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return self._dims

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.jax_mesh.shape[d] for d in self._dims)

    @property
    def ndim(self) -> int:
        return len(self._dims)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Devices along ``mesh_dim`` (a name or index), or in the whole (sub-)mesh."""
        if mesh_dim is None:
            return math.prod(self.shape)
        return self.jax_mesh.shape[self.dim_name(mesh_dim)]

    def dim_name(self, mesh_dim: int | str) -> str:
        """The name of dimension ``mesh_dim`` (an index into this mesh's dimensions, or a name).

        Raises:
            MeshError: no such dimension.
        """
        if isinstance(mesh_dim, str):
            if mesh_dim not in self.jax_mesh.axis_names:
                raise MeshError(
                    f"the mesh has no dimension {mesh_dim!r}; its dimensions are {', '.join(self._dims)}"
                )
            return mesh_dim
        if isinstance(mesh_dim, int) and not isinstance(mesh_dim, bool) and -self.ndim <= mesh_dim < self.ndim:
            return self._dims[mesh_dim]
        raise MeshError(
            f"mesh dimension {mesh_dim!r} is not a name nor an index below {self.ndim}; "
            f"the dimensions are {', '.join(self._dims)}"
        )

    def __getitem__(self, names: str | Sequence[str]) -> DeviceMesh:
        wanted = (names,) if isinstance(names, str) else tuple(names)
        return DeviceMesh(self.device_type, self.jax_mesh, tuple(self.dim_name(n) for n in wanted))

    @property
    def devices(self) -> list[Any]:
        """The mesh's JAX devices, in mesh order."""
        return list(self.jax_mesh.devices.flat)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and other.jax_mesh == self.jax_mesh and other._dims == self._dims

    def __hash__(self) -> int:
        return hash((self.jax_mesh, self._dims))

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={self.jax_mesh.shape[n]}" for n in self._dims)
        ids = np.vectorize(lambda d: d.id)(self.jax_mesh.devices).tolist()
        return f"DeviceMesh({self.device_type!r}, {dims}, devices={ids})"


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    *,
    mesh_dim_names: Sequence[str] | None = None,
) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over the `tpu` devices of every process of the run.

    Args:
        device_type: ``"tpu"``.
        mesh_shape: devices along each dimension; their product is the number of
            devices used (all of them in a multi-process run).
        mesh_dim_names: a name per dimension (default ``"dim0"``, ``"dim1"``, ...).

    Returns:
        A :class:`DeviceMesh`.

    Raises:
        MeshError: another device type, a bad shape or names, or more devices asked
            for than there are (the message says how to get more on CPU).

    Example::

        mesh = init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    """
    if str(device_type) != "tpu":
        raise MeshError(f"init_device_mesh({device_type!r}, ...): tpu_debug meshes are of 'tpu' devices")
    shape = tuple(mesh_shape)
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise MeshError(f"mesh_shape={mesh_shape!r}: give a tuple of positive device counts, e.g. (2, 4)")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else tuple(f"dim{i}" for i in range(len(shape)))
    if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        raise MeshError(
            f"mesh_dim_names={mesh_dim_names!r}: give one distinct name per mesh dimension ({len(shape)})"
        )
    start()  # the device's first use: before JAX's first backend probe
    devices = jax.devices()
    n = math.prod(shape)
    if n > len(devices) or (jax.process_count() > 1 and n != len(devices)):
        have = f"{len(devices)} device(s)"
        if jax.process_count() > 1:
            have += f" over {jax.process_count()} processes (a multi-process mesh uses all of them)"
        fix = (
            "on CPU, simulate more with 'tpu-debug run --devices N' or "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N set before jax starts"
            if devices[0].platform == "cpu" else "use a mesh of at most that many devices"
        )
        raise MeshError(f"a {'x'.join(map(str, shape))} mesh needs {n} devices; the run has {have}: {fix}")
    grid = np.array(devices[:n], dtype=object).reshape(shape)
    return DeviceMesh("tpu", jax.sharding.Mesh(grid, names))
