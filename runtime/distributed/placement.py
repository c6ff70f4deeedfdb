"""Where a payload lives, as the eager and compiled executables need to know it.

An executable is compiled for its inputs' shardings. Until a mesh exists every
payload sits on one device and nothing here runs (``active`` is False, and the
runtime tests it first). Afterwards the runtime keys executables by each
input's placement (None for one device, else its sharding), lowers programs with
those shardings, and puts single-device inputs of a mesh program on the mesh,
replicated.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from tpu_debug.runtime.distributed.errors import ShardingError

__all__ = [
    "active",
    "placement",
    "describe",
    "layout",
    "mesh_of",
    "abstract",
    "onto_mesh",
    "put",
    "spans_processes",
    "host_value",
]

#: set by the first DeviceMesh; the runtime reads placements only from then on
active = False


# each sharding met, in its canonical form (see placement); a few per model
_canonical: dict[Any, Any] = {}


def placement(arr: Any) -> Any:
    """The sharding of ``arr`` when it spans more than one device, else None.

    Equivalent shardings come back as one object: XLA writes ``P('tp', None)`` of an
    input as ``P('tp',)`` in an output, and a key holding either must find the same
    executable (which accepts both).
    """
    sh = getattr(arr, "sharding", None)
    if sh is None or type(sh) is SingleDeviceSharding:
        return None
    canon = _canonical.get(sh)
    if canon is None:
        if len(sh.device_set) <= 1:
            canon = False
        elif isinstance(sh, NamedSharding):
            spec = list(sh.spec)
            while spec and spec[-1] is None:
                spec.pop()
            canon = NamedSharding(sh.mesh, PartitionSpec(*spec), memory_kind=sh.memory_kind)
        else:
            canon = sh
        if len(_canonical) > 4096:
            _canonical.clear()
        _canonical[sh] = canon
    return canon or None


def describe(sh: Any) -> str:
    """A sharding as text: ``P(dp, None) on dp=2,tp=4``, ``replicated on dp=2,tp=4``."""
    if isinstance(sh, NamedSharding):
        mesh = ",".join(f"{n}={s}" for n, s in sh.mesh.shape.items())
        entries = [e for e in sh.spec]
        if all(e is None for e in entries):
            return f"replicated on {mesh}"
        text = ", ".join("None" if e is None else "+".join(e) if isinstance(e, tuple) else str(e) for e in entries)
        return f"P({text}) on {mesh}"
    return str(sh)


def layout(arr: Any) -> tuple[tuple[str, str], ...]:
    """What an executable's key holds about where ``arr`` lives (for recompile diffs)."""
    sh = placement(arr)
    return (("sharding", describe(sh)),) if sh is not None else ()


def mesh_of(arrays: list) -> Any:
    """The mesh the multi-device arrays among ``arrays`` share (None when there is none).

    Raises:
        ShardingError: two inputs live on different device sets.
    """
    found = None
    where = -1
    for i, a in enumerate(arrays):
        sh = placement(a)
        if sh is None:
            continue
        if found is None:
            found, where = sh, i
        elif sh.device_set != found.device_set:
            raise ShardingError(
                f"inputs {where} and {i} of one program live on different devices "
                f"({_ids(found)} and {_ids(sh)}); put every input of a program on one mesh"
            )
    if found is None:
        return None
    if isinstance(found, NamedSharding):
        return found.mesh
    raise ShardingError(f"input {where} is sharded by a {type(found).__name__}; shard with a DeviceMesh")


def _ids(sh: Any) -> str:
    return "[" + ", ".join(str(d.id) for d in sorted(sh.device_set, key=lambda d: d.id)) + "]"


def abstract(arrays: list, mesh: Any) -> list:
    """Abstract inputs for lowering: each array's shape and dtype with its sharding; with a
    ``mesh``, single-device arrays replicated over it."""
    replicated = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None
    out = []
    for a in arrays:
        sh = placement(a)
        out.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh if sh is not None else replicated))
    return out


def put(arr: Any, sharding: Any) -> Any:
    """``arr`` laid out by ``sharding``.

    On devices of this process only, this is ``jax.device_put``. A sharding over devices of
    several processes takes this process's shards from its own ``arr`` (every process is
    meant to pass the same value): ``jax.device_put`` would first compare the values of all
    processes, a collective every process must reach, hidden in a call that looks local. An
    array already spread over processes is resharded by a program every process runs.
    """
    if sharding.is_fully_addressable:
        return jax.device_put(arr, sharding)
    if not getattr(arr, "is_fully_addressable", True):
        return jax.jit(lambda x: x, out_shardings=sharding)(arr)
    shards = [
        jax.device_put(arr[index], device)
        for device, index in sharding.addressable_devices_indices_map(tuple(arr.shape)).items()
    ]
    return jax.make_array_from_single_device_arrays(tuple(arr.shape), sharding, shards)


def onto_mesh(arrays: list, mesh: Any, storages: dict[int, Any], payload_attr: str) -> None:
    """Replicate the single-device arrays of ``arrays`` over ``mesh`` (in place in the list).

    A replicated array replaces the payload of its storage (``storages``: index -> the
    storage whose whole payload it is), so a parameter left unsharded moves to the mesh
    once, not at every call.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    for i, a in enumerate(arrays):
        if not hasattr(a, "shape") or placement(a) is not None:
            continue
        moved = put(a, replicated)
        arrays[i] = moved
        storage = storages.get(i)
        if storage is not None and getattr(storage, payload_attr, None) is a:
            setattr(storage, payload_attr, moved)


def spans_processes(arrays: list) -> bool:
    """Whether a program over ``arrays`` runs on devices of more than one process."""
    me = jax.process_index()
    for a in arrays:
        sh = placement(a)
        if sh is not None and any(d.process_index != me for d in sh.device_set):
            return True
    return False


def host_value(arr: Any) -> Any:
    """``arr`` as a NumPy array. An array sharded across processes is readable here only when
    replicated (each process holds all of it).

    Raises:
        ShardingError: ``arr`` is split across processes.
    """
    import numpy as np

    if arr.is_fully_addressable:
        return np.array(arr)
    if arr.is_fully_replicated:
        return np.array(arr.addressable_data(0))
    raise ShardingError(
        f"a tensor of shape {list(arr.shape)} sharded as {describe(arr.sharding)} is split across processes, "
        "so no process holds all of it: read a replicated value instead (reshard it with "
        "distributed.mark_sharding(t, mesh, (None,) * t.dim()), or reduce it inside the compiled step)"
    )
