"""PyTorch on XLA through JAX: the `tpu` device, eager and compiled execution.

Public surface: ``install()`` (idempotent), ``start()`` (what the device's first use
does, once), ``config``, ``probes``,
``cache_stats()``, ``cache_counts()`` (how full each bounded cache is).
"""

from __future__ import annotations

from tpu_debug.runtime import probes
from tpu_debug.runtime.caches import CacheCounts, cache_counts
from tpu_debug.runtime.config import config
from tpu_debug.runtime.device import DeviceTakenError, install, installed, start
from tpu_debug.runtime.eager import cache_stats, clear_cache, float64_ops

__all__ = [
    "install",
    "installed",
    "start",
    "config",
    "probes",
    "cache_stats",
    "cache_counts",
    "CacheCounts",
    "clear_cache",
    "float64_ops",
    "DeviceTakenError",
]

# torch's backend autoload registers the device at `import torch`; when this package's own
# import brought torch in, that registration waited for it to finish (tpu_debug.core.autoload)
from tpu_debug.core.autoload import run_deferred as _run_deferred  # noqa: E402

_run_deferred()
