"""tpu_debug: see what PyTorch does on an XLA (TPU) device, op by op and compile by compile.

``import tpu_debug`` registers the ``tpu`` device (once).
"""

from __future__ import annotations

from tpu_debug._version import __version__
from tpu_debug.runtime import install as _install

__all__ = ["__version__"]

_install()
