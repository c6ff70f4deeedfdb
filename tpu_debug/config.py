"""Trace options: one typed config object, one ``TPU_DEBUG_<FIELD>`` variable per field.

Precedence: argument to ``trace()`` > CLI flag (the CLI passes it as an
argument) > environment > default. Values are parsed strictly: junk raises
:class:`~tpu_debug.errors.ConfigError` naming the variable and what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpu_debug.errors import ConfigError

__all__ = ["TraceConfig", "ENV_PREFIX"]

ENV_PREFIX = "TPU_DEBUG_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(var: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{var}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def _parse_path(var: str, raw: str) -> Path:
    if not raw.strip():
        raise ConfigError(f"{var} is set but empty; set it to a directory for runs, or unset it")
    return Path(raw)


def _parse_name(var: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{var} is set but empty; set it to a short run name, or unset it")
    return raw.strip()


@dataclasses.dataclass(frozen=True, slots=True)
class TraceConfig:
    """What a trace records and where.

    Attributes:
        logdir: directory holding one subdirectory per run. Env: ``TPU_DEBUG_LOGDIR``.
        name: run name (the run directory is ``<UTC time>-<name>``); defaults
            to the script's name. Env: ``TPU_DEBUG_NAME``.
        hlo: record each compiled program's StableHLO and optimized HLO.
            Env: ``TPU_DEBUG_HLO``.
        op_events: record one event per eager op execution (otherwise counts
            and times are aggregated per executable). Env: ``TPU_DEBUG_OP_EVENTS``.
    """

    logdir: Path = Path("tpu_debug_runs")
    name: str | None = None
    hlo: bool = True
    op_events: bool = False

    _PARSERS = {"logdir": _parse_path, "name": _parse_name, "hlo": _parse_bool, "op_events": _parse_bool}

    @staticmethod
    def env_var(field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TraceConfig:
        """Defaults overridden by the ``TPU_DEBUG_*`` variables that are set.

        Raises:
            ConfigError: a variable holds a value the field does not accept.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, parse in cls._PARSERS.items():
            var = cls.env_var(field)
            raw = env.get(var)
            if raw is not None:
                values[field] = parse(var, raw)
        return cls(**values)

    def override(self, **options: Any) -> TraceConfig:
        """A copy with the given options applied; ``None`` means "not given".

        Raises:
            ConfigError: an option has the wrong type.
        """
        values = {}
        for field, value in options.items():
            if value is None:
                continue
            if field in ("hlo", "op_events") and not isinstance(value, bool):
                raise ConfigError(f"{field}={value!r}: expected True or False")
            if field == "logdir":
                if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
                    raise ConfigError(f"logdir={value!r}: expected a directory path")
                value = Path(value)
            if field == "name" and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"name={value!r}: expected a non-empty string")
            values[field] = value
        return dataclasses.replace(self, **values)

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
            for f in dataclasses.fields(self)
        }
