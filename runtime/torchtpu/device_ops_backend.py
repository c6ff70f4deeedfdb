"""``torch_tpu._internal.device._device_ops_backend`` (``torch_tpu.api._device_ops_backend`` in the
older layout): the functions TorchTPU's C++ extension gives its device module, over this
runtime.

The runtime's start, the executable caches' counters and HBM summary (``torch.tpu``'s), the
seed, and whether this is an optimized build (False: no TorchTPU build is here; TorchTPU's
tests read it to choose their random seeds).
"""

from __future__ import annotations

import dataclasses

from tpu_debug.runtime.device import TpuModule
from tpu_debug.runtime.torchtpu.device_module import DeviceModule

__all__ = ["InitResult", "manual_seed_all"]


@dataclasses.dataclass(frozen=True)
class InitResult:
    """What starting the runtime gives: the devices and this process's device index."""

    device_count: int
    device_id: int


def _init_runtime(device_type: str = "tpu") -> InitResult:
    DeviceModule._init_runtime(device_type)
    return InitResult(DeviceModule._device_count, DeviceModule._current_device)


def _shutdown_runtime() -> None:
    DeviceModule._shutdown_runtime()


def _is_optimized_build() -> bool:
    return False


def manual_seed_all(seed: int) -> None:
    TpuModule.manual_seed_all(seed)


_get_cache_requests = TpuModule._get_cache_requests
_get_cache_hits = TpuModule._get_cache_hits
_get_cache_misses = TpuModule._get_cache_misses
_get_cache_stats = TpuModule._get_cache_stats
_clear_cache = TpuModule._clear_cache
_hbm_usage_summary = TpuModule._hbm_usage_summary
