"""``torch_tpu.api``: the device a TorchTPU script asks for."""

from __future__ import annotations

import functools

import torch
from tpu_debug.runtime import install, start

__all__ = ["tpu_device"]


@functools.cache
def tpu_device() -> torch.device:
    """The ``tpu`` device, with the runtime started (TorchTPU's ``api.tpu_device()``).

    Idempotent and cached, as TorchTPU's is (``tpu_device.cache_clear()`` exists for the
    same reason: the guide's notebook helper calls it).

    Returns:
        ``torch.device("tpu", 0)``: the runtime runs eager ops on one device.

    Example::

        device = torch_tpu.api.tpu_device()
        torch.ones(2, device=device)
    """
    install()  # autoload off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): the script asked for the device
    start()
    return torch.device("tpu", 0)
