"""``torch_tpu._internal.env`` and ``torch_tpu._internal.env_utils``: TorchTPU's build facts and
its environment-variable helpers.

``IS_INTERNAL_TORCH_TPU`` is False (this is no Google-internal build: TorchTPU's tests mark
what fails outside with it); ``set_native_scan_emitter_supported`` is TorchTPU's switch for
lowering ``scan`` to a native TPU loop, which this runtime's lowering of ``scan`` does not
have, so it is kept and changes nothing. The ``*_env`` helpers read and write ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["IS_INTERNAL_TORCH_TPU", "get_and_set_str_env_once", "get_bool_env_once", "get_str_env_once",
           "set_native_scan_emitter_supported", "set_str_env"]

IS_INTERNAL_TORCH_TPU = False

_native_scan = {"supported": False}
_once: dict[str, str | None] = {}
_made: dict[str, str] = {}


def set_native_scan_emitter_supported(supported: bool) -> None:
    """Kept (see the module)."""
    _native_scan["supported"] = bool(supported)


def set_str_env(name: str, value: str) -> None:
    """Set variable ``name`` (child processes inherit it)."""
    os.environ[name] = value


def get_str_env_once(name: str, default: str | None = None) -> str | None:
    """Variable ``name`` as first read in this process (later changes are not seen)."""
    if name not in _once:
        _once[name] = os.environ.get(name)
    value = _once[name]
    return default if value is None else value


def get_bool_env_once(name: str, default: bool = False) -> bool:
    """Variable ``name`` as first read, as a boolean (``1``/``true``/``yes``/``on`` are true)."""
    value = get_str_env_once(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def get_and_set_str_env_once(name: str, value_factory: Callable[[], str]) -> str:
    """Variable ``name``, set from ``value_factory()`` (called at most once per name) when unset."""
    if name not in os.environ:
        if name not in _made:
            _made[name] = value_factory()
        os.environ[name] = _made[name]
    return os.environ[name]
