"""``torch_tpu._internal.testing``: what TorchTPU's tests call between tests.

``reset_eager_state()`` runs what DEFER_AND_FUSE mode holds pending (so no op recorded by one
test runs in the next), then puts the eager mode and the CPU fallback back to where the
runtime started.
"""

from __future__ import annotations

from tpu_debug.runtime import lazy
from tpu_debug.runtime.config import config
from tpu_debug.runtime.torchtpu.execution_mode_impl import default_mode

__all__ = ["reset_eager_state"]


def reset_eager_state() -> None:
    """Run what is pending and restore the eager mode and CPU fallback the runtime started with."""
    lazy.materialize("reset_eager_state")
    lazy.set_mode(default_mode())
    config.cpu_fallback = False
