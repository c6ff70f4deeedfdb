"""``torch_tpu._internal.utils.device_utils`` (also ``torch_tpu._internal.torchbenchmark.device_utils``):
the device helpers TorchTPU's benchmarks call with a device type, so one script measures
``tpu`` and ``cuda`` alike.

``synchronize(device, tensors)`` waits for the tensors' values (on ``tpu``, after what
DEFER_AND_FUSE mode holds pending runs); ``cache_miss_count(device)`` is the number of
executables compiled so far (the warm-up loops stop when it stops growing);
``clear_cache(device)`` drops them; ``torch_compile(fn, device, dynamic=False)`` compiles with
the ``tpu`` backend (``TpuBackend(dynamism=True)`` and ``dynamic=None`` for dynamic shapes);
``get_peak_memory_hbm(device, session_id, xprof_client)`` reads the peak of device memory from
an XProf memory profile, -1.0 without one, as TorchTPU does. A device type other than ``tpu``,
``cuda`` or ``cpu`` is TorchTPU's ``ValueError("Unsupported device: ...")``.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime.torchtpu import sync
from tpu_debug.runtime.torchtpu.compile import TpuBackend

__all__ = ["cache_miss_count", "clear_cache", "get_peak_host_compilation_memory_mb", "get_peak_memory_hbm",
           "reset_peak_memory_stats", "synchronize", "torch_compile"]

_MB = 1024 * 1024


def _unsupported(device: str) -> TpuArgumentError:
    return TpuArgumentError(f"Unsupported device: {device} (device_utils takes 'tpu', 'cuda' or 'cpu')")


def synchronize(device: str, tensor_to_sync: Any) -> None:
    """Wait for the tensors in ``tensor_to_sync`` (a tensor, or a pytree of them).

    Args:
        device: ``"tpu"`` (runs what is pending, then waits for these values) or ``"cuda"``.
        tensor_to_sync: the tensors (other leaves are skipped).

    Raises:
        TpuArgumentError: another device type (a ``ValueError``, as on TorchTPU).

    Example::

        synchronize("tpu", model(x))
    """
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "tpu":
        leaves, _ = tree_flatten(tensor_to_sync)
        sync.synchronize([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], wait=True)
    else:
        raise _unsupported(device)


def cache_miss_count(device: str) -> int:
    """Executables compiled so far on ``device`` (``torch.tpu._get_cache_misses()``; 0 on ``cuda``).

    Raises:
        TpuArgumentError: another device type.
    """
    if device == "cuda":
        return 0
    if device == "tpu":
        return torch.tpu._get_cache_misses()
    raise _unsupported(device)


def clear_cache(device: str) -> None:
    """Drop every compiled executable of ``device`` (``torch.tpu._clear_cache()``; nothing on ``cuda``).

    Raises:
        TpuArgumentError: another device type.
    """
    if device == "tpu":
        torch.tpu._clear_cache()
    elif device != "cuda":
        raise _unsupported(device)


def torch_compile(func: Callable[..., Any], device: str, dynamic: bool = False) -> Callable[..., Any]:
    """``torch.compile(func)`` with the device's backend.

    Args:
        func: a module or function.
        device: ``"tpu"`` (TorchTPU's backend object) or ``"cuda"`` (inductor).
        dynamic: start static and let dynamo find the dynamic sizes (``dynamic=None``) with a
            dynamism-enabled backend; False compiles static shapes only.

    Raises:
        TpuArgumentError: another device type.
    """
    if device == "cuda":
        return torch.compile(func, backend="inductor")
    if device != "tpu":
        raise _unsupported(device)
    return torch.compile(func, dynamic=None if dynamic else False, backend=TpuBackend(dynamism=dynamic))


def reset_peak_memory_stats(device: str) -> None:
    """Reset CUDA's peak counter; nothing to reset on ``tpu`` and ``cpu``, whose peaks come
    from a profile and the process.

    Raises:
        TpuArgumentError: another device type.
    """
    if device == "cuda":
        torch.cuda.memory.reset_max_memory_allocated()
    elif device not in ("tpu", "cpu"):
        raise _unsupported(device)


def get_peak_memory_hbm(device: str, session_id: str | None = None, xprof_client: Any = None) -> float:
    """Peak memory of ``device`` in MB.

    Args:
        device: ``"tpu"``: the peak bytes in use of device 0's allocator in the session's
            XProf memory profile (``xprof_client.get_profile_data("memory_profile.json",
            session_id)``), -1.0 without a session and a client or when the profile holds
            none; ``"cuda"``: CUDA's peak allocated; ``"cpu"``: the process's peak resident memory.
        session_id: the profiling session.
        xprof_client: what reads its profile.

    Raises:
        TpuArgumentError: another device type.
    """
    if device == "cuda":
        return torch.cuda.memory.max_memory_allocated() / _MB
    if device == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _MB  # Linux reports KiB
    if device != "tpu":
        raise _unsupported(device)
    if not session_id or xprof_client is None:
        return -1.0
    _, data = xprof_client.get_profile_data("memory_profile.json", session_id)
    if not data:
        return -1.0
    try:
        summary = json.loads(data)["memoryProfilePerAllocator"]["0"]["profileSummary"]
        return float(summary["peakStats"]["peakBytesInUse"]) / _MB
    except (KeyError, ValueError):  # a profile without device 0's allocator (json's errors are ValueErrors)
        return -1.0


def get_peak_host_compilation_memory_mb(device: str) -> float | None:
    """The host memory XLA's compiles took at their peak, in MB: None, as TorchTPU answers
    where its backend does not record it (this runtime does not)."""
    del device
    return None
