"""The XLA options every local compile of the runtime gets, beyond XLA's defaults.

Four sources, all of them read when a program is compiled (not at import):

- ``fast_local_compile`` (``TPU_DEBUG_FAST_LOCAL_COMPILE``): XLA's backend optimization
  level 0, for runs whose time is their compiles (the test suite sets it).

- ``allow_excess_precision`` (``torch.backends.tpu.allow_excess_precision``,
  ``torch.tpu.allow_excess_precision``): False passes XLA's
  ``xla_allow_excess_precision=false``, so a bfloat16 result is rounded to bfloat16 even
  where XLA could keep the float32 it computed it in (CPU XLA computes bfloat16 dots in
  float32 and, by default, drops the round trip between two converts).
- ``TORCH_TPU_INTERNAL_XLA_OPTIONS`` (TorchTPU's variable): ``xla_optimization_level=O0..O3``
  becomes the compile's optimization level; other entries are TPU compiler options, which
  this runtime does not have: they are named once on stderr and left out.
- ``XLA_FLAGS`` set after XLA started: XLA reads the variable once, when its first client
  is made, so a script that sets it later (under ``tpu-debug run``, which starts XLA
  before the script) would see no effect. A value that differs from the one at the
  runtime's start is passed to each compile as per-compile options (dumps, pass
  switches); a flag XLA does not take per compile is named once and left out.

A dump folder (``--xla_dump_to``) is kept as a TPU's would be: XLA's CPU backend also writes
each kernel's machine code there (``*.obj-file.*.o``), which a TPU's dump does not have and a
script that reads its dump as text (TorchTPU's examples print every file of it) cannot read;
after each compile those object files are moved into the folder's ``cpu_object_files/``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from tpu_debug.core.errors import ConfigError
from tpu_debug.runtime.config import config

__all__ = [
    "compile_scope",
    "compiler_options",
    "custom_compiler_options",
    "excess_precision",
    "mark_started",
    "set_excess_precision",
    "tidy_dump",
]

_LEVELS = ("O0", "O1", "O2", "O3")
_lock = threading.Lock()
_state: dict = {"excess": True, "flags_at_start": None, "started": False}
_parsed: dict[str, tuple] = {}  # variable value -> its parse
_told: set[str] = set()  # options already named on stderr
_scoped = threading.local()  # .stack: the options of custom_compiler_options blocks, innermost last


def excess_precision() -> bool:
    """Whether XLA may keep more precision than a result's dtype (XLA's default: True)."""
    return _state["excess"]


def set_excess_precision(allowed: bool) -> None:
    """Set it for every compile from now on (programs compiled before keep theirs)."""
    if not isinstance(allowed, bool):
        raise ConfigError(f"allow_excess_precision must be True or False, got {allowed!r}")
    _state["excess"] = allowed


def mark_started() -> None:
    """Remember ``XLA_FLAGS`` as XLA will read it (called where the runtime starts)."""
    if not _state["started"]:
        _state["flags_at_start"] = os.environ.get("XLA_FLAGS")
        _state["started"] = True


def _tell(name: str, why: str) -> None:
    if name not in _told:
        _told.add(name)
        print(f"tpu_debug: {name}: {why}", file=sys.stderr)


def _split(text: str) -> list[tuple[str, str | bool]]:
    """``--a=1 --b`` or ``a=1,b`` -> [("a", "1"), ("b", True)]."""
    out = []
    for item in text.replace(",", " ").split():
        name, sep, value = item.lstrip("-").partition("=")
        if name:
            out.append((name, value if sep else True))
    return out


def _torch_tpu_options(text: str) -> tuple[str | None, dict]:
    """TORCH_TPU_INTERNAL_XLA_OPTIONS -> (optimization level, {})."""
    level = None
    for name, value in _split(text):
        if name == "xla_optimization_level":
            if value not in _LEVELS:
                raise ConfigError(
                    f"TORCH_TPU_INTERNAL_XLA_OPTIONS: xla_optimization_level={value} is not one of "
                    f"{', '.join(_LEVELS)}; set e.g. TORCH_TPU_INTERNAL_XLA_OPTIONS=xla_optimization_level=O2"
                )
            level = value
        else:
            _tell(f"TORCH_TPU_INTERNAL_XLA_OPTIONS {name}", "a TPU compiler option; this runtime compiles "
                  "with XLA on the local platform and leaves it out (only xla_optimization_level applies)")
    return level, {}


def _value(value: str | bool) -> str | bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _late_flags(text: str) -> dict:
    """XLA_FLAGS set after XLA started -> the per-compile options XLA accepts among them."""
    options = {name: _value(value) for name, value in _split(text)}
    accepted = {}
    for name, value in options.items():
        if _accepts(name, value):
            accepted[name] = value
        else:
            _tell(f"XLA_FLAGS --{name}", "XLA read XLA_FLAGS when it started, and this flag is no "
                  "per-compile option: export it before the process starts")
    return accepted


def _accepts(name: str, value: str | bool) -> bool:
    import jax
    import jax.numpy as jnp

    try:
        jax.jit(lambda x: x).lower(jnp.zeros(())).compile(compiler_options={name: value})
    except Exception:  # noqa: BLE001 - XLA's refusal of an option name is the answer
        return False
    return True


def _parse(variable: str, text: str | None, parse) -> tuple:
    if not text:
        return None, {}
    key = f"{variable}={text}"
    with _lock:
        if key not in _parsed:
            _parsed[key] = parse(text)
        return _parsed[key]


def compiler_options() -> dict | None:
    """The per-compile XLA options in effect (None when there are none: XLA's defaults)."""
    options: dict = {}
    flags = os.environ.get("XLA_FLAGS")
    if _state["started"] and flags != _state["flags_at_start"]:
        options.update(_parse("XLA_FLAGS", flags, lambda t: (None, _late_flags(t)))[1])
    if not _state["excess"]:
        options["xla_allow_excess_precision"] = False
    if config.fast_local_compile:
        options["xla_backend_optimization_level"] = 0
    for scoped in getattr(_scoped, "stack", ()):
        options.update({k: v for k, v in scoped.items() if k != "xla_optimization_level"})
    return options or None


def _dump_folder(options: dict | None) -> str | None:
    """The folder XLA dumps this compile into (None: no dump)."""
    folder = (options or {}).get("xla_dump_to")
    if folder is None:
        for name, value in _split(_state["flags_at_start"] or ""):
            if name == "xla_dump_to":
                folder = value
    if not isinstance(folder, str) or folder in ("", "-", "sponge", "test_undeclared_outputs_dir"):
        return None
    return folder


CPU_OBJECTS = "cpu_object_files"


def tidy_dump(options: dict | None) -> None:
    """After a compile: the CPU backend's object files out of the dump folder's top level
    (see the module docstring); nothing to do when no dump is asked for."""
    folder = _dump_folder(options)
    if folder is None or not os.path.isdir(folder):
        return
    objects = [name for name in os.listdir(folder) if ".obj-file." in name and name.endswith(".o")]
    if not objects:
        return
    os.makedirs(os.path.join(folder, CPU_OBJECTS), exist_ok=True)
    for name in objects:
        with contextlib.suppress(FileNotFoundError):  # another process of the job moved it first
            os.replace(os.path.join(folder, name), os.path.join(folder, CPU_OBJECTS, name))


def optimization_level() -> str | None:
    """The level asked for (None: XLA's default): the innermost ``custom_compiler_options``
    block's, else TORCH_TPU_INTERNAL_XLA_OPTIONS's."""
    for scoped in reversed(getattr(_scoped, "stack", ())):
        if "xla_optimization_level" in scoped:
            return scoped["xla_optimization_level"]
    return _parse("TORCH_TPU_INTERNAL_XLA_OPTIONS", os.environ.get("TORCH_TPU_INTERNAL_XLA_OPTIONS"),
                  _torch_tpu_options)[0]


@contextlib.contextmanager
def compile_scope() -> Iterator[None]:
    """Around a local compile: the optimization level asked for, on this thread."""
    level = optimization_level()
    if level is None:
        yield
        return
    from jax._src import config as jax_config

    with jax_config.optimization_level(level):
        yield


@contextlib.contextmanager
def custom_compiler_options(options: dict[str, str]) -> Iterator[None]:
    """``torch.tpu.compiler.custom_compiler_options``: XLA options for the programs compiled
    inside the block, on this thread (``xla_optimization_level`` is the optimization level).

    Raises:
        ConfigError: an ``xla_optimization_level`` that is not O0 to O3.
    """
    level = options.get("xla_optimization_level")
    if level is not None and level not in _LEVELS:
        raise ConfigError(f"xla_optimization_level={level!r} is not one of {', '.join(_LEVELS)}")
    stack = getattr(_scoped, "stack", None)
    if stack is None:
        stack = _scoped.stack = []
    stack.append({k: _value(v) for k, v in options.items()})
    try:
        yield
    finally:
        stack.pop()
