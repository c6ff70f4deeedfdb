"""``torch_tpu._internal.device._device_module`` (and the older ``torch_tpu.api._device_module``):
TorchTPU's device module class, as the scripts, notebooks and PyTorch itself use it.

TorchTPU registers a class as ``torch.tpu`` and keeps the runtime's state on it: ``_is_initialized``,
``_device_count``, ``_current_device`` and the autocast settings are class attributes that
code reads and assigns (the guide's notebook helper resets them to start the runtime again;
TorchTPU's tests set ``_autocast_dtype`` directly). :class:`DeviceModule` (also ``_DeviceModule``
and ``TpuDeviceModule``, the names of different versions) is that class over this runtime:
``torch.tpu``'s functions as class methods (it subclasses :class:`~tpu_debug.runtime.device.TpuModule`,
the class of ``torch.tpu`` here), and those attributes as properties of its metaclass, so
reading and assigning them goes to the runtime:

- ``_is_initialized``, ``_device_count``, ``_current_device``: set by ``_init_runtime()``
  (``api.tpu_device()`` calls it), cleared by ``_shutdown_runtime()``; before either, whether
  the device is registered, and its count and index.
- ``_autocast_enabled``, ``_autocast_dtype``: PyTorch's own autocast state for ``tpu``
  (``torch.is_autocast_enabled("tpu")``, ``torch.get_autocast_dtype("tpu")``), so a dtype set
  here is the one ``torch.autocast("tpu")`` casts to.

Upstream PyTorch's ``torch/tpu`` module calls ``torch_tpu.api._device_module._DeviceModule``'s
``current_device``, ``device_count``, ``stream``, ``current_stream`` and ``set_stream``; all are here.
"""

from __future__ import annotations

from typing import Any

import jax
import torch
from tpu_debug.core.errors import UnsupportedError
from tpu_debug.runtime import install, start
from tpu_debug.runtime import lazy as _lazy
from tpu_debug.runtime import xla_options as _xla_options
from tpu_debug.runtime.device import TpuModule, installed
from tpu_debug.runtime.torchtpu.compat import AUTOCAST
from tpu_debug.runtime.torchtpu.streams import TpuEvent, TpuStream

__all__ = ["DeviceModule", "TpuDeviceModule", "TpuStreamContext", "get_device_module"]

_UNSET = object()
# what code assigned to the class attributes; _UNSET: follow the runtime
_assigned: dict[str, Any] = {"initialized": _UNSET, "device_count": _UNSET, "current_device": _UNSET}


def _runtime_device_count() -> int:
    start()
    return jax.local_device_count()


class _DeviceModuleMeta(type):
    """The class attributes TorchTPU's device module keeps its state in, read from and
    written to the runtime (see the module)."""

    @property
    def _is_initialized(cls) -> bool:
        value = _assigned["initialized"]
        return installed() if value is _UNSET else bool(value)

    @_is_initialized.setter
    def _is_initialized(cls, value: bool) -> None:
        _assigned["initialized"] = bool(value)

    @property
    def _device_count(cls) -> int | None:
        value = _assigned["device_count"]
        if value is _UNSET:
            return _runtime_device_count() if cls._is_initialized else None
        return value

    @_device_count.setter
    def _device_count(cls, value: int | None) -> None:
        _assigned["device_count"] = value

    @property
    def _current_device(cls) -> int | None:
        value = _assigned["current_device"]
        if value is _UNSET:
            return 0 if cls._is_initialized else None
        return value

    @_current_device.setter
    def _current_device(cls, value: int | None) -> None:
        _assigned["current_device"] = value

    @property
    def _autocast_enabled(cls) -> bool:
        return torch.is_autocast_enabled("tpu")

    @_autocast_enabled.setter
    def _autocast_enabled(cls, enabled: bool) -> None:
        torch.set_autocast_enabled("tpu", bool(enabled))

    @property
    def _autocast_dtype(cls) -> torch.dtype:
        return torch.get_autocast_dtype("tpu")

    @_autocast_dtype.setter
    def _autocast_dtype(cls, dtype: torch.dtype) -> None:
        cls._set_autocast_dtype(dtype)

    @property
    def eager_mode(cls) -> _lazy.EagerMode:
        """The eager mode in effect; assigning sets it (``torch.tpu.eager_mode``)."""
        return _lazy.eager_mode()

    @eager_mode.setter
    def eager_mode(cls, mode: Any) -> None:
        _lazy.set_mode(mode)

    @property
    def allow_excess_precision(cls) -> bool:
        """``torch.tpu.allow_excess_precision``: see runtime/xla_options.py."""
        return _xla_options.excess_precision()

    @allow_excess_precision.setter
    def allow_excess_precision(cls, allowed: bool) -> None:
        _xla_options.set_excess_precision(allowed)


class DeviceModule(TpuModule, metaclass=_DeviceModuleMeta):
    """TorchTPU's device module class (``_DeviceModule``, ``TpuDeviceModule``): ``torch.tpu``'s
    functions as class methods, the runtime's state as class attributes (see the module).

    Example::

        from torch_tpu._internal.device import _device_module
        _device_module.DeviceModule._init_runtime(device_type="tpu")
        assert _device_module.DeviceModule.is_initialized()
    """

    @classmethod
    def is_initialized(cls) -> bool:
        return cls._is_initialized

    @classmethod
    def device_count(cls) -> int:
        if cls._device_count is None:
            cls._init_runtime()
        return cls._device_count

    @classmethod
    def current_device(cls) -> int:
        if cls._current_device is None:
            cls._init_runtime()
        return cls._current_device

    @classmethod
    def _init_runtime(cls, device_type: str = "tpu", **options: Any) -> None:
        """Register and start the runtime, and mark the class initialized (TorchTPU's
        ``_init_runtime``; options are TorchTPU's runtime options, which this runtime has none of)."""
        if device_type != "tpu":
            raise UnsupportedError(f"_init_runtime(device_type={device_type!r}): this runtime has the 'tpu' device "
                                   "only (on this host's XLA platform)")
        install()
        start()
        _assigned.update(initialized=True, device_count=_runtime_device_count(), current_device=0)

    @classmethod
    def _init_runtime_options(cls, device_type: str = "tpu", **options: Any) -> None:
        """TorchTPU's name for :meth:`_init_runtime` at one version."""
        cls._init_runtime(device_type, **options)

    @classmethod
    def _shutdown_runtime(cls) -> None:
        """Finish the device's queued work and mark the class not initialized.

        TorchTPU releases the TPU here; this runtime's XLA client lives as long as the
        process (JAX cannot close it), so its buffers stay valid and a later
        ``_init_runtime()`` goes on with them.
        """
        if cls._is_initialized and installed():
            TpuModule.synchronize()
        _assigned.update(initialized=False, device_count=None, current_device=None)

    @classmethod
    def _is_autocast_enabled(cls) -> bool:
        return cls._autocast_enabled

    @classmethod
    def _set_autocast_enabled(cls, enabled: bool) -> None:
        cls._autocast_enabled = enabled

    @classmethod
    def _get_autocast_dtype(cls) -> torch.dtype:
        return cls._autocast_dtype

    @classmethod
    def _set_autocast_dtype(cls, dtype: torch.dtype) -> None:
        """The dtype ``torch.autocast("tpu")`` casts to.

        Raises:
            ValueError: ``dtype`` is not one :meth:`get_amp_supported_dtype` lists.
        """
        AUTOCAST["_set_autocast_dtype"](dtype)


_DeviceModule = DeviceModule
TpuDeviceModule = DeviceModule


class TpuStreamContext:
    """``with TpuStreamContext(stream):`` makes ``stream`` current, then restores the one
    before (what ``torch.tpu.stream(stream)`` returns); None changes nothing."""

    def __init__(self, stream: TpuStream | None) -> None:
        self.stream = stream
        self.prev_stream: TpuStream | None = None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.prev_stream = DeviceModule.current_stream()
            DeviceModule.set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            DeviceModule.set_stream(self.prev_stream)


def get_device_module(device_type: str = "tpu") -> type[DeviceModule]:
    """The device module class of ``device_type`` (``"tpu"``).

    Raises:
        ValueError: another device type.
    """
    if torch.device(device_type).type != "tpu":
        raise ValueError(f"get_device_module({device_type!r}): this runtime has the 'tpu' device only")
    return DeviceModule


# the stream classes the module names, as TorchTPU's device module holds them
Stream = TpuStream
Event = TpuEvent
