"""``torch_tpu.api``: the device a TorchTPU script asks for.

A package in TorchTPU's older layout (``torch_tpu.api._device_module``, ``torch_tpu.api.streams``,
which upstream PyTorch's ``torch/tpu`` module imports), a module in later ones; both spellings
resolve (core/torch_tpu_finder.py).
"""

from __future__ import annotations

import functools

import torch
from tpu_debug.core.errors import UnsupportedError
from tpu_debug.runtime import accelerator as _accelerator
from tpu_debug.runtime.torchtpu.device_module import DeviceModule

__all__ = ["tpu_device"]


@functools.cache
def tpu_device() -> torch.device:
    """The ``tpu`` device, with the runtime started (TorchTPU's ``api.tpu_device()``).

    Idempotent and cached, as TorchTPU's is (``tpu_device.cache_clear()`` exists for the
    same reason: the guide's notebook helper calls it before starting the runtime again).
    Marks TorchTPU's device module initialized (``_DeviceModule.is_initialized()``) and makes
    ``tpu`` PyTorch's accelerator (``torch.accelerator.is_available()``), as the script asked for it.

    Returns:
        ``torch.device("tpu", 0)``: the runtime runs eager ops on one device.

    Example::

        device = torch_tpu.api.tpu_device()
        torch.ones(2, device=device)
    """
    # autoload off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): the script asked for the device, so
    # _init_runtime registers it
    DeviceModule._init_runtime(device_type="tpu")
    # asking for the device is using it: PyTorch's accelerator is `tpu` from here, as on
    # TorchTPU, where torch.accelerator.is_available() answers torch.tpu.is_available()
    _accelerator.claim()
    return torch.device("tpu", 0)


def _init_device(device: str = "tpu") -> torch.device:
    """Register and start the device, and return it (TorchTPU's ``api._init_device`` and
    ``_loader._init_device``).

    Raises:
        UnsupportedError: ``xla_cpu``/``xla_cuda`` (TorchTPU's XLA devices on a CPU or GPU host).
    """
    if device != "tpu":
        raise UnsupportedError(f"_init_device({device!r}): TorchTPU's {device} device has no counterpart here; "
                               "the 'tpu' device already runs on this host's XLA platform: use _init_device('tpu')")
    return tpu_device()


def _xla_device(name: str):
    def device() -> torch.device:
        raise UnsupportedError(f"api.{name}(): TorchTPU's XLA device for a CPU or GPU host has no counterpart here; "
                               "the 'tpu' device already runs on this host's XLA platform: use api.tpu_device()")

    device.__name__ = device.__qualname__ = name
    return device


_xla_cpu_device = _xla_device("_xla_cpu_device")
_xla_cuda_device = _xla_device("_xla_cuda_device")
