"""Every option of tpu_debug, declared once: type, default, environment variable, CLI flag, help.

:data:`OPTIONS` is the one table. The environment parsing (``TPU_DEBUG_<NAME>``), the
keywords of ``tpu_debug.trace()`` and its :class:`~tpu_debug.trace_config.TraceConfig`, the
runtime's and the distributed runtime's config objects, and the flags of
``tpu-debug run`` are all derived from it, so adding an option is one :class:`Option`
here (plus the code that acts on it, and its test).

Every variable follows one rule: surrounding blanks are ignored, a variable set to
blanks only is an error (unset it to get the default), and a value the option does
not accept raises :class:`~tpu_debug.core.errors.ConfigError` in one line naming the
variable, the value and what is accepted. Precedence: argument > CLI flag (passed
as an argument) > environment > default.

This module imports neither torch nor jax (the reading verbs import it).

Example:
    >>> from tpu_debug.core.options import read_env
    >>> read_env("trace", {"TPU_DEBUG_STORM_THRESHOLD": " 3 "})
    {'storm_threshold': 3}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tpu_debug.core.errors import ConfigError
from tpu_debug.core.tolerances import format_tolerances, parse_tolerances

__all__ = [
    "ENV_PREFIX",
    "EAGER_MODES",
    "NUMERICS",
    "PRECISIONS",
    "GUARD_LEVELS",
    "Kind",
    "Option",
    "OPTIONS",
    "options",
    "option",
    "env_var",
    "parse_env",
    "check_value",
    "read_env",
    "check_env",
    "default_logdir",
    "env_text",
    "add_flags",
    "ignore_recording_options",
    "Settings",
]

ENV_PREFIX = "TPU_DEBUG_"
# TorchTPU's eager modes, as torch.tpu.EagerMode values (runtime/lazy.py checks they agree)
EAGER_MODES = ("defer_and_fuse", "defer_never", "defer_never_and_launch_blocking")
NUMERICS = ("cpu", "tpu")
PRECISIONS = ("highest", "high", "medium")
GUARD_LEVELS = ("allow", "log", "disallow")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class _Junk(ValueError):
    """A value an option does not accept; ``detail`` replaces the generic "is not" text."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """How the values of one type of option are read and checked.

    Attributes:
        noun: what a value is, for messages ("a boolean").
        accepted: what to give instead, for messages ("one of 1/0, true/false, ...").
        parse: the stripped, non-empty text of a variable -> the value; raises ValueError.
        check: a value given as an argument -> the value; raises ValueError.
        argument: what an argument must be, for messages ("True or False").
        flag: keyword arguments of the ``argparse`` flag.
    """

    noun: str
    accepted: str
    parse: Callable[[str], Any]
    check: Callable[[Any], Any]
    argument: str
    flag: Mapping[str, Any]


def _parse_bool(text: str) -> bool:
    value = text.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _Junk


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Junk
    return value


def _parse_count(text: str) -> int:
    return _check_count(int(text.replace("_", "")))


def _check_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Junk
    return value


def _seconds(*, zero: bool) -> tuple[Callable[[str], float], Callable[[Any], float]]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Junk
        if value < 0 or (value == 0 and not zero):
            raise _Junk
        return float(value)

    return (lambda text: check(float(text))), check


def _choice(choices: tuple[str, ...]) -> tuple[Callable[[str], str], Callable[[Any], str]]:
    def check(value: Any) -> str:
        text = getattr(value, "value", value)  # an Enum member (torch.tpu.EagerMode), or its name
        if isinstance(text, str) and text.strip().lower() in choices:
            return text.strip().lower()
        raise _Junk

    return check, check


def _check_path(value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise _Junk
    return Path(value)


def _check_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Junk
    return value.strip()


def _check_tolerances(value: Any) -> str:
    """The canonical string of a tolerance spec (a string, a mapping or "off")."""
    try:
        return format_tolerances(parse_tolerances(value))
    except (ValueError, TypeError) as exc:
        raise _Junk(str(exc)) from None


_BOOL_FLAG = {"action": argparse.BooleanOptionalAction, "default": None}
BOOL = Kind("a boolean", "one of 1/0, true/false, yes/no, on/off", _parse_bool, _check_bool,
            "True or False", _BOOL_FLAG)
COUNT = Kind("a positive integer", "a count such as 1024", _parse_count, _check_count,
             "a positive integer", {"type": int, "metavar": "N"})
SECONDS = Kind("a number of seconds", "a value such as 60 (0: do not wait)", *_seconds(zero=True),
               "a number of seconds, 0 or more", {"type": float, "metavar": "SECONDS"})
TIMEOUT = Kind("a number of seconds above 0", "a value such as 60", *_seconds(zero=False),
               "a number of seconds above 0", {"type": float, "metavar": "SECONDS"})
DIRECTORY = Kind("a directory for runs", "a directory path", lambda text: Path(text), _check_path,
                 "a directory path", {"metavar": "DIR"})
FILE = Kind("a file path", "a file path such as memory.pickle", lambda text: Path(text), _check_path,
            "a file path", {"metavar": "FILE"})
CACHE_DIRECTORY = Kind("a cache directory", "a directory path", _check_text, _check_text, "a directory path", {})
RUN_NAME = Kind("a short run name", "a short run name", _check_text, _check_text, "a non-empty string", {})
TOLERANCES = Kind("a tolerance spec", "'float32=1e-4:1e-6,bfloat16=0.05' (rtol[:atol] per dtype) or 'off'",
                  _check_tolerances, _check_tolerances, "a tolerance spec", {"metavar": "SPEC"})
def _check_rank(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Junk
    return value


def _check_address(value: Any) -> str:
    host, sep, port = _check_text(value).rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise _Junk
    return f"{host}:{port}"


def _parse_cache(text: str) -> str | bool:
    return False if text.lower() in _FALSE else text


def _check_cache(value: Any) -> str | bool:
    return False if value is False else _check_text(value)


RANK = Kind("a rank", "an integer, 0 or more", lambda text: _check_rank(int(text)), _check_rank,
            "an integer, 0 or more", {"type": int, "metavar": "N"})
ADDRESS = Kind("a host:port address", "a value such as 127.0.0.1:29500", _check_address, _check_address,
               "a 'host:port' string", {"metavar": "HOST:PORT"})
CACHE_OR_OFF = Kind("a cache directory or off", "a directory path, or one of 0/false/no/off to turn it off",
                    _parse_cache, _check_cache, "a directory path, or False", {})
# the spec itself is checked against the hardware table by TraceConfig.target_spec() when a
# trace starts: the table lives in the runtime, which the reading verbs never import
TARGET = Kind("a TPU target", "a spec such as 'v5e', 'v6e-8' or 'v5e:2x4'", lambda text: text.lower(),
              lambda value: _check_text(value).lower(), "a TPU target such as 'v5e'", {"metavar": "TPU"})


def choice(noun: str, choices: tuple[str, ...]) -> Kind:
    """A kind whose values are one of ``choices`` (case-insensitive)."""
    listed = ", ".join(choices)
    return Kind(noun, f"one of {listed}", *_choice(choices), f"one of {listed}", {"choices": choices})


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """One option: its name is the ``trace()`` keyword and config field; the variable
    is ``TPU_DEBUG_<NAME>`` and the flag ``--<name-with-dashes>``.

    Attributes:
        name: the field name.
        kind: its type (how it is parsed and checked).
        default: the value when nothing sets it.
        help: one sentence for ``--help`` and the docstrings.
        scopes: the config objects that hold it: ``"trace"`` (:class:`TraceConfig`,
            ``trace()``), ``"runtime"`` (``tpu_debug.runtime.config``),
            ``"distributed"`` (``tpu_debug.runtime.distributed.config``), ``"run"`` (the
            ``tpu-debug run`` command itself: a flag and a variable only), ``"env"`` (a
            variable only, read by :func:`read_env` where it is used, on every use: what a
            launcher sets for a process, or what tests point elsewhere per test). An option in
            both ``"trace"`` and ``"runtime"`` sets the runtime's value while a trace
            records; its ``trace()`` default (None) leaves the runtime's value.
        flag: ``tpu-debug run`` has a flag for it.
        reading: the reading verbs use it too (all others are recording options).
        alias: another tool's variable for the same setting (TorchTPU's name), read, with the
            same parsing, when ``TPU_DEBUG_<NAME>`` is not set: a script written for TorchTPU
            keeps its meaning here.
    """

    name: str
    kind: Kind
    default: Any
    help: str
    scopes: frozenset[str] = frozenset({"trace"})
    flag: bool = True
    reading: bool = False
    alias: str | None = None

    @property
    def env(self) -> str:
        return env_var(self.name)

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_in(self, scope: str) -> Any:
        """The default of this option in config object ``scope``."""
        if scope == "trace" and "runtime" in self.scopes:
            return None
        return self.default


_TRACE, _RUNTIME, _RANKS = frozenset({"trace"}), frozenset({"runtime"}), frozenset({"distributed"})
_BOTH = frozenset({"trace", "runtime"})
_ENV = frozenset({"env"})

# The order is the order of trace()'s keywords, of TraceConfig's fields and of the flags.
OPTIONS: tuple[Option, ...] = (
    Option("logdir", DIRECTORY, Path("tpu_debug_runs"), "where runs go, one directory per run", reading=True),
    Option("name", RUN_NAME, None, "run name; the run directory is <UTC time>-<name> (default: the script's name)"),
    Option("hlo", BOOL, True, "record StableHLO and optimized HLO of every compiled program"),
    Option("op_events", BOOL, False, "record one event per eager op execution (otherwise totals per executable)"),
    Option("tensorboard", BOOL, False, "capture a JAX profile with tpu_debug's events on its timeline, and "
           "per-step scalars, into <run>/tensorboard/ (open it with 'tpu-debug tensorboard')"),
    Option("tensorboard_max_events", COUNT, 100_000, "stop the profile capture after N spans (the run goes on)"),
    Option("divergence", BOOL, False, "also run every op on CPU (and interpret compiled graphs on CPU); record "
           "the first op or graph node whose result leaves tolerance"),
    Option("numerics", choice("a numerics mode", NUMERICS), "cpu", "'tpu': float32 matmuls and convolutions "
           "in bfloat16 passes, as a TPU computes them at the precision in effect (torch.tpu.precision); "
           "'cpu': in float32", _BOTH),
    Option("tolerances", TOLERANCES, None, "divergence tolerances, 'float32=1e-4:1e-6,bfloat16=0.05' "
           "(rtol[:atol] per dtype) or 'off' (default: torch.testing's)"),
    Option("divergence_sample", COUNT, 1, "compare every N-th node of a compiled graph (1: all)"),
    Option("storm_threshold", COUNT, 5, "flag an op or graph recompiled more than N times as a recompile storm"),
    Option("fail_on_recompile", BOOL, False, "stop the script with RecompileError on the first recompile "
           "after warm-up (the first steps, until one compiles nothing new), showing what changed"),
    Option("transfer_guard", choice("a transfer guard level", GUARD_LEVELS), "allow",
           "log or refuse every host<->device transfer"),
    Option("transfer_guard_implicit", choice("a transfer guard level", GUARD_LEVELS), "allow",
           "log or refuse implicit transfers only: .item(), print, if t:, CPU fallbacks (the stricter "
           "of the two guards applies to those)"),
    Option("eager_mode", choice("an eager mode", EAGER_MODES), "defer_never", "how ops outside compiled graphs "
           "run (torch.tpu.EagerMode): 'defer_and_fuse' records them and runs fused programs when a value "
           "is needed (TorchTPU's default), 'defer_never' runs them one by one, "
           "'defer_never_and_launch_blocking' one by one, each waited for", _BOTH),
    Option("target", TARGET, None, "also compile every program for this TPU (v5e, v6e-8, v5p-8, v5e:2x4, ...) "
           "and record its HLO, memory, cost, padding and roofline beside the local run (needs libtpu: "
           "pip install \"tpu-debug[tpu]\")"),
    Option("target_wait", SECONDS, 60.0, "at the end, wait at most this long for target compiles still running"),
    Option("memory", BOOL, False, "record the device bytes tensors hold per step, the peak and the lines "
           "holding it (tpu-debug run: on with --target or --dry-run)"),
    Option("memory_snapshot", FILE, None, "write PyTorch's memory snapshot (the pickle "
           "torch.cuda.memory._snapshot() writes) of the run's tpu tensors at their peak to FILE, and of each "
           "compiled program at its peak beside it (FILE's name.<program>.pickle); open one at "
           "pytorch.org/memory_viz or with python -m torch.cuda._memory_viz (turns --memory on)"),
    Option("dry_run", BOOL, False, "run with tensors that hold no data: compile every program for the target, "
           "execute nothing, and record the memory (a value read such as .item() stops the script there)"),
    # the runtime's own settings: tpu_debug.runtime.config
    Option("cpu_fallback", BOOL, False, "run ops that have no lowering on CPU (moving data both ways) instead "
           "of raising NotImplementedError", _RUNTIME, flag=False),
    Option("data_checks", BOOL, None, "check the argument values PyTorch checks and a TPU does not (an index "
           "in range, a probability distribution) and raise PyTorch's error at the op: on in eager mode unless "
           "set off; in lazy and compiled programs only when set on, since reading values there adds a "
           "device-to-host sync (TorchTPU's TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS sets it too)", _RUNTIME,
           flag=False, alias="TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS"),
    Option("matmul_precision", choice("a matmul precision", PRECISIONS), None, "an explicit float32 product "
           "precision, as torch.tpu.precision.set sets it (default: follow "
           "torch.get_float32_matmul_precision())", _RUNTIME, flag=False),
    # XLA's CPU backend spends about a third of a small program's compile in LLVM's optimizations
    # (measured: 120 small programs, 9-10.5 -> 6.1-7 CPU s at level 0); a debugging run that meets
    # many shapes is compile-bound, and its programs' run time is small beside their compile
    Option("fast_local_compile", BOOL, False, "compile the programs that run on this machine with XLA's "
           "backend optimizations off (xla_backend_optimization_level=0): compiles take about a third "
           "less CPU and the programs run slower, with the same results; TPU target compiles are not "
           "affected", _RUNTIME, flag=False),
    # A cached executable holds XLA's compiled code and its compile record with the lowered
    # module: ~1.4 MiB for one small op on the CPU backend (measured: 600 single-op executables
    # grew RSS by 850 MiB, with the cache bounded at 50 by 13 MiB). The bounds keep a run that
    # meets ever new shapes within ~1.5 GiB of eager executables, well above what a step uses.
    Option("eager_cache_size", COUNT, 1024, "eager executables kept (one per op overload, input shapes/dtypes "
           "and static arguments), least recently used out first", _RUNTIME, flag=False),
    Option("compiled_cache_size", COUNT, 128, "compiled-mode programs kept (one per FX graph and input "
           "signature), least recently used out first; also bounds divergence's debug variants",
           _RUNTIME, flag=False),
    Option("index_cache_bytes", COUNT, 64 * 1024 * 1024, "bytes of gather/scatter index arrays kept for "
           "reading and writing strided views; a larger array is built for each use", _RUNTIME, flag=False),
    # XLA's compile time grows with a program's size: a graph cut here compiles in seconds,
    # and a training step of a small model (hundreds to a few thousand ops) fits
    Option("lazy_graph_limit", COUNT, 10_000, "ops a pending lazy graph holds at most; the op after that runs "
           "the graph first", _RUNTIME, flag=False),
    # A small op's CPU executable is 1-30 KB compressed (examples/mlp_train.py's 37 programs:
    # 0.15 MiB), a model's step program up to a few MB: a GiB holds thousands of programs
    Option("compile_cache", BOOL, True, "read programs compiled by earlier runs back from the persistent "
           "compile cache, and keep new ones there (~/.cache/tpu_debug/compile)", _BOTH),
    Option("compile_cache_dir", CACHE_DIRECTORY, None, "where the persistent compile cache lives (default: "
           "$XDG_CACHE_HOME/tpu_debug/compile, else ~/.cache/tpu_debug/compile)", _RUNTIME, flag=False),
    Option("compile_cache_bytes", COUNT, 1 << 30, "bytes the persistent compile cache holds at most, least "
           "recently used entries out first", _RUNTIME, flag=False),
    # the tpu-debug run command itself
    Option("traceback", BOOL, False, "print the whole traceback of a tpu_debug error (a guard, a rank check) "
           "that ends the script, not only the script's innermost frame and the message", frozenset({"run"})),
    # multi-process runs: tpu_debug.runtime.distributed.config
    Option("rank_check", BOOL, True, "before each program over devices of several processes, check that every "
           "rank runs the same program (a rank running another raises RankDivergenceError)", _RANKS, flag=False),
    Option("rank_timeout", TIMEOUT, 60.0, "seconds a rank waits for the others at that check before it raises "
           "RankTimeoutError", _RANKS, flag=False),
    # c10d collectives of the `tpu` process group: runtime/distributed/c10d/. The timeout is well under
    # gloo's 30 minutes, so a hang is named while the job is still watched, and long enough for work one
    # rank does alone between collectives (evaluation, a checkpoint to slow storage)
    Option("collective_check", BOOL, True, "before each c10d collective of the tpu process group, check that "
           "every rank of the group calls the same one (CollectiveDesyncError names each rank's call and line)",
           _RANKS, flag=False),
    Option("collective_timeout", TIMEOUT, 300.0, "seconds a rank waits at that check for the others to reach "
           "the same collective before it raises CollectiveTimeoutError (gloo itself waits 30 minutes)",
           _RANKS, flag=False),
    # PyTorch's Flight Recorder variables (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE) say whether and
    # where a rank's dump is written (runtime/distributed/flight_recorder.py); PyTorch has none for an exit
    Option("flight_recorder_at_exit", BOOL, False, "when the Flight Recorder records (TORCH_FR_BUFFER_SIZE > 0), "
           "write each rank's dump (TORCH_FR_DUMP_TEMP_FILE<rank>) when its process exits", _RANKS, flag=False),
    # a process of a multi-process run (tpu-debug run --nproc sets these for each rank it starts)
    Option("coordinator", ADDRESS, None, "the address of the multi-process run this process joins (rank 0's "
           "JAX coordinator)", _ENV, flag=False),
    Option("nproc", COUNT, None, "the number of processes of that run", _ENV, flag=False),
    Option("rank", RANK, None, "this process's rank in that run (0 to nproc - 1)", _ENV, flag=False),
    # runtime/target/cache.py
    Option("target_cache", CACHE_OR_OFF, None, "where target compile results are kept (default: "
           "$XDG_CACHE_HOME/tpu_debug/target, else ~/.cache/tpu_debug/target), or 0/off to keep none",
           _ENV, flag=False, reading=True),
)

# set while ignore_recording_options() is in effect: this process only reads runs
_reading_only = False


@contextlib.contextmanager
def ignore_recording_options() -> Iterator[None]:
    """Inside the block, only the reading options' variables (``logdir``) are read.

    The reading verbs (``report``, ``runs``, ``tui``, ``diff``, ``tensorboard``) record
    nothing, so a bad recording variable must not stop them: :func:`tpu_debug.cli.main`
    runs them inside this block.
    """
    global _reading_only
    saved, _reading_only = _reading_only, True
    try:
        yield
    finally:
        _reading_only = saved


def option(name: str) -> Option:
    """The declaration of option ``name``.

    Raises:
        KeyError: no option has that name.
    """
    found = next((o for o in OPTIONS if o.name == name), None)
    if found is None:
        raise KeyError(name)
    return found


def options(scope: str | None = None) -> tuple[Option, ...]:
    """The options of one config object (``"trace"``, ``"runtime"``, ``"distributed"``), or all."""
    return tuple(o for o in OPTIONS if scope is None or scope in o.scopes)


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def parse_env(opt: Option, raw: str, var: str | None = None) -> Any:
    """The value of ``opt``'s variable (``var``: its alias) holding ``raw``.

    Raises:
        ConfigError: blank, or a value the option does not accept (one line: the
            variable, the value, what is accepted).
    """
    var = var or opt.env
    text = raw.strip()
    if not text:
        raise ConfigError(f"{var} is set but empty; set it to {opt.kind.noun}, or unset it")
    try:
        return opt.kind.parse(text)
    except _Junk as exc:
        if exc.detail:
            raise ConfigError(f"{var}={raw!r}: {exc.detail}") from None
    except ValueError:
        pass
    raise ConfigError(f"{var}={raw!r} is not {opt.kind.noun}; use {opt.kind.accepted}")


def check_value(opt: Option, value: Any) -> Any:
    """``value`` given as an argument for ``opt``, checked (and made canonical).

    Raises:
        ConfigError: the option does not accept it.
    """
    try:
        return opt.kind.check(value)
    except _Junk as exc:
        if exc.detail:
            raise ConfigError(f"{opt.name}={value!r}: {exc.detail}") from None
    except (ValueError, TypeError):
        pass
    raise ConfigError(f"{opt.name}={value!r}: expected {opt.kind.argument}")


def read_env(scope: str | Iterable[Option] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The values of the variables that are set, for the options of ``scope``.

    Raises:
        ConfigError: a variable holds a value its option does not accept.
    """
    env = os.environ if environ is None else environ
    chosen = options(scope) if scope is None or isinstance(scope, str) else tuple(scope)
    values = {}
    for o in chosen:
        if not o.reading and _reading_only:
            continue
        var = o.env if o.env in env else o.alias if o.alias is not None and o.alias in env else None
        if var is not None:
            values[o.name] = parse_env(o, env[var], var)
    return values


def check_env(environ: Mapping[str, str] | None = None) -> None:
    """Check every ``TPU_DEBUG_*`` option variable, before a recording starts.

    Raises:
        ConfigError: the first variable holding a value its option does not accept.
    """
    read_env(None, environ)


def default_logdir(environ: Mapping[str, str] | None = None) -> Path:
    """Where runs are when no logdir is given: ``TPU_DEBUG_LOGDIR``, else the default.

    What a reader of runs needs, without the recording options (which it ignores).

    Raises:
        ConfigError: ``TPU_DEBUG_LOGDIR`` is set but blank.
    """
    opt = option("logdir")
    return read_env([opt], environ).get("logdir", opt.default)


def env_text(value: Any) -> str:
    """``value`` as the text of an environment variable that parses back to it."""
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def add_flags(parser: argparse.ArgumentParser, scope: str = "trace") -> None:
    """Add a flag to ``parser`` for each option of ``scope`` that has one (value None: not given)."""
    for o in options(scope):
        if o.flag:
            shown = o.default.name if isinstance(o.default, Path) else o.default
            shown = ("on" if shown else "off") if isinstance(shown, bool) else shown
            hint = f" (default: {shown}; {o.env})" if shown is not None else f" ({o.env})"
            parser.add_argument(o.cli, dest=o.name, help=o.help + hint, **o.kind.flag)


def doc_entries(scope: str) -> str:
    """One docstring entry (``Args:``/``Attributes:`` style) per option of ``scope``."""
    lines = []
    for o in options(scope):
        default = o.default_in(scope)
        shown = "the runtime's setting" if default is None and o.default is not None else repr(default)
        lines.append(f"        {o.name}: {o.help} (default {shown}; ``{o.env}``).")
    return "\n".join(lines)


def attributes_doc(scope: str) -> str:
    """An ``Attributes:`` docstring section for the options of ``scope``."""
    return "\n\n    Attributes:\n" + doc_entries(scope) + "\n"


class Settings:
    """Base of the runtime's config objects: one attribute per option of ``SCOPE``.

    ``Settings()`` holds the defaults and ``from_env()`` the environment's values. The
    module-level instance made with :meth:`unread` reads the environment when one of
    its fields is first read (a value assigned before that stands), so importing the
    runtime parses nothing: a bad variable raises when the runtime first runs.
    """

    SCOPE = ""
    _OPTIONS: tuple[Option, ...] = ()
    _NAMES: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._OPTIONS = options(cls.SCOPE)
        cls._NAMES = frozenset(o.name for o in cls._OPTIONS)
        cls.__doc__ = (cls.__doc__ or "") + attributes_doc(cls.SCOPE)

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - self._NAMES
        if unknown:
            raise TypeError(f"{type(self).__name__} has no option {min(unknown)!r}")
        for o in self._OPTIONS:
            setattr(self, o.name, values.get(o.name, o.default))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by the ``TPU_DEBUG_*`` variables that are set.

        Raises:
            ConfigError: a variable holds a value its option does not accept.
        """
        return cls(**read_env(cls._OPTIONS, environ))

    @classmethod
    def unread(cls) -> Settings:
        """An instance that reads the environment when a field is first read."""
        return object.__new__(cls)

    def load_env(self, environ: Mapping[str, str] | None = None) -> None:
        """Give every field not assigned yet its value from the environment, else its default.

        Raises:
            ConfigError: a variable holds a value its option does not accept.
        """
        values = read_env(self._OPTIONS, environ)
        for o in self._OPTIONS:
            if o.name not in self.__dict__:
                self.__dict__[o.name] = values.get(o.name, o.default)

    def __getattr__(self, name: str) -> Any:
        # reached only for a field not read yet (instance attributes are found first)
        if name not in type(self)._NAMES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.load_env()
        return self.__dict__[name]

    def as_dict(self) -> dict[str, Any]:
        return {o.name: getattr(self, o.name) for o in self._OPTIONS}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == other.as_dict()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({fields})"
