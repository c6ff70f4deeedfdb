"""The errors the distributed API raises on purpose (all ``TpuDebugError``s)."""

from __future__ import annotations

from tpu_debug.core.errors import TpuDebugError

__all__ = [
    "MeshError",
    "ShardingError",
    "LaunchError",
    "RankDivergenceError",
    "RankTimeoutError",
    "CollectiveDesyncError",
    "CollectiveTimeoutError",
    "CollectiveDeviceError",
]


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


class _Desync:
    """What a desync error carries besides its text (set by both collective errors)."""

    def _set(self, *, group: str, seq: int, reason: str, cause: str, ranks: tuple[int, ...]) -> None:
        self.group = group
        self.seq = seq
        self.reason = reason
        self.cause = cause
        self.ranks = ranks


class CollectiveDesyncError(TpuDebugError, RuntimeError, _Desync):
    """The ranks of a c10d group called different collectives at one sequence number (another
    op, other sizes, dtype, reduction or root), or a rank that should have called it ended or
    died: gloo would hang or mix their data.

    Attributes:
        group: c10d's name of the group.
        seq: the collective's sequence number in the group (from 1).
        reason: what differs (``"op"``, ``"shapes"``, ``"dtype"``, ``"reduce_op"``, ``"root"``,
            ``"missing"``).
        cause: the likeliest cause (a key of :data:`tpu_debug.core.desync.CAUSES`).
        ranks: the global ranks whose call differs from this process's, or that did not call it.
    """

    def __init__(self, message: str, *, group: str, seq: int, reason: str, cause: str,
                 ranks: tuple[int, ...]) -> None:
        super().__init__(message)
        self._set(group=group, seq=seq, reason=reason, cause=cause, ranks=ranks)


class CollectiveTimeoutError(TpuDebugError, TimeoutError, _Desync):
    """Ranks of a c10d group did not reach a collective the others wait in, within
    ``TPU_DEBUG_COLLECTIVE_TIMEOUT`` seconds (attributes as :class:`CollectiveDesyncError`;
    ``ranks`` are the ones that did not arrive)."""

    def __init__(self, message: str, *, group: str, seq: int, reason: str, cause: str,
                 ranks: tuple[int, ...]) -> None:
        super().__init__(message)
        self._set(group=group, seq=seq, reason=reason, cause=cause, ranks=ranks)


class CollectiveDeviceError(TpuDebugError, TypeError):
    """A c10d collective of the `tpu` process group was given a tensor of a device it cannot
    run on."""
