"""Trace options: :class:`TraceConfig`, one field per ``"trace"`` option of :mod:`tpu_debug.core.options`.

Precedence: argument to ``trace()`` > CLI flag (the CLI passes it as an
argument) > environment > default. Values are parsed strictly: junk raises
:class:`~tpu_debug.core.errors.ConfigError` naming the variable and what it accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from tpu_debug.core import options as _options
from tpu_debug.core.errors import ConfigError
from tpu_debug.core.options import ENV_PREFIX
from tpu_debug.runtime.target import TargetSpecError, parse_target

__all__ = ["TraceConfig", "ENV_PREFIX"]


_FIELDS = {o.name: o for o in _options.options("trace")}
# each field's default is the option table's (core/options.py declares it once)
_DEFAULT = {name: o.default_in("trace") for name, o in _FIELDS.items()}
_C = TypeVar("_C", bound=type)


def _with_undeclared_options(cls: _C) -> _C:
    """``cls``, or a subclass adding a field for each trace option its body does not write out
    yet: an option declared in the table alone is a ``trace()`` keyword and a field at once
    (``tests/test_options.py`` then asks for it in the class body, where editors see it)."""
    declared = cls.__dataclass_fields__  # type: ignore[attr-defined]
    missing = [o for o in _FIELDS.values() if o.name not in declared]
    if not missing:
        return cls
    fields = [(o.name, Any, dataclasses.field(default=o.default_in("trace"))) for o in missing]
    extended = dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), frozen=True, slots=True)
    extended.__module__, extended.__qualname__ = cls.__module__, cls.__qualname__
    return extended  # type: ignore[return-value]


@_with_undeclared_options
@dataclasses.dataclass(frozen=True, slots=True)
class TraceConfig:
    # one field per "trace" option of core/options.py, in its order
    logdir: Path = _DEFAULT["logdir"]
    name: str | None = _DEFAULT["name"]
    hlo: bool = _DEFAULT["hlo"]
    op_events: bool = _DEFAULT["op_events"]
    tensorboard: bool = _DEFAULT["tensorboard"]
    tensorboard_max_events: int = _DEFAULT["tensorboard_max_events"]
    divergence: bool = _DEFAULT["divergence"]
    numerics: str | None = _DEFAULT["numerics"]
    tolerances: str | None = _DEFAULT["tolerances"]
    divergence_sample: int = _DEFAULT["divergence_sample"]
    storm_threshold: int = _DEFAULT["storm_threshold"]
    fail_on_recompile: bool = _DEFAULT["fail_on_recompile"]
    transfer_guard: str = _DEFAULT["transfer_guard"]
    transfer_guard_implicit: str = _DEFAULT["transfer_guard_implicit"]
    eager_mode: str | None = _DEFAULT["eager_mode"]
    target: str | None = _DEFAULT["target"]
    target_wait: float = _DEFAULT["target_wait"]
    memory: bool = _DEFAULT["memory"]
    memory_snapshot: Path | None = _DEFAULT["memory_snapshot"]
    dry_run: bool = _DEFAULT["dry_run"]
    compile_cache: bool | None = _DEFAULT["compile_cache"]

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
        return dataclasses.replace(self, **checked)

    def target_spec(self, *, source: str | None = None) -> Any:
        """The TPU target to compile for (a ``runtime.target.Target``), or None.

        Args:
            source: how the user gave it, for the error (default: the environment
                variable when it holds this value, else the ``target`` option).

        Raises:
            ConfigError: the spec names no TPU generation or slice; the message lists
                what is accepted.
        """
        target = self.target
        if target is None:
            return None

        try:
            return parse_target(target)
        except TargetSpecError as exc:
            env = self.env_var("target")
            from_env = _options.read_env([_FIELDS["target"]]).get("target") == target
            where = source or (env if from_env else "target")
            raise ConfigError(f"{where}={target!r}: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
            for f in dataclasses.fields(self)
        }


TraceConfig.__doc__ = "What a trace records and where: one field per trace option.\n" + _options.attributes_doc("trace")


def _guard_level(name: str, value: Any) -> str:
    """``value`` checked as a transfer guard level (``tpu_debug.transfer_guard``'s argument,
    used as given: so only the canonical spelling is accepted)."""
    if value not in _options.GUARD_LEVELS:
        raise ConfigError(f"{name}={value!r}: expected {_options.option(name).kind.argument}")
    return value
