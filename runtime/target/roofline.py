"""A roofline model of a target compile: compute- or memory-bound, and a time estimate.

From the TPU compiler's cost analysis (flops and bytes accessed, per device)
and the target's published peaks (``hardware.GENERATIONS``):
arithmetic intensity = flops / bytes; the program is compute-bound when its
intensity is above the ridge point (peak FLOP/s / HBM bytes/s), and takes at
least max(flops / peak, bytes / bandwidth), where a float32 dot's flops count
once per bf16 pass its precision takes (``precision``: DEFAULT 1, HIGH 3,
HIGHEST 6; the compiler's count is one). A model estimate, not a
measurement: it assumes perfect overlap, peak matrix-unit rate for every flop
and full HBM bandwidth. The compiler's own estimate (``optimal_seconds``, its
TPU cost model) is carried beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tpu_debug.core.collective_kinds import LINK_OPCODES
from tpu_debug.core.format import format_seconds
from tpu_debug.core.hlo_text import matmul_flops, parse_module
from tpu_debug.runtime.target.errors import TargetError
from tpu_debug.runtime.target.hardware import Target
from tpu_debug.runtime.target.precision import PASSES, dot_flops, dot_passes
from tpu_debug.runtime.target.results import CostStats, TargetCompile

__all__ = ["MODEL_NOTE", "OpByOp", "Roofline", "op_by_op", "roofline"]

MODEL_NOTE = ("model estimate: max(flops x bf16 passes / peak, bytes / HBM bandwidth), published peaks, "
              "TPU compiler's cost analysis; not a measurement")


@dataclasses.dataclass(frozen=True, slots=True)
class Roofline:
    """One program on one target device, in the roofline model.

    Attributes:
        target: the slice (figures are per device).
        flops: floating-point operations per device (the compiler's count).
        bytes_accessed: bytes read and written per device (the compiler's count).
        peak_flops: the device's peak rate for ``precision``.
        bandwidth: the device's HBM bytes/s.
        precision: ``"bf16"`` or ``"int8"``: which peak applies.
        xla_seconds: the compiler's own time estimate, when it gives one.
        dot_precisions: ``(("HIGHEST", flops), ...)``: the flops of the dots with
            float32 operands, by precision (empty when no HLO was given: one pass each).
    """

    target: Target
    flops: float
    bytes_accessed: float
    peak_flops: float
    bandwidth: float
    precision: str = "bf16"
    xla_seconds: float | None = None
    note: str = MODEL_NOTE
    dot_precisions: tuple[tuple[str, float], ...] = ()

    @property
    def pass_flops(self) -> float:
        """The flops the matrix units run: each float32 dot's once per bf16 pass."""
        return self.flops + sum((PASSES[p] - 1) * f for p, f in self.dot_precisions)

    @property
    def mfu(self) -> float:
        """Model flops utilization at the estimated time: flops / (seconds * peak)."""
        return self.flops / (self.seconds * self.peak_flops) if self.seconds > 0 else 0.0

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, flops per byte accessed."""
        return self.flops / self.bytes_accessed if self.bytes_accessed else float("inf")

    @property
    def ridge(self) -> float:
        """The intensity above which the device's compute, not its HBM, is the limit."""
        return self.peak_flops / self.bandwidth

    @property
    def compute_seconds(self) -> float:
        return self.pass_flops / self.peak_flops

    @property
    def memory_seconds(self) -> float:
        return self.bytes_accessed / self.bandwidth

    @property
    def seconds(self) -> float:
        """The model's lower bound on the run time: max(compute, memory)."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``."""
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    def render(self) -> str:
        xla = f"; the compiler's own estimate {format_seconds(self.xla_seconds)}" if self.xla_seconds else ""
        dots = "".join(f", float32 dots {f:.3g} FLOP at {p} ({PASSES[p]} bf16 pass{'es' * (PASSES[p] > 1)})"
                       for p, f in self.dot_precisions)
        return (
            f"{self.target.name} per {self.target.device_kind}: {self.flops:.3g} FLOP{dots}, {self.bytes_accessed:.3g} B accessed, "
            f"{self.intensity:.1f} FLOP/B (ridge {self.ridge:.0f}): {self.bound}-bound, "
            f"~{format_seconds(self.seconds)} ({self.note}{xla})"
        )

def roofline(result: TargetCompile | CostStats, target: Target | None = None, *,
             precision: str = "bf16", hlo: str | None = None) -> Roofline:
    """Place a compiled program on its target's roofline.

    Args:
        result: a successful ``TargetCompile`` (its target is used), or a
            ``CostStats`` with ``target`` given.
        target: the target, when ``result`` is a ``CostStats``.
        precision: ``"bf16"`` (the matrix units' bfloat16 peak; float32 matmuls
            run there too, in as many passes as their precision takes) or ``"int8"``.
        hlo: the optimized TPU HLO, read for the float32 dots' precisions (a
            ``TargetCompile``'s own is used when this is None).

    Returns:
        A ``Roofline`` (figures per device).

    Raises:
        TargetError: the compile failed, no target is given, the precision is
            unknown, or the generation publishes no int8 peak.

    Example::

        roofline(compile_for_target(f, args, "v6e")).bound
        # 'compute'
    """
    if isinstance(result, TargetCompile):
        if result.cost is None:
            raise TargetError(f"{result.program} did not compile for {result.target.name}: no cost to model")
        cost, tgt = result.cost, result.target
        hlo = result.hlo if hlo is None else hlo
    else:
        if target is None:
            raise TargetError("roofline(CostStats) needs the target it was compiled for")
        cost, tgt = result, target
    if precision == "bf16":
        peak = tgt.peak_bf16_flops_per_device
    elif precision == "int8":
        peak = tgt.peak_int8_ops_per_device
        if peak is None:
            raise TargetError(
                f"{tgt.generation.name} publishes no int8 peak ({tgt.generation.source}); use 'bf16'"
            )
    else:
        raise TargetError(f"precision {precision!r} is not one of 'bf16', 'int8'")
    dots = tuple(sorted(dot_flops(hlo).by_precision.items())) if hlo and precision == "bf16" else ()
    return Roofline(tgt, cost.flops, cost.bytes_accessed, peak, tgt.hbm_bandwidth_per_device, precision,
                    cost.optimal_seconds, dot_precisions=dots)


# what occupies no time of its own on the roofline (views, tuples, the halves of async pairs
# whose start is counted); the collectives and transfers (LINK_OPCODES) are timed on the ICI
# by the caller
_FREE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
    "replica-id", "opt-barrier", "copy-done", "async-done", "send-done", "recv-done",
})


@dataclasses.dataclass(frozen=True, slots=True)
class OpByOp:
    """A program's ops on the roofline one after another (per device): each op takes the longer
    of its flops at the peak and its HBM bytes at the bandwidth, and the next starts when it
    ends. ``compute_seconds`` adds up the ops bound by their flops, ``memory_seconds`` those
    bound by their bytes, ``kernel_seconds`` the custom calls (Pallas kernels), ``ops`` counts
    the op runs (a loop body's once per trip)."""

    compute_seconds: float
    memory_seconds: float
    kernel_seconds: float
    ops: int

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.memory_seconds + self.kernel_seconds


def _hbm_bytes(shape: Any) -> int:
    # HBM is a TPU layout's default memory space; S(1) is on-chip memory the compiler stages
    # arrays in (its copy-start reads them from HBM), S(5) pinned host memory
    return sum(a.nbytes or 0 for a in shape.arrays if a.layout is None or a.layout.memory_space == 0)


def _fused_flops(module: Any, name: str) -> float:
    """The matrix units' flops of computation ``name`` and the fusions it calls: each dot's
    2*m*n*k once per bf16 pass of its precision."""
    body = module.computation(name)
    if body is None:
        return 0.0
    flops = 0.0
    for ins in body.instructions:
        if ins.opcode in ("dot", "convolution"):
            flops += (matmul_flops(ins, body) or 0.0) * dot_passes(ins, body)
        elif ins.opcode == "fusion":
            flops += sum(_fused_flops(module, called) for called in ins.called)
    return flops


def op_by_op(hlo: str, target: Target, repeats: Mapping[str, int] | None = None,
             kernel_flops: Callable[[Any, Any], float | None] | None = None) -> OpByOp:
    """The ops of an optimized TPU program one after another on the target's roofline.

    A tighter model than :func:`roofline`'s, which lets all of a program's bytes overlap all
    of its flops: an op whose bytes bound it cannot lend its matrix units to the next op. Still
    a model: every flop at the peak, every byte at the HBM bandwidth, no launch gaps.
    Flops are the dots' (2*m*n*k, once per bf16 pass of a float32 dot's precision), bytes each
    op's operands and results in HBM, both read from the program's text. Collectives are left
    out (time them on the ICI), and so are copies to and from host memory (the link's rate is
    not published).

    Args:
        hlo: the optimized HLO text.
        target: the target it was compiled for (per-device peak and bandwidth).
        repeats: instruction name -> runs per program run, for loop bodies (the compiler's cost
            analysis and this text count a body once); others run once.
        kernel_flops: ``(instruction, computation) -> flops`` of a custom call (a Pallas kernel,
            whose flops no cost analysis counts); None or a None result: its bytes only.

    Returns:
        The :class:`OpByOp` sums.

    Example::

        op_by_op(result.hlo, result.target).seconds
    """
    module = parse_module(hlo)
    entry = module.entry
    if entry is None:
        return OpByOp(0.0, 0.0, 0.0, 0)
    peak, bandwidth = target.peak_bf16_flops_per_device, target.hbm_bandwidth_per_device
    sums = {"compute": 0.0, "memory": 0.0, "kernel": 0.0}
    runs = 0
    todo, seen = [entry.name], set()
    while todo:  # the program's own computations: the entry, loop bodies, called computations
        name = todo.pop()
        body = module.computation(name)
        if body is None or name in seen:
            continue
        seen.add(name)
        for ins in body.instructions:
            if ins.opcode in ("while", "call", "conditional", "async-start"):
                todo.extend(ins.called)
                continue
            if ins.opcode in _FREE or ins.opcode.removesuffix("-start").removesuffix("-done") in LINK_OPCODES:
                continue
            if ins.opcode == "fusion":
                flops = sum(_fused_flops(module, called) for called in ins.called)
            elif ins.opcode in ("dot", "convolution"):
                flops = (matmul_flops(ins, body) or 0.0) * dot_passes(ins, body)
            elif ins.opcode == "custom-call" and kernel_flops is not None:
                flops = kernel_flops(ins, body) or 0.0
            else:
                flops = 0.0
            # an async copy's result holds its source again: it reads what it copies
            own = 0 if ins.opcode == "copy-start" else _hbm_bytes(ins.shape)
            nbytes = own + sum(_hbm_bytes(o.shape) for o in map(body.get, ins.operands) if o is not None)
            times = (repeats or {}).get(ins.name, 1)
            runs += times
            compute, memory = flops / peak, nbytes / bandwidth
            kind = "kernel" if ins.opcode == "custom-call" else ("compute" if compute >= memory else "memory")
            sums[kind] += max(compute, memory) * times
    return OpByOp(sums["compute"], sums["memory"], sums["kernel"], runs)
