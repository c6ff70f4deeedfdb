"""The errors the target API raises on purpose (all ``TpuDebugError``s)."""

from __future__ import annotations

from tpu_debug.core.errors import TpuDebugError

__all__ = ["TargetError", "TargetSpecError", "LibtpuMissingError"]


class TargetError(TpuDebugError, ValueError):
    """A target compile or model was asked for something it cannot give."""


class TargetSpecError(TargetError):
    """A TPU target spec (``"v5e-8"``) that names no known generation or slice."""


class LibtpuMissingError(TpuDebugError, ImportError):
    """Compiling for a TPU target needs XLA's TPU compiler, which ships in libtpu."""
