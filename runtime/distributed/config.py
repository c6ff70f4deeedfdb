"""Settings of multi-process runs: one field per ``"distributed"`` option of :mod:`tpu_debug.core.options`.

``config`` reads its ``TPU_DEBUG_*`` variables when a field is first read, never at import.
"""

from __future__ import annotations

from tpu_debug.core.options import Settings

__all__ = ["DistributedConfig", "config"]


class DistributedConfig(Settings):
    """How ranks check each other before running a program together: with ``rank_check``,
    a rank that would run another program than the others (which would hang in its
    collectives, or mix them up) raises ``RankDivergenceError`` naming both sides."""

    SCOPE = "distributed"


config = DistributedConfig.unread()
