"""``torch_tpu._internal.stream.streams`` (and the older ``torch_tpu.api.streams``): TorchTPU's
stream and event classes, ``torch.tpu.Stream`` and ``torch.tpu.Event`` here (one ordered queue:
see :class:`tpu_debug.runtime.device.Stream`), and ``synchronize``.

Upstream PyTorch's ``torch/tpu`` module imports ``TpuStream`` and ``TpuEvent`` from here.
"""

from __future__ import annotations

from tpu_debug.runtime.device import Event, Stream, TpuModule

__all__ = ["TpuEvent", "TpuStream", "synchronize"]

TpuStream = Stream


class TpuEvent(Event):
    """``torch.tpu.Event`` with TorchTPU's signature (``external`` is accepted: there is no
    other runtime's event to import here)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        super().__init__(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def synchronize(device=None) -> None:
    """Wait for the device's queued work (``torch.tpu.synchronize``)."""
    TpuModule.synchronize(device)
