"""Trace options: :class:`TraceConfig`, one field per ``"trace"`` option of :mod:`tpu_debug.core.options`.

Precedence: argument to ``trace()`` > CLI flag (the CLI passes it as an
argument) > environment > default. Values are parsed strictly: junk raises
:class:`~tpu_debug.core.errors.ConfigError` naming the variable and what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpu_debug.core import options as _options
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.options import ENV_PREFIX

__all__ = ["TraceConfig", "ENV_PREFIX"]


class _TraceConfigMethods:
    __slots__ = ()

    @staticmethod
    def env_var(field: str) -> str:
        return _options.env_var(field)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TraceConfig:
        """Defaults overridden by the ``TPU_DEBUG_*`` variables that are set.

        Raises:
            ConfigError: a variable holds a value the field does not accept.
        """
        return cls(**_options.read_env("trace", environ))

    def override(self, **values: Any) -> TraceConfig:
        """A copy with the given options applied; ``None`` means "not given".

        Raises:
            ConfigError: an option has the wrong type.
            TypeError: no option has that name.
        """
        checked = {}
        for name, value in values.items():
            opt = _FIELDS.get(name)
            if opt is None:
                raise TypeError(f"trace() got an unexpected keyword argument {name!r}")
            if value is not None:
                checked[name] = _options.check_value(opt, value)
        return dataclasses.replace(self, **checked)  # type: ignore[type-var]

    def target_spec(self, *, source: str | None = None) -> Any:
        """The TPU target to compile for (a ``runtime.target.Target``), or None.

        Args:
            source: how the user gave it, for the error (default: the environment
                variable when it holds this value, else the ``target`` option).

        Raises:
            ConfigError: the spec names no TPU generation or slice; the message lists
                what is accepted.
        """
        target = self.target  # type: ignore[attr-defined]
        if target is None:
            return None
        from tpu_debug.runtime.target import TargetSpecError, parse_target

        try:
            return parse_target(target)
        except TargetSpecError as exc:
            env = self.env_var("target")
            where = source or (env if os.environ.get(env, "").strip().lower() == target else "target")
            raise ConfigError(f"{where}={target!r}: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }


_FIELDS = {o.name: o for o in _options.options("trace")}

TraceConfig = dataclasses.make_dataclass(
    "TraceConfig",
    [(o.name, Any, dataclasses.field(default=o.default_in("trace"))) for o in _FIELDS.values()],
    bases=(_TraceConfigMethods,),
    frozen=True,
    slots=True,
)
TraceConfig.__module__ = __name__
TraceConfig.__doc__ = "What a trace records and where: one field per trace option.\n" + _options.attributes_doc("trace")


def _guard_level(name: str, value: Any) -> str:
    """``value`` checked as a transfer guard level (``tpu_debug.transfer_guard``'s argument,
    used as given: so only the canonical spelling is accepted)."""
    if value not in _options.GUARD_LEVELS:
        raise ConfigError(f"{name}={value!r}: expected {_options.option(name).kind.argument}")
    return value
