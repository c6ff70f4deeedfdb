"""The ``torch.tpu`` submodules TorchTPU's ``public_api`` declares, and ``torch.backends.tpu``.

Each submodule is made when the device registers, empty: its names are looked up on
first use (importing ``torch`` stays cheap, and ``torch.tpu.pallas`` imports Pallas only
when a name of it is read). A name with a meaning here is this runtime's; a name that
needs a TPU (TorchTPU's SparseCore and collective kernels, its fused optimizers) raises
one :class:`~tpu_debug.core.errors.UnsupportedError` line saying so and what to use.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import jax
from tpu_debug.core.errors import UnsupportedError
from tpu_debug.runtime import xla_options
from tpu_debug.runtime.pallas import jax_op
from tpu_debug.runtime.torchtpu.launcher import prepare_tpu_environment

__all__ = ["SUBMODULES", "install", "needs_a_tpu"]


def needs_a_tpu(qualname: str, instead: str) -> Callable[..., Any]:
    """A stand-in for TorchTPU name ``qualname`` that raises, naming what to use."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedError(f"{qualname} needs TorchTPU on a TPU; tpu_debug's runtime has no counterpart: "
                               f"{instead}")

    refuse.__name__ = refuse.__qualname__ = qualname.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Not available here: {instead}"
    return refuse


_SPARSE = "use PyTorch's nn.EmbeddingBag / torch.sparse ops, which run here"
_RAGGED = "use PyTorch ops for the grouped or ragged computation (a loop over groups, torch._grouped_mm)"
_COLLECTIVE = "use torch.distributed's collectives (all_gather_into_tensor, reduce_scatter_tensor, send, recv)"
_OPTIM = "use torch.optim's optimizer of the same name (DEFER_AND_FUSE mode fuses its step here)"

# module -> {name: "module:attribute" (this runtime's) or ("refuse", what to use instead)}
SUBMODULES: dict[str, dict[str, Any]] = {
    "torch.tpu.compiler": {"custom_compiler_options": "tpu_debug.runtime.xla_options:custom_compiler_options"},
    "torch.tpu.distributed": {
        "set_tpu_launch_env": "tpu_debug.runtime.torchtpu.public:set_tpu_launch_env",
        "spmd_safe": "tpu_debug.runtime.torchtpu.public:spmd_safe",
        "topology_aware_mesh": "tpu_debug.runtime.torchtpu.public:topology_aware_mesh",
        "window_num_stripes": ("refuse", "WindowTpu DMA striping is a TPU interconnect setting; leave it out"),
        "window_stripe_chunk_mb": ("refuse", "WindowTpu DMA striping is a TPU interconnect setting; leave it out"),
    },
    "torch.tpu.ops": {
        "max_pool1d": "torch.nn.functional:max_pool1d",
        "max_pool2d": "torch.nn.functional:max_pool2d",
        "max_pool3d": "torch.nn.functional:max_pool3d",
        "optimization_barrier": "tpu_debug.runtime.torchtpu.public:optimization_barrier",
        **{name: ("refuse", _SPARSE) for name in (
            "sparse_dense_matmul", "sparse_dense_matmul_activation_unstack", "sparse_dense_matmul_grad_with_adagrad",
            "sparse_dense_matmul_grad_with_adam", "sparse_dense_matmul_grad_with_sgd",
            "sparse_dense_matmul_gradient_stack", "sparse_gather", "sparse_gather_backward", "sparse_iota",
            "sparse_map_row")},
        "align_jagged_to_multiple": "tpu_debug.runtime.torchtpu.ops:align_jagged_to_multiple",
        # the op torch.ops.tpu.ragged_dot and torch.ops.torch_tpu.ragged_dot call
        "ragged_dot": "tpu_debug.runtime.torchtpu.ops:ragged_dot",
        "strip_jagged_padding": "tpu_debug.runtime.torchtpu.ops:strip_jagged_padding",
        **{name: ("refuse", _RAGGED) for name in (
            "ragged_dot_weight_grad", "max_pool1d_backward", "max_pool2d_backward",
            "max_pool3d_backward")},
        **{name: ("refuse", _COLLECTIVE) for name in (
            "all_gather_dim", "reduce_scatter_dim", "ragged_all_to_all", "send", "recv")},
        "splash_sdpa": "tpu_debug.runtime.torchtpu.splash_attention:splash_sdpa",
    },
    "torch.tpu.optimizers": {name: ("refuse", _OPTIM) for name in
                             ("AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer")},
    "torch.tpu.pallas": {"get_pallas_mesh": "tpu_debug.runtime.pallas:get_pallas_mesh",
                         "jax_op": "tpu_debug.runtime.pallas:jax_op"},
}


class _LazyModule(types.ModuleType):
    """A ``torch.tpu`` submodule whose names are resolved on first read."""

    def __init__(self, name: str, table: dict[str, Any]) -> None:
        super().__init__(name, f"TorchTPU's {name} on tpu_debug's runtime (see docs/torchtpu_compat.md).")
        self._table = table
        self.__all__ = sorted(table)

    def __getattr__(self, attr: str) -> Any:
        target = self.__dict__.get("_table", {}).get(attr)
        if target is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        if isinstance(target, tuple):
            value = needs_a_tpu(f"{self.__name__}.{attr}", target[1])
        else:
            module, _, name = target.partition(":")
            value = getattr(importlib.import_module(module), name)
        setattr(self, attr, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.__all__})


class _BackendsTpu(types.ModuleType):
    """``torch.backends.tpu``: the backend's process-wide switches."""

    @property
    def allow_excess_precision(self) -> bool:
        """Whether XLA may keep more precision than a result's dtype (see runtime/xla_options.py)."""
        return xla_options.excess_precision()

    @allow_excess_precision.setter
    def allow_excess_precision(self, allowed: bool) -> None:
        xla_options.set_excess_precision(allowed)


def install(tpu_module: Any, profiler: types.ModuleType, utils: types.ModuleType) -> None:
    """Register the submodules under ``torch.tpu`` (``sys.modules`` and attributes of the device
    module) and ``torch.backends.tpu``; a module already registered stays."""
    import torch

    made = {"torch.tpu.profiler": profiler, "torch.tpu.utils": utils}
    made.update({name: _LazyModule(name, table) for name, table in SUBMODULES.items()})
    for name, module in made.items():
        module = sys.modules.setdefault(name, module)
        setattr(type(tpu_module), name.rsplit(".", 1)[1], module)
    backends = sys.modules.setdefault("torch.backends.tpu", _BackendsTpu("torch.backends.tpu"))
    torch.backends.tpu = backends


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set the variables a launch's ranks read, before they are spawned (TorchTPU's
    ``torch.tpu.distributed.set_tpu_launch_env``): ``WORLD_SIZE`` and the topology."""
    world = None if nproc_per_node is None else nproc_per_node * (nnodes or 1)
    prepare_tpu_environment(world)


def spmd_safe(func: Callable) -> Callable:
    """TorchTPU runs each eager collective in a program of its own unless a function is
    marked SPMD-safe; here a collective is never fused with other ops (it runs on the host,
    runtime/distributed/c10d/), so there is nothing to relax: ``func`` is returned as is."""
    return func


def topology_aware_mesh(mesh_shape: tuple[int, ...], *, dcn_mesh_shape: tuple[int, ...] | None = None,
                        allow_split_physical_axes: bool = False, contiguous_submeshes: bool = False):
    """The ranks laid out in ``mesh_shape`` (for ``init_device_mesh``'s ``mesh``): in rank order,
    since this runtime's ranks have no physical torus to follow."""
    import torch

    shape = tuple(mesh_shape) if dcn_mesh_shape is None else tuple(a * b for a, b in zip(mesh_shape, dcn_mesh_shape))
    return torch.arange(math.prod(shape)).reshape(shape)


def optimization_barrier(inputs):
    """XLA's optimization barrier around ``inputs`` (TorchTPU's ``torch.tpu.ops``): the same
    tensors' values, with nothing fused or moved across it in the program they are part of."""
    return list(_barrier_op()(list(inputs)))


_made: dict[str, Any] = {}


def _barrier_op():
    if "barrier" not in _made:
        def barrier(inputs: list[jax.Array]) -> list[jax.Array]:
            return list(jax.lax.optimization_barrier(tuple(inputs)))

        _made["barrier"] = jax_op("tpu_debug::optimization_barrier", barrier)
    return _made["barrier"]
