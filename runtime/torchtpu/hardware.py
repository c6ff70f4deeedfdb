"""``torch_tpu._internal.utils.hardware``: which TPU is attached to this host, and its figures.

The answers are about the host, as TorchTPU's are: the chips come from JAX's PCI scan
(``jax._src.hardware_utils``, which starts no runtime), the figures per chip from the one
table of TPU generations (``runtime/target/hardware.py``). On a host with no TPU (a laptop,
CI) the name is ``"TPU"``, the version ``TpuVersion.UNKNOWN``, the count 0 and every figure
None, exactly what TorchTPU answers there: the runtime runs on this host's XLA platform and
never pretends it is a TPU (``torch.tpu.get_device_name()`` names that platform).
"""

from __future__ import annotations

import enum
import os

from tpu_debug.runtime.target.hardware import GENERATIONS

__all__ = ["TpuVersion", "get_bf16_flops_per_chip", "get_bf16_flops_per_device", "get_devices_per_chip",
           "get_hbm_bytes_per_chip", "get_hbm_bytes_per_device", "get_tpu_device_count", "get_tpu_device_name",
           "get_tpu_topology", "get_tpu_version", "has_nvidia_gpu"]


class TpuVersion(enum.Enum):
    """TPU generations, valued by the names TorchTPU gives them."""

    V4 = "TPU v4"
    V5P = "TPU v5p"
    V5E = "TPU v5e"
    V6E = "TPU v6e"
    V7 = "TPU v7"
    UNKNOWN = "TPU"


def _attached() -> tuple[int, str | None]:
    """(chips on this host, their generation as JAX names it, e.g. ``"v5e"``)."""
    try:
        from jax._src import hardware_utils

        count, version = hardware_utils.num_available_tpu_chips_and_device_id()
    except (ImportError, AttributeError, OSError):
        return 0, None
    if not count or version is None:
        return 0, None
    return count, version.name


def get_tpu_version() -> TpuVersion:
    """The attached chips' generation; ``UNKNOWN`` with none attached."""
    _count, name = _attached()
    return {"v4": TpuVersion.V4, "v5p": TpuVersion.V5P, "v5e": TpuVersion.V5E, "v6e": TpuVersion.V6E,
            "tpu7x": TpuVersion.V7}.get(name or "", TpuVersion.UNKNOWN)


def get_tpu_device_name() -> str:
    """``"TPU v5e"`` and so on; ``"TPU"`` with no known chip attached."""
    return get_tpu_version().value


def _generation():
    short = {TpuVersion.V4: "v4", TpuVersion.V5P: "v5p", TpuVersion.V5E: "v5e", TpuVersion.V6E: "v6e"}
    return GENERATIONS.get(short.get(get_tpu_version(), ""))


def get_hbm_bytes_per_chip() -> int | None:
    gen = _generation()
    return None if gen is None else gen.hbm_bytes


def get_devices_per_chip() -> int | None:
    gen = _generation()
    return None if gen is None else gen.devices_per_chip


def get_bf16_flops_per_chip() -> int | None:
    gen = _generation()
    return None if gen is None else int(gen.peak_bf16_flops)


def get_hbm_bytes_per_device() -> int | None:
    gen = _generation()
    return None if gen is None else gen.hbm_bytes // gen.devices_per_chip


def get_bf16_flops_per_device() -> int | None:
    gen = _generation()
    return None if gen is None else int(gen.peak_bf16_flops / gen.devices_per_chip)


def get_tpu_device_count() -> int:
    """TPU chips attached to this host (0 with none)."""
    return _attached()[0]


def get_tpu_topology(world_size: int | None = None) -> str | None:
    """The chips' topology (``"2x2"``) for ``world_size`` chips (default: all attached), or
    None with none attached.

    Raises:
        RuntimeError: chips are attached but no slice of that many exists.
    """
    gen = _generation()
    count = get_tpu_device_count()
    if gen is None or not count:
        return None
    wanted = count if world_size is None else world_size
    topology = gen.slices.get(wanted)
    if topology is None:
        raise RuntimeError(f"No TPU topology found for count: {wanted}")
    return topology


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU is visible to this host."""
    try:
        from jax._src import hardware_utils

        return bool(hardware_utils.has_visible_nvidia_gpu())
    except (ImportError, AttributeError):
        return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl"))
