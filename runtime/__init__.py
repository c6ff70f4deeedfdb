"""PyTorch on XLA through JAX: the `tpu` device, eager and compiled execution.

Public surface: ``install()`` (idempotent), ``start()`` (what the device's first use
does, once), ``config``, ``probes``,
``cache_stats()``, ``cache_counts()`` (how full each bounded cache is).

Importing this package loads neither torch nor jax: the probe interface, the options and
the cache bounds are light, and every other name imports its module on first use. So a
tracer or a reader can import ``tpu_debug.runtime.probes`` without starting a device.
"""

from __future__ import annotations

from tpu_debug.core.autoload import lazy_exports
from tpu_debug.runtime import probes
from tpu_debug.runtime.caches import CacheCounts, cache_counts
from tpu_debug.runtime.config import config

__all__ = [
    "CacheCounts",
    "DeviceTakenError",
    "cache_counts",
    "cache_stats",
    "clear_cache",
    "config",
    "float64_ops",
    "install",
    "installed",
    "probes",
    "start",
]

# torch's backend autoload registers the device at `import torch`; when a module of this
# package brought torch in, that registration waits for the first of these names to be used
# (tpu_debug.core.autoload)
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "tpu_debug.runtime.device": ("DeviceTakenError", "install", "installed"),
        "tpu_debug.runtime.startup": ("start",),
        "tpu_debug.runtime.eager": ("cache_stats", "clear_cache", "float64_ops"),
    },
)
