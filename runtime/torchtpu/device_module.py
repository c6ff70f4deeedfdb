"""``torch_tpu._internal.device._device_module``: TorchTPU's device module class, which the
guide's notebook helper (``tpu_utils.safe_init``) asks whether the runtime is up.

``DeviceModule`` (and ``TpuDeviceModule``) is the class of ``torch.tpu`` here: its
``is_initialized()`` says whether the device is registered.
"""

from __future__ import annotations

from tpu_debug.runtime.device import TpuModule

__all__ = ["DeviceModule", "TpuDeviceModule"]

DeviceModule = TpuModule
TpuDeviceModule = TpuModule
