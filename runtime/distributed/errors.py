"""The errors the distributed API raises on purpose (all ``TpuDebugError``s)."""

from __future__ import annotations

from tpu_debug.core.errors import TpuDebugError

__all__ = ["MeshError", "ShardingError", "LaunchError", "RankDivergenceError", "RankTimeoutError"]


class MeshError(TpuDebugError, ValueError):
    """A device mesh that cannot be built from the devices there are."""


class ShardingError(TpuDebugError, ValueError):
    """A sharding annotation that does not fit its tensor or mesh."""


class LaunchError(TpuDebugError, RuntimeError):
    """Starting or joining a multi-process run failed."""


class RankDivergenceError(TpuDebugError, RuntimeError):
    """Ranks were about to run different programs together: the collectives would hang or mix.

    Attributes:
        call: the multi-process program call (counted from 1) at which they differ.
        ranks: the ranks compared, this process's first.
    """

    def __init__(self, message: str, *, call: int, ranks: tuple[int, ...]) -> None:
        super().__init__(message)
        self.call = call
        self.ranks = ranks


class RankTimeoutError(TpuDebugError, TimeoutError):
    """A rank did not reach a multi-process program the others wait in."""

    def __init__(self, message: str, *, call: int, missing: tuple[int, ...]) -> None:
        super().__init__(message)
        self.call = call
        self.missing = missing
