"""Data and tensor parallelism on a device mesh, and multi-process runs.

The engine is JAX's own: a ``jax.sharding.Mesh`` over the devices of one
process, or of every process after ``jax.distributed.initialize``. A `tpu`
tensor is sharded by placing its payload on the mesh (``mark_sharding``,
``distribute_tensor``, ``parallelize_module``); compiled programs take their
input shardings from their inputs and XLA's sharding propagation inserts the
collectives. Before each call of a program that spans processes, the ranks
check they are all about to run it (``rankcheck``).

Example::

    from tpu_debug.runtime import distributed as dist
    mesh = dist.init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.parallelize_module(model, mesh["tp"], {"mlp.up": dist.ColwiseParallel(),
                                                "mlp.down": dist.RowwiseParallel()})
    dist.distribute_module(model, mesh)           # everything else replicated
    dist.mark_sharding(batch, mesh, ("dp", None))  # data parallel
    loss = tpu_debug.compile(train_step)(batch)

Importing this package imports neither torch nor jax: each name imports its module on first use.
"""

from __future__ import annotations

from tpu_debug.core.autoload import lazy_exports
from tpu_debug.runtime.distributed.config import DistributedConfig
from tpu_debug.runtime.distributed.config import config as distributed_config
from tpu_debug.runtime.distributed.errors import (
    LaunchError,
    MeshError,
    RankDivergenceError,
    RankTimeoutError,
    ShardingError,
)

__all__ = [
    "ColwiseParallel",
    "DeviceMesh",
    "DistributedConfig",
    "LaunchError",
    "MeshError",
    "ParallelStyle",
    "Placement",
    "RankDivergenceError",
    "RankTimeoutError",
    "Replicate",
    "RowwiseParallel",
    "Shard",
    "ShardingError",
    "clear_sharding",
    "distribute_module",
    "distribute_tensor",
    "distributed_config",
    "get_rank",
    "get_world_size",
    "init_device_mesh",
    "initialize",
    "is_initialized",
    "is_sharded",
    "launch_ranks",
    "local_shape",
    "mark_sharding",
    "parallelize_module",
    "process_info",
    "sharding_spec",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "tpu_debug.runtime.distributed.launch": (
            "get_rank",
            "get_world_size",
            "initialize",
            "is_initialized",
            "launch_ranks",
            "process_info",
        ),
        "tpu_debug.runtime.distributed.mesh": ("DeviceMesh", "init_device_mesh"),
        "tpu_debug.runtime.distributed.parallel": (
            "ColwiseParallel",
            "ParallelStyle",
            "RowwiseParallel",
            "distribute_module",
            "parallelize_module",
        ),
        "tpu_debug.runtime.distributed.sharding": (
            "Placement",
            "Replicate",
            "Shard",
            "clear_sharding",
            "distribute_tensor",
            "is_sharded",
            "local_shape",
            "mark_sharding",
            "sharding_spec",
        ),
    },
)
