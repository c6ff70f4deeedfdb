"""PyTorch's accelerator while the `tpu` device is registered: CPU until the script asks for `tpu`.

PyTorch decides its accelerator in C++ (``at::accelerator::getAccelerator``): a registered
PrivateUse1 backend comes first, before CUDA and the others, and PrivateUse1 counts as
registered as soon as it is renamed. Registering the `tpu` device renames it at ``import
torch``, so with the wheel installed ``torch._C._get_accelerator()`` would say ``tpu`` in
every process, and code that asks PyTorch for "the" accelerator changes what a CPU job
does: FSDP2's ``fully_shard(model)`` without a mesh builds its mesh on that device,
``init_process_group()`` with no backend picks that device's backend, ``barrier()`` and
``torch.accelerator.*`` use it.

The rename cannot wait (``torch.device("tpu")`` needs it), so the two functions PyTorch's
Python code asks, ``torch._C._get_accelerator`` and ``torch._C._accelerator_getAccelerator``
(behind ``torch.accelerator.current_accelerator``), answer as on a machine without an
accelerator until the script uses the device: its first kernel (a `tpu` tensor made, moved
or computed on), a process group or device mesh it makes for `tpu`
(``init_process_group("tpu_dist")``, ``init_process_group()`` with no backend, which asks
for the accelerator's as on TorchTPU, ``init_device_mesh("tpu", ...)``). From then on they
answer PyTorch's own ``tpu``. A CPU job (``init_process_group("gloo")``) never claims it
and runs as without the wheel. A script importing ``torch_tpu`` (written for TorchTPU, where
``tpu`` is the accelerator from the start) claims it at that import.

``torch.accelerator``'s memory functions (``memory_allocated``, ``max_memory_allocated``,
``memory_reserved``, ``max_memory_reserved``, ``memory_stats``, ``reset_peak_memory_stats``,
``reset_accumulated_memory_stats``, ``empty_cache``, ``empty_host_cache``, ``get_memory_info``)
are Python over seven ``torch._C._accelerator_*`` functions, which ask C++ for the accelerator's
``c10::DeviceAllocator`` (``at::getDeviceAllocator``). Only C++ can register one (no Python
binding makes or registers a ``DeviceAllocator``), and the allocator PyTorch holds for
PrivateUse1 here is not one, so each call fails PyTorch's internal assert
"Allocator for tpu is not a DeviceAllocator" (and ``emptyHostCache`` crashes the process once
the device is in use). While ``tpu`` is the accelerator those seven answer here instead, from the
runtime's memory ledger (:func:`tpu_debug.runtime.memory_ledger.counting`), and PyTorch's
Python functions above them work unchanged:

- ``allocated_bytes.all.{current,peak,allocated,freed}``: the bytes the `tpu` tensors' storages
  hold. Counting starts at the first of these calls (the tensors alive then are its first
  peak) and goes on for the rest of the process, as an allocator's does: from then on each
  payload the runtime sets is registered, with no probe subscribed (an eager add: 12.4-12.8 µs
  before, 17-19 µs after, on this project's 2-core machine; a compiled step pays it per program
  output); before it, tracking costs nothing.
- ``reserved_bytes.all.*``: the same figures. The runtime keeps no pool of freed buffers: a
  tensor's buffer goes back to XLA when its storage goes, so it reserves what it holds.
  (XLA's own allocator pool, where the platform has one, is ``jax.Device.memory_stats()``.)
- ``get_memory_info()``: free and total bytes of the device where XLA reports its capacity;
  on XLA's CPU platform the device's memory is the host's, so the host's.
- ``empty_cache()``, ``empty_host_cache()``: nothing to release (no pool, no pinned host cache).

Only those two statistics are in ``memory_stats()``: the others (pools, segments, retries)
describe a caching allocator this runtime does not have. Before the script uses the device
they answer as PyTorch does without an accelerator.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import jax
import torch
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime import memory_ledger

__all__ = ["claim", "claimed", "install"]

_lock = threading.Lock()
_claimed = False
_originals: dict[str, Any] = {}


def _get_accelerator(*args: Any, **kwargs: Any) -> Any:
    if _claimed:
        return _originals["_get_accelerator"](*args, **kwargs)
    return torch.device("cpu")  # what PyTorch answers with no accelerator


def _accelerator_get_accelerator(*args: Any, **kwargs: Any) -> Any:
    if _claimed:
        return _originals["_accelerator_getAccelerator"](*args, **kwargs)
    return None  # no accelerator


# PyTorch's text where there is no accelerator (at::accelerator::getAccelerator(true))
_NO_ACCELERATOR = "Cannot access accelerator device when none is available."


def _check_device(device_index: int) -> None:
    """Refuse what ``torch.accelerator``'s memory functions cannot ask for here: any device
    before the script uses tpu (as PyTorch without an accelerator), one other than tpu:0."""
    if not _claimed:
        raise RuntimeError(f"{_NO_ACCELERATOR} (the tpu device becomes PyTorch's accelerator when the script "
                           "first uses it: make a tpu tensor first)")
    if device_index != 0:
        # the same refusal as torch.tpu.set_device: every tpu tensor of this runtime is on tpu:0
        raise TpuArgumentError(f"tpu:{device_index} requested; the eager runtime runs on tpu:0 "
                               "(use tpu_debug.runtime.distributed for multi-device meshes)")


def _is_allocator_initialized() -> bool:
    _check_device(0)
    return True  # the device's buffers are XLA's, whose client exists once the device is used


def _empty_cache() -> None:
    _check_device(0)  # no pool of freed buffers to release (see the module)


def _empty_host_cache() -> None:
    _check_device(0)  # no pinned host memory is cached: copies go through XLA's transfers


def _get_device_stats(device_index: int) -> dict[str, Any]:
    _check_device(device_index)
    held = memory_ledger.counting()
    stat = {"current": held.live_bytes, "peak": held.peak_bytes, "allocated": held.allocated_bytes,
            "freed": held.freed_bytes}
    # reserved: the runtime keeps no buffer beyond what the tensors hold (see the module)
    return {"allocated_bytes": {"all": stat}, "reserved_bytes": {"all": dict(stat)}}


def _reset_accumulated_stats(device_index: int) -> None:
    _check_device(device_index)
    memory_ledger.counting().reset_accumulated()


def _reset_peak_stats(device_index: int) -> None:
    _check_device(device_index)
    memory_ledger.counting().reset_peak()


def _get_memory_info(device_index: int) -> tuple[int, int]:
    _check_device(device_index)
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    if limit is not None:
        return limit - stats.get("bytes_in_use", 0), limit
    # XLA's CPU client reports no capacity: its buffers are host memory
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


_WRAPPERS = {
    "_get_accelerator": _get_accelerator,
    "_accelerator_getAccelerator": _accelerator_get_accelerator,
    # the memory functions' C++ entry points, which need a DeviceAllocator (see the module)
    "_accelerator_isAllocatorInitialized": _is_allocator_initialized,
    "_accelerator_emptyCache": _empty_cache,
    "_accelerator_emptyHostCache": _empty_host_cache,
    "_accelerator_getDeviceStats": _get_device_stats,
    "_accelerator_resetAccumulatedStats": _reset_accumulated_stats,
    "_accelerator_resetPeakStats": _reset_peak_stats,
    "_accelerator_getMemoryInfo": _get_memory_info,
}


def install() -> None:
    """Make PyTorch's accelerator CPU until :func:`claim` (once; the device registration calls it)."""
    from torch._C._dynamo import eval_frame

    # PyTorch's code calls these in eager frames that run with dynamo's frame callback set
    # (after a graph break): dynamo runs their frames without looking at them, as it does the
    # C functions they stand in for
    skip = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
    for wrapper in _WRAPPERS.values():
        eval_frame.set_code_exec_strategy(wrapper.__code__, skip)
    with _lock:
        for name, wrapper in _WRAPPERS.items():
            current = getattr(torch._C, name, None)
            if current is None or current is wrapper:
                continue
            _originals[name] = current
            setattr(torch._C, name, wrapper)
    # a script that imported torch_tpu before the device registered (runtime/torchtpu/root.py)
    if getattr(sys.modules.get("torch_tpu"), "__tpu_debug_shim__", False):
        claim()


def claim() -> None:
    """The script uses the `tpu` device: PyTorch's accelerator is ``tpu`` from now on."""
    global _claimed
    if not _claimed:
        _claimed = True
        # torch.get_device_module() keeps its first answer for "the accelerator's module"
        cache_clear = getattr(torch.get_device_module, "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


def claimed() -> bool:
    """Whether the script has used the `tpu` device (PyTorch's accelerator is ``tpu``)."""
    return _claimed
