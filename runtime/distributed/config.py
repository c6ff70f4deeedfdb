"""Settings of multi-process runs (one field, one ``TPU_DEBUG_*`` variable)."""

from __future__ import annotations

import dataclasses
import os

from tpu_debug.runtime.config import parse_bool

from tpu_debug.errors import ConfigError

__all__ = ["DistributedConfig", "config"]


@dataclasses.dataclass
class DistributedConfig:
    """How ranks check each other before running a program together.

    Attributes:
        rank_check: before each call of a program over devices of several
            processes, every rank says which program it is about to run, and each
            checks that the others run the same; a rank that would run another one
            (which would hang in its collectives, or mix them up) raises
            ``RankDivergenceError`` naming both sides. Env: ``TPU_DEBUG_RANK_CHECK``.
        rank_timeout: seconds a rank waits for the others at that check before it
            raises ``RankTimeoutError`` saying where the missing ranks are. Env:
            ``TPU_DEBUG_RANK_TIMEOUT``.
    """

    rank_check: bool = True
    rank_timeout: float = 60.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DistributedConfig:
        env = os.environ if environ is None else environ
        cfg = cls()
        raw = env.get("TPU_DEBUG_RANK_CHECK")
        if raw is not None:
            cfg.rank_check = parse_bool("TPU_DEBUG_RANK_CHECK", raw)
        raw = env.get("TPU_DEBUG_RANK_TIMEOUT")
        if raw is not None:
            try:
                value = float(raw.strip())
            except ValueError:
                value = 0.0
            if not value > 0:
                raise ConfigError(f"TPU_DEBUG_RANK_TIMEOUT={raw!r} is not a number of seconds above 0, e.g. 60")
            cfg.rank_timeout = value
        return cfg


config = DistributedConfig.from_env()
