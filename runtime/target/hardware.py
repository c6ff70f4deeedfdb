"""TPU generations a program can be compiled for, and the target specs that name them.

One table, ``GENERATIONS``: per chip, the HBM, the peak bfloat16 and int8 rates
and the HBM bandwidth Google publishes, each with the page it comes from; and
the slices Cloud TPU sells, as the topology names XLA's TPU compiler accepts
(``jax.experimental.topologies.get_topology_desc(topology_name=...)`` takes
``v5e:2x4``, not the accelerator type ``v5e-8``). Nothing here loads libtpu.

Accelerator-type suffixes count different things per generation, as Cloud TPU
names them: v5e and v6e count chips (``v5e-8`` is 8 chips), v4 and v5p count
TensorCores, two per chip (``v5p-8`` is 4 chips).
"""

from __future__ import annotations

import dataclasses
import math
import re

from tpu_debug.runtime.target.errors import TargetSpecError

__all__ = ["Generation", "Target", "GENERATIONS", "parse_target", "TargetSpecError"]

GiB = 1024**3


@dataclasses.dataclass(frozen=True, slots=True)
class Generation:
    """One TPU generation, per chip.

    Attributes:
        name: the generation as Cloud TPU and XLA's topology names spell it (``"v5e"``).
        hbm_bytes: HBM capacity of one chip.
        peak_bf16_flops: peak bfloat16 matrix FLOP/s of one chip.
        peak_int8_ops: peak int8 OP/s of one chip; None where the generation's page
            publishes no int8 figure.
        hbm_bandwidth: HBM bytes/s of one chip.
        devices_per_chip: JAX devices XLA's deviceless topology gives per chip (one
            per TensorCore on v4, whose two cores are separate devices there).
        slice_unit: what an accelerator-type suffix counts, ``"chips"`` or ``"cores"``.
        slices: accelerator-type suffix -> chip topology (``8 -> "2x4"``).
        source: the Cloud TPU page the figures and slices come from.
        chips_per_host: the chips one host (TPU VM) attaches, as x, y, z bounds.
        ici_bandwidth: bidirectional inter-chip interconnect (ICI) bytes/s of one chip,
            all its ports together; None where the generation's page publishes none.
        host_bandwidth: bytes/s between the host's memory and one chip over its PCIe link, one
            way: what a host-to-device or device-to-host copy of the chip moves at the most.
    """

    name: str
    hbm_bytes: int
    peak_bf16_flops: float
    peak_int8_ops: float | None
    hbm_bandwidth: float
    devices_per_chip: int
    slice_unit: str
    slices: dict[int, str]
    source: str
    chips_per_host: tuple[int, int, int] = (2, 2, 1)
    aliases: tuple[str, ...] = ()
    ici_bandwidth: float | None = None
    host_bandwidth: float = 0.0

    @property
    def single_chip_topology(self) -> str:
        """The topology of one chip (``1x1`` or ``1x1x1``)."""
        return "x".join("1" * len(next(iter(self.slices.values())).split("x")))


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            "v4",
            # https://cloud.google.com/tpu/docs/v4 : "Peak compute per chip 275 teraflops
            # (bf16 or int8)", "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"
            hbm_bytes=32 * GiB,
            peak_bf16_flops=275e12,
            peak_int8_ops=275e12,
            hbm_bandwidth=1200e9,
            devices_per_chip=2,
            slice_unit="cores",
            # same page, "Configurations": v4-8 is 2x2x1 ... v4-4096 is 8x16x16
            slices={8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8",
                    512: "4x8x8", 1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"},
            source="https://cloud.google.com/tpu/docs/v4",
            chips_per_host=(2, 2, 1),  # a v4-8 (2x2x1) is one host
            # the v4 page gives pod-wide all-reduce (1.1 PB/s) and bisection bandwidth, no per-chip ICI
            ici_bandwidth=None,
            # https://jax-ml.github.io/scaling-book/tpus/ ("How to Scale Your Model", part 2):
            # "PCIe bandwidth is typically around 1.5e10 bytes / second per chip"; the Cloud TPU
            # pages publish no host-link figure
            host_bandwidth=1.5e10,
        ),
        Generation(
            "v5e",
            # https://cloud.google.com/tpu/docs/v5e : "Peak compute per chip (bf16) 197
            # TFLOPs", "Peak compute per chip (Int8) 393 TOPs", "HBM capacity per chip
            # 16 GiB", "HBM bandwidth per chip 819 GBps"
            hbm_bytes=16 * GiB,
            peak_bf16_flops=197e12,
            peak_int8_ops=393e12,
            hbm_bandwidth=819e9,
            devices_per_chip=1,
            slice_unit="chips",
            # same page, "Configurations": v5litepod-1 (1x1) ... v5litepod-256 (16x16)
            slices={1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
            source="https://cloud.google.com/tpu/docs/v5e",
            chips_per_host=(2, 4, 1),  # same page: "Chips per host 8"
            aliases=("v5litepod",),
            # same page: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip) 400 GBps"
            # (older revisions: "Interchip Interconnect BW 1600 Gbps", the same figure)
            ici_bandwidth=400e9,
            # https://jax-ml.github.io/scaling-book/tpus/ ("How to Scale Your Model", part 2):
            # "PCIe bandwidth is typically around 1.5e10 bytes / second per chip"; the Cloud TPU
            # pages publish no host-link figure
            host_bandwidth=1.5e10,
        ),
        Generation(
            "v5p",
            # https://cloud.google.com/tpu/docs/v5p : "Peak compute per chip (BF16) 459
            # TFLOPs", "HBM capacity per chip (GiB) 95", "HBM bandwidth per chip (GBps)
            # 2765"; the page gives FP8 (459 TFLOPs), no int8 figure
            hbm_bytes=95 * GiB,
            peak_bf16_flops=459e12,
            peak_int8_ops=None,
            hbm_bandwidth=2765e9,
            devices_per_chip=1,
            slice_unit="cores",
            # same page, "Configurations": 2x2x1 is 8 cores (v5p-8) ... 8x16x16 is 4096
            slices={8: "2x2x1", 16: "2x2x2", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8",
                    1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"},
            source="https://cloud.google.com/tpu/docs/v5p",
            chips_per_host=(2, 2, 1),  # same page: 2x2x1 is one host
            # same page: "Bidirectional inter-chip interconnect (ICI) bandwidth per chip (GBps) 1200"
            ici_bandwidth=1200e9,
            # https://jax-ml.github.io/scaling-book/tpus/ ("How to Scale Your Model", part 2):
            # "PCIe bandwidth is typically around 1.5e10 bytes / second per chip"; the Cloud TPU
            # pages publish no host-link figure
            host_bandwidth=1.5e10,
        ),
        Generation(
            "v6e",
            # https://cloud.google.com/tpu/docs/v6e : "Peak compute per chip (bf16) 918
            # TFLOPs", "Peak compute per chip (Int8) 1836 TOPs", "HBM capacity per chip
            # 32 GB", "HBM bandwidth per chip 1640 GBps". The compiler's limit for one
            # chip, 31.24 GiB usable, shows the 32 are GiB.
            hbm_bytes=32 * GiB,
            peak_bf16_flops=918e12,
            peak_int8_ops=1836e12,
            hbm_bandwidth=1640e9,
            devices_per_chip=1,
            slice_unit="chips",
            # same page, "Supported configurations": v6e-1 (1x1) ... v6e-256 (16x16)
            slices={1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
            source="https://cloud.google.com/tpu/docs/v6e",
            chips_per_host=(2, 4, 1),  # same page: "Chips per host 8"
            # same page: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip) 800 GBps"
            ici_bandwidth=800e9,
            # https://jax-ml.github.io/scaling-book/tpus/: "Trillium (TPU v6e) has 32GB/s, about 2x
            # higher than v5" (the page's footnote to its PCIe figure)
            host_bandwidth=32e9,
        ),
    )
}

_ALIASES = {alias: g.name for g in GENERATIONS.values() for alias in (g.name, *g.aliases)}


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A TPU slice to compile for.

    Attributes:
        generation: the chip generation.
        name: the spec in Cloud TPU's accelerator-type form where one exists
            (``"v5e-8"``), else the topology.
        topology: the name XLA's TPU compiler takes (``"v5e:2x4"``).
        chips: chips in the slice.
    """

    generation: Generation
    name: str
    topology: str
    chips: int

    @property
    def devices(self) -> int:
        """JAX devices the compiler sees (chips, or TensorCores on v4)."""
        return self.chips * self.generation.devices_per_chip

    @property
    def device_kind(self) -> str:
        """What one device of the figures is: a chip, or on v4 one of its two TensorCores
        (the deviceless compiler's v4 device; a v4 TPU VM's JAX shows one megacore device
        per chip, with both cores: twice the HBM and the peak)."""
        if self.generation.devices_per_chip == 1:
            return "chip"
        return (f"TensorCore, 1/{self.generation.devices_per_chip} chip (a {self.generation.name} VM's JAX "
                f"shows one megacore device per chip: {self.generation.devices_per_chip}x HBM and peak)")

    @property
    def spec_hbm_bytes_per_device(self) -> int:
        """HBM one device has by the spec sheet (the chip's share per device)."""
        return self.generation.hbm_bytes // self.generation.devices_per_chip

    @property
    def peak_bf16_flops_per_device(self) -> float:
        return self.generation.peak_bf16_flops / self.generation.devices_per_chip

    @property
    def peak_int8_ops_per_device(self) -> float | None:
        peak = self.generation.peak_int8_ops
        return None if peak is None else peak / self.generation.devices_per_chip

    @property
    def hbm_bandwidth_per_device(self) -> float:
        return self.generation.hbm_bandwidth / self.generation.devices_per_chip

    @property
    def host_bandwidth_per_device(self) -> float:
        """Bytes/s one device's copies to or from the host move at the most (a chip's PCIe
        link, shared by the chip's devices on v4)."""
        return self.generation.host_bandwidth / self.generation.devices_per_chip

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """The chips of one host in this slice: the generation's host, or the whole slice
        when it is smaller than one (a v5e-1 is one chip of a host)."""
        dims = tuple(int(d) for d in self.topology.split(":")[1].split("x"))
        dims = (*dims, *(1,) * (3 - len(dims)))
        host = self.generation.chips_per_host
        if all(d % h == 0 for d, h in zip(dims, host)):
            return host
        return dims

    def __str__(self) -> str:
        return self.name


def _accepted() -> str:
    parts = []
    for g in GENERATIONS.values():
        sizes = ", ".join(map(str, g.slices))
        parts.append(f"{g.name}-N with N {g.slice_unit} in {{{sizes}}}")
    return (
        f"use a generation ({', '.join(GENERATIONS)}) for one chip, " + "; ".join(parts)
        + ", or a topology such as v5e:2x4 or v5p:2x2x1"
    )


_SPEC = re.compile(r"^(?P<gen>[a-z0-9]+?)(?:-(?P<count>\d+))?$")
_TOPOLOGY = re.compile(r"^(?P<gen>[a-z0-9]+):(?P<dims>\d+(?:x\d+)+)$")


def parse_target(spec: str | Target) -> Target:
    """The target a spec names.

    Args:
        spec: ``"v5e"`` (one chip), a Cloud TPU accelerator type (``"v5e-8"``,
            ``"v5litepod-8"``, ``"v6e-4"``, ``"v5p-8"``, ``"v4-8"``), or a topology
            (``"v5e:2x4"``). A ``Target`` is returned as it is.

    Returns:
        The ``Target``, with the topology name XLA's TPU compiler accepts.

    Raises:
        TargetSpecError: the spec names no known generation or slice; the
            message lists what is accepted.

    Example:
        >>> parse_target("v5e-8").topology
        'v5e:2x4'
    """
    if isinstance(spec, Target):
        return spec
    if not isinstance(spec, str):
        raise TargetSpecError(f"a TPU target is a string such as 'v5e-8', not {type(spec).__name__} {spec!r}")
    text = spec.strip().lower()
    m = _TOPOLOGY.match(text)
    if m:
        gen = GENERATIONS.get(_ALIASES.get(m["gen"], ""))
        dims = m["dims"]
        if gen is None or len(dims.split("x")) != len(gen.single_chip_topology.split("x")):
            raise TargetSpecError(f"unknown TPU topology {spec!r}: {_accepted()}")
        chips = math.prod(int(d) for d in dims.split("x"))
        if chips == 0:
            raise TargetSpecError(f"TPU topology {spec!r} has no chips: {_accepted()}")
        name = next((f"{gen.name}-{n}" for n, t in gen.slices.items() if t == dims), f"{gen.name}:{dims}")
        return Target(gen, name, f"{gen.name}:{dims}", chips)
    m = _SPEC.match(text)
    gen = GENERATIONS.get(_ALIASES.get(m["gen"], "")) if m else None
    if gen is None:
        raise TargetSpecError(f"unknown TPU target {spec!r}: {_accepted()}")
    if m["count"] is None:
        return Target(gen, gen.name, f"{gen.name}:{gen.single_chip_topology}", 1)
    count = int(m["count"])
    dims = gen.slices.get(count)
    if dims is None:
        raise TargetSpecError(
            f"unknown TPU slice {spec!r}: {gen.name}-N counts {gen.slice_unit}, N one of "
            f"{', '.join(map(str, gen.slices))} (or {gen.name} for one chip, or a topology "
            f"such as {gen.name}:{next(iter(gen.slices.values()))})"
        )
    chips = math.prod(int(d) for d in dims.split("x"))
    return Target(gen, f"{gen.name}-{count}", f"{gen.name}:{dims}", chips)
