"""``torch_tpu._internal.execution_mode_impl`` (TorchTPU's C++ extension behind
``execution_mode``, at both layouts it shipped): the eager mode and the CPU fallback as plain
functions, and the older defer modes.

TorchTPU's first layout had ``DeferMode`` (``DEFAULT``, ``ALL``, ``NEVER``) where later
versions have ``EagerMode``. Here ``NEVER`` is ``DEFER_NEVER`` (op by op), ``ALL`` is
``DEFER_AND_FUSE`` (every op deferred and fused), and ``DEFAULT`` is the mode the runtime
starts in (``TPU_DEBUG_EAGER_MODE``, or TorchTPU's ``TPU_LAUNCH_BLOCKING`` /
``TORCH_TPU_DEFER_AND_FUSE``; op by op when none is set).
"""

from __future__ import annotations

import enum
import os

from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.core.options import OPTIONS
from tpu_debug.runtime import lazy
from tpu_debug.runtime.config import config
from tpu_debug.runtime.torchtpu.compat import eager_mode_from_env

__all__ = ["DeferMode", "EagerMode", "default_mode", "enable_cpu_fallback", "get_defer_mode",
           "is_cpu_fallback_enabled", "set_defer_mode"]

EagerMode = lazy.EagerMode


class DeferMode(enum.Enum):
    """TorchTPU's older names for the eager modes (see the module)."""

    DEFAULT = "default"
    ALL = "all"
    NEVER = "never"


def default_mode() -> str:
    """The eager mode the runtime starts in (see the module)."""
    from_env = eager_mode_from_env()
    if from_env is not None:
        return from_env
    option = next(o for o in OPTIONS if o.name == "eager_mode")
    return os.environ.get(option.env, "").strip().lower() or option.default


_set: list[DeferMode] = []


def set_defer_mode(defer_mode: DeferMode) -> None:
    """Make ``defer_mode``'s eager mode the one in effect (see the module)."""
    if not isinstance(defer_mode, DeferMode):
        raise TpuArgumentError(f"defer mode {defer_mode!r} is not one of DeferMode.DEFAULT, ALL, NEVER")
    mode = {DeferMode.ALL: EagerMode.DEFER_AND_FUSE.value, DeferMode.NEVER: EagerMode.DEFER_NEVER.value}.get(
        defer_mode) or default_mode()
    lazy.set_mode(mode)
    _set[:] = [defer_mode]


def get_defer_mode() -> DeferMode:
    """The defer mode in effect: the one last set while its eager mode still holds, else the
    one the eager mode in effect is."""
    mode = lazy.eager_mode()
    if _set and (_set[0] is DeferMode.DEFAULT and mode.value == default_mode()
                 or _set[0] is DeferMode.ALL and mode is EagerMode.DEFER_AND_FUSE
                 or _set[0] is DeferMode.NEVER and mode is EagerMode.DEFER_NEVER):
        return _set[0]
    return DeferMode.ALL if mode is EagerMode.DEFER_AND_FUSE else DeferMode.NEVER


def enable_cpu_fallback(enabled: bool) -> None:
    """Run ops that have no lowering on CPU (True) or raise for them (False)."""
    config.cpu_fallback = bool(enabled)


def is_cpu_fallback_enabled() -> bool:
    return bool(config.cpu_fallback)


# the later extension's private names, which execution_mode's properties and contexts call
_enable_cpu_fallback = enable_cpu_fallback
_is_cpu_fallback_enabled = is_cpu_fallback_enabled
_get_eager_mode = lazy.eager_mode
_set_eager_mode = lazy.set_mode
_pushed: list[lazy.set_eager_mode] = []


def _push_eager_mode(mode) -> None:
    context = lazy.set_eager_mode(mode)
    context.__enter__()
    _pushed.append(context)


def _pop_eager_mode() -> None:
    if _pushed:
        _pushed.pop().__exit__(None, None, None)
