"""The runtime's typed configuration (one field, one TPU_DEBUG_* variable)."""

from __future__ import annotations

import dataclasses
import os

__all__ = ["RuntimeConfig", "config", "parse_bool"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off"
    )


@dataclasses.dataclass
class RuntimeConfig:
    """Settings that change how the runtime executes ops.

    Attributes:
        cpu_fallback: run ops that have no lowering on CPU (moving data both
            ways) instead of raising ``NotImplementedError``. Env:
            ``TPU_DEBUG_CPU_FALLBACK``.
    """

    cpu_fallback: bool = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RuntimeConfig:
        env = os.environ if environ is None else environ
        cfg = cls()
        raw = env.get("TPU_DEBUG_CPU_FALLBACK")
        if raw is not None:
            cfg.cpu_fallback = parse_bool("TPU_DEBUG_CPU_FALLBACK", raw)
        return cfg


config = RuntimeConfig.from_env()
