"""Registering the c10d backends ``tpu`` and ``tpu_dist``, and the guards that name a wrong
backend or a mesh bigger than the job, with the fix, in one line."""

from __future__ import annotations

import functools
import math
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.post_import import when_imported
from tpu_debug.core.rank_env import read_rank_env
from tpu_debug.runtime import accelerator
from tpu_debug.runtime.distributed.c10d.host_engine import host_group
from tpu_debug.runtime.distributed.c10d.process_group import TpuProcessGroup
from tpu_debug.runtime.distributed.errors import CollectiveDeviceError, LaunchError, MeshError

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKEND", "register_backends"]

BACKEND_NAMES = ("tpu", "tpu_dist")
DEFAULT_BACKEND = "tpu_dist"
_lock = threading.Lock()
_registered = False


def _creator(name: str) -> Callable[[Any, Any], TpuProcessGroup]:
    def create(opts: Any, backend_options: Any = None) -> TpuProcessGroup:
        host = host_group(opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.group_id,
                          opts.global_ranks_in_group)
        return TpuProcessGroup(host, opts.group_rank, opts.group_size, name, opts.global_ranks_in_group,
                               store=opts.store)

    create.__name__ = f"create_{name}_process_group"
    return create


def _this_rank(explicit: Any = None) -> str:
    if explicit in (None, -1):
        try:
            explicit = read_rank_env().rank
        except ConfigError:  # naming the rank in another error: a bad RANK is not that error
            explicit = None
    return f"rank {explicit}" if explicit is not None else "this process"


def _guard_init(init: Callable) -> Callable:
    """``init_process_group`` that names a backend the `tpu` device cannot use, and the fix,
    in one line (torch says "Unknown backend type", or fails deep in NCCL)."""

    @functools.wraps(init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            # no backend asks for the accelerator's, as on TorchTPU: the device's tpu_dist (which
            # runs CPU tensors too, through gloo), and its sub-groups the same; "gloo" keeps CPU's
            if backend is None or any(name in str(backend).lower().replace(":", ",").split(",")
                                      for name in BACKEND_NAMES):
                accelerator.claim()
            return init(backend, *args, **kwargs)
        except (AssertionError, RuntimeError, ValueError) as exc:
            if "Unknown backend type" in str(exc):
                why = "torch.distributed has no backend of that name"
            elif str(backend).lower() == "nccl" and not torch.cuda.is_available():
                why = "NCCL runs on CUDA GPUs, and this machine has none"
            else:
                raise
            raise LaunchError(
                f"{_this_rank(kwargs.get('rank'))}: init_process_group(backend={backend!r}): {why}. On the tpu "
                "device give \"tpu_dist\" or \"tpu\" (TorchTPU's backends), or no backend: init_process_group() "
                "picks tpu_dist; \"gloo\" is CPU's."
            ) from None

    init_process_group._tpu_debug_guard = True  # type: ignore[attr-defined]
    return init_process_group


def _guard_mesh() -> None:
    """``init_device_mesh`` that says, for a mesh bigger than the job, what to launch."""
    module = sys.modules["torch.distributed.device_mesh"]
    init = getattr(module, "init_device_mesh", None)
    if init is None or getattr(init, "_tpu_debug_guard", False):
        return

    @functools.wraps(init)
    def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        if device_type == "tpu":
            accelerator.claim()
        try:
            return init(device_type, mesh_shape, *args, **kwargs)
        except RuntimeError as exc:
            if "Mesh should not be bigger than default world size" not in str(exc):
                raise
            world, need = dist.get_world_size(), math.prod(mesh_shape)
            raise MeshError(
                f"{_this_rank(dist.get_rank())}: init_device_mesh({device_type!r}, {tuple(mesh_shape)}) needs "
                f"{need} ranks, and the job has {world}: start {need} processes (torchrun --nproc-per-node "
                f"{need}), or give a mesh shape whose sizes multiply to {world}"
            ) from None

    init_device_mesh._tpu_debug_guard = True  # type: ignore[attr-defined]
    module.init_device_mesh = init_device_mesh


def register_backends() -> None:
    """Register the c10d backends ``tpu`` and ``tpu_dist`` for the `tpu` device, once, and make
    ``tpu_dist`` its default (``init_process_group()`` with no backend on `tpu`)."""
    global _registered
    with _lock:
        if _registered:
            return
        for name in BACKEND_NAMES:
            if name.upper() not in dist.Backend._plugins:
                dist.Backend.register_backend(name, _creator(name), extended_api=True, devices=["tpu", "cpu"])
        # register_backend gives a device to the first backend that claims it: CPU stays
        # gloo's, and tpu gets TorchTPU's default even when "tpu" was registered first
        dist.Backend.default_device_backend_map["tpu"] = DEFAULT_BACKEND
        for module in (dist, sys.modules["torch.distributed.distributed_c10d"]):
            if not getattr(module.init_process_group, "_tpu_debug_guard", False):
                module.init_process_group = _guard_init(module.init_process_group)
        when_imported("torch.distributed.device_mesh", _guard_mesh)
        _name_tpu_tensors_on_other_groups()
        _registered = True


def _name_tpu_tensors_on_other_groups() -> None:
    """A `tpu` tensor given to a group of another backend (``init_process_group("gloo")``)
    raises one line naming the fix, not c10d's "No backend type associated with device type
    tpu". PyTorch's c10d ops reach their PrivateUse1 kernels only for such groups: the `tpu`
    process group runs its collectives in its own methods."""
    lib = torch.library.Library("c10d", "IMPL")
    ops = [n.removeprefix("c10d::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("c10d::")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replacing c10d's PrivateUse1 kernels is the point
        for op in ops:
            if "PrivateUse1: registered" in torch._C._dispatch_dump(f"c10d::{op}"):
                lib.impl(op, _on_other_group(op.strip("_")), "PrivateUse1")
    _libraries.append(lib)


_libraries: list[Any] = []  # kept alive: a Library's kernels go with it


def _on_other_group(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        group = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        try:
            backend = dist.ProcessGroup.unbox(group).name() if group is not None else "another"
        except (RuntimeError, TypeError, AttributeError):
            backend = "another"
        raise CollectiveDeviceError(
            f"{_this_rank()}: {name} got a tpu tensor on a process group of backend {backend!r}, which has none "
            f"for the tpu device ({backend} runs CPU tensors): make the group for tpu tensors with "
            "init_process_group() or init_process_group(\"tpu_dist\") (gloo runs underneath, on host copies), "
            f"or move the tensors to the CPU (.cpu()) for this {backend} group"
        )

    refuse.__name__ = f"{name}_on_a_group_without_tpu"
    return refuse
