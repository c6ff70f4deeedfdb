"""``torch_tpu._internal.distributed.tpu_topology``: the slice topology of the TPU chips attached
to this host, as TorchTPU's launchers and its distributed tutorial ask for it.

``get_tpu_topology(world_size=None)`` answers ``(topology, count)``: the chips come from the
same PCI scan as ``torch_tpu._internal.utils.hardware`` (JAX's, which starts no runtime), the
topology string from the slices TorchTPU names per generation (v5p, v5e, v6e: 4 chips
``"2,2,1"``, 8 ``"2,2,2"``; v7, two devices per chip: 2 ``"1,1,1,2"``, 4 ``"1,2,1,2"``, 8
``"2,2,1,2"``). On a host with no TPU (a laptop, CI) the answer is TorchTPU's there,
``(None, 0)``: the runtime's devices run on this host's XLA platform and are not TPU chips.
"""

from __future__ import annotations

import logging

from tpu_debug.runtime.torchtpu import hardware

__all__ = ["get_tpu_topology"]

_ONE_DEVICE_PER_CHIP = {4: "2,2,1", 8: "2,2,2"}
_SLICES_BY_GENERATION: dict[hardware.TpuVersion, dict[int, str]] = {
    hardware.TpuVersion.V5P: _ONE_DEVICE_PER_CHIP,
    hardware.TpuVersion.V5E: _ONE_DEVICE_PER_CHIP,
    hardware.TpuVersion.V6E: _ONE_DEVICE_PER_CHIP,
    hardware.TpuVersion.V7: {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
}
_log = logging.getLogger(__name__)


def get_tpu_topology(world_size: int | None = None) -> tuple[str | None, int]:
    """The topology string and chip count of the TPU chips attached to this host.

    Args:
        world_size: the chips to slice (a single-host sub-slice); default: all attached.

    Returns:
        ``(topology, count)``, e.g. ``("2,2,2", 8)``; ``(None, 0)`` with no TPU chip TorchTPU
        knows attached.

    Raises:
        ValueError: ``world_size`` is more than the chips attached.
        RuntimeError: no slice of ``world_size`` chips exists for the attached generation.

    Example:
        >>> from torch_tpu._internal.distributed import tpu_topology
        >>> tpu_topology.get_tpu_topology()  # on a host without TPU chips
        (None, 0)
    """
    slices = _SLICES_BY_GENERATION.get(hardware.get_tpu_version())
    detected = hardware.get_tpu_device_count() if slices else 0
    if world_size is not None:
        if world_size > detected:
            raise ValueError(f"expected world_size to be less than or equal to detected TPUs {detected}, got "
                             f"{world_size}. Leave world_size unset to use the chips attached to this host.")
        if world_size < detected:
            _log.warning("using world_size: %d instead of detected count: %d", world_size, detected)
    target = detected if world_size is None else world_size
    if not target or not slices:
        return None, 0
    if target not in slices:
        raise RuntimeError(f"No TPU topology found for count: {target}. Slices of this generation: "
                           f"{sorted(slices)} chips.")
    return slices[target], target
