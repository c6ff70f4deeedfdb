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


def _parse_positive_int(var: str, raw: str) -> int:
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{var}={raw!r} is not a positive integer; use a count such as 100000")
    return value


def _parse_name(var: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{var} is set but empty; set it to a short run name, or unset it")
    return raw.strip()


# -- divergence options -----------------------------------------------------------------


def _numerics(name: str, value: Any) -> str:
    if value not in ("cpu", "tpu"):
        raise ConfigError(f"{name}={value!r} is not a numerics mode; use 'cpu' or 'tpu'")
    return value


def _tolerances(name: str, value: Any) -> str:
    """The canonical string of a tolerance spec (a string, a mapping or "off")."""
    from tpu_debug.tracers.divergence import format_tolerances, parse_tolerances

    try:
        return format_tolerances(parse_tolerances(value))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name}: {exc}") from None


# -- runtime options ----------------------------------------------------------------------

# TorchTPU's eager modes, as torch.tpu.EagerMode values (runtime/lazy.py)
EAGER_MODES = ("defer_and_fuse", "defer_never", "defer_never_and_launch_blocking")


def _eager_mode(name: str, value: Any) -> str:
    text = getattr(value, "value", value)  # a torch.tpu.EagerMode member, or its name
    if isinstance(text, str) and text.strip().lower() in EAGER_MODES:
        return text.strip().lower()
    raise ConfigError(f"{name}={value!r} is not an eager mode; use one of {', '.join(EAGER_MODES)}")


# -- guard options ----------------------------------------------------------------------


def _guard_level(name: str, value: Any) -> str:
    if value not in ("allow", "log", "disallow"):
        raise ConfigError(f"{name}={value!r} is not a transfer guard level; use 'allow', 'log' or 'disallow'")
    return value


# -- TPU target options ---------------------------------------------------------------


def _target_text(name: str, value: Any) -> str:
    # the spec itself is checked against the hardware table by target_spec(), when a trace
    # starts: the table lives in the runtime, which the reading verbs never import
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{name}={value!r} is not a TPU target; use a spec such as 'v5e', 'v6e-8' or 'v5e:2x4'"
        )
    return value.strip().lower()


def _parse_seconds(var: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{var}={raw!r} is not a number of seconds; use a value such as 60 (0: do not wait)")
    return value


# fields whose value given to trace() must be a bool, or a positive int
_BOOL_FIELDS = frozenset(
    {"hlo", "op_events", "tensorboard", "divergence", "fail_on_recompile", "memory", "dry_run", "compile_cache"}
)
_COUNT_FIELDS = frozenset({"tensorboard_max_events", "divergence_sample", "storm_threshold"})


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
        tensorboard: capture a JAX profile with tpu_debug's events on its timeline,
            and per-step scalars, into ``<run>/tensorboard/``. Env: ``TPU_DEBUG_TENSORBOARD``.
        tensorboard_max_events: spans of ours after which the profile capture stops
            (the run goes on). Env: ``TPU_DEBUG_TENSORBOARD_MAX_EVENTS``.
        divergence: compare every op and compiled-graph node with PyTorch on CPU.
            Env: ``TPU_DEBUG_DIVERGENCE``.
        numerics: ``"tpu"`` runs float32 matmuls and convolutions as a TPU does
            (bfloat16 passes), ``"cpu"`` in float32; None leaves the runtime's
            setting. Env: ``TPU_DEBUG_NUMERICS``.
        tolerances: divergence tolerances, ``"dtype=rtol[:atol],..."`` or ``"off"``;
            None for the defaults (see ``tracers/divergence/tolerances.py``). Env: ``TPU_DEBUG_TOLERANCES``.
        divergence_sample: compare every N-th tensor node of a compiled graph
            (1: all). Env: ``TPU_DEBUG_DIVERGENCE_SAMPLE``.
        storm_threshold: an op or graph recompiled more than this many times is
            a recompile storm. Env: ``TPU_DEBUG_STORM_THRESHOLD``.
        fail_on_recompile: raise ``RecompileError`` on the first recompile, with
            the diff in the message. Env: ``TPU_DEBUG_FAIL_ON_RECOMPILE``.
        transfer_guard: ``"allow"``, ``"log"`` or ``"disallow"`` every
            host<->device transfer. Env: ``TPU_DEBUG_TRANSFER_GUARD``.
        transfer_guard_implicit: the same for implicit transfers only
            (``.item()``, ``print``, ``if t:``, CPU fallbacks); the stricter of
            the two applies to those. Env: ``TPU_DEBUG_TRANSFER_GUARD_IMPLICIT``.
        eager_mode: the eager mode while the trace records (``"defer_and_fuse"``,
            ``"defer_never"``, ``"defer_never_and_launch_blocking"``:
            ``torch.tpu.EagerMode``); None leaves the runtime's. Env: ``TPU_DEBUG_EAGER_MODE``.
        memory: record the device bytes `tpu` tensors hold, per step, the peak and
            the lines that allocated it. Env: ``TPU_DEBUG_MEMORY``.
        target: also compile every program for this TPU target (``"v5e"``,
            ``"v6e-8"``, ``"v5e:2x4"``) and record its HLO, memory, cost,
            padding and roofline; needs libtpu. Env: ``TPU_DEBUG_TARGET``.
        target_wait: seconds the end of a trace waits for target compiles still
            running (0: none). Env: ``TPU_DEBUG_TARGET_WAIT``.
        dry_run: run with tensors that hold no data, compiling every program for
            ``target`` and executing nothing (implies ``memory``). Env: ``TPU_DEBUG_DRY_RUN``.
        compile_cache: read compiled programs back from the persistent compile
            cache and keep new ones there; None leaves the runtime's setting (on
            unless ``TPU_DEBUG_COMPILE_CACHE=0``). Env: ``TPU_DEBUG_COMPILE_CACHE``.
    """

    logdir: Path = Path("tpu_debug_runs")
    name: str | None = None
    hlo: bool = True
    op_events: bool = False
    tensorboard: bool = False
    tensorboard_max_events: int = 100_000
    divergence: bool = False
    numerics: str | None = None
    tolerances: str | None = None
    divergence_sample: int = 1
    storm_threshold: int = 5
    fail_on_recompile: bool = False
    transfer_guard: str = "allow"
    transfer_guard_implicit: str = "allow"
    eager_mode: str | None = None
    target: str | None = None
    target_wait: float = 60.0
    memory: bool = False
    dry_run: bool = False
    compile_cache: bool | None = None

    # how each field's environment variable is parsed (every field has one)
    _PARSERS = {
        "logdir": _parse_path,
        "name": _parse_name,
        "hlo": _parse_bool,
        "op_events": _parse_bool,
        "tensorboard": _parse_bool,
        "tensorboard_max_events": _parse_positive_int,
        "divergence": _parse_bool,
        "numerics": lambda var, raw: _numerics(var, raw.strip().lower()),
        "tolerances": _tolerances,
        "divergence_sample": _parse_positive_int,
        "storm_threshold": _parse_positive_int,
        "fail_on_recompile": _parse_bool,
        "transfer_guard": lambda var, raw: _guard_level(var, raw.strip().lower()),
        "transfer_guard_implicit": lambda var, raw: _guard_level(var, raw.strip().lower()),
        "eager_mode": _eager_mode,
        "target": _target_text,
        "target_wait": _parse_seconds,
        "memory": _parse_bool,
        "dry_run": _parse_bool,
        "compile_cache": _parse_bool,
    }

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
            if field in _BOOL_FIELDS and not isinstance(value, bool):
                raise ConfigError(f"{field}={value!r}: expected True or False")
            if field in _COUNT_FIELDS and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{field}={value!r}: expected a positive integer")
            if field == "numerics":
                value = _numerics(field, value)
            if field == "tolerances":
                value = _tolerances(field, value)
            if field in ("transfer_guard", "transfer_guard_implicit"):
                value = _guard_level(field, value)
            if field == "eager_mode":
                value = _eager_mode(field, value)
            if field == "logdir":
                if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
                    raise ConfigError(f"logdir={value!r}: expected a directory path")
                value = Path(value)
            if field == "name" and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"name={value!r}: expected a non-empty string")
            if field == "target":
                value = _target_text(field, value)
            if field == "target_wait":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                    raise ConfigError(f"target_wait={value!r}: expected a number of seconds, 0 or more")
                value = float(value)
            values[field] = value
        return dataclasses.replace(self, **values)

    def target_spec(self, *, source: str | None = None) -> Any:
        """The TPU target to compile for (a ``runtime.target.Target``), or None.

        Args:
            source: how the user gave it, for the error (default: the environment
                variable when it holds this value, else the ``target`` option).

        Raises:
            ConfigError: the spec names no TPU generation or slice; the message lists
                what is accepted.
        """
        if self.target is None:
            return None
        from tpu_debug.runtime.target import TargetSpecError, parse_target

        try:
            return parse_target(self.target)
        except TargetSpecError as exc:
            env = self.env_var("target")
            where = source or (env if os.environ.get(env, "").strip().lower() == self.target else "target")
            raise ConfigError(f"{where}={self.target!r}: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
            for f in dataclasses.fields(self)
        }
