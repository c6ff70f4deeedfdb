"""Matrix-unit passes of a TPU program's dots, read from its optimized HLO.

The TPU's matrix units multiply bfloat16. A float32 dot is run as several bf16
products, by its precision (XLA's ``operand_precision``): ``DEFAULT`` rounds the
operands to bf16 (one pass), ``HIGH`` splits each into two bf16 parts (three
passes, XLA's BF16_BF16_F32_X3), ``HIGHEST`` into three (six passes,
BF16_BF16_F32_X6; the TPU compiler's code for it is identical). The compiler's
cost analysis counts a dot's 2*m*n*k flops at every precision, so the time of
a compute-bound float32 product is the passes times that. A dot whose operands
are not float32 (bf16, int8) is one pass at any precision.

Each dot is counted once per place it appears in the HLO text: a dot in a loop
body is counted once, not once per iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_debug.core.hlo_text import Instruction, matmul_flops, parse_module

__all__ = ["PASSES", "DotFlops", "dot_flops", "dot_passes"]

PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}

# a dot may name its algorithm instead of a precision: the bf16 ones say their passes
_BY_ALGORITHM = {"bf16_bf16_f32": "DEFAULT", "bf16_bf16_f32_x3": "HIGH", "bf16_bf16_f32_x6": "HIGHEST"}


@dataclasses.dataclass(frozen=True, slots=True)
class DotFlops:
    """The float32 dots' flops of a program by precision, and the bf16 passes they take.

    Attributes:
        by_precision: ``{"HIGHEST": flops, ...}`` for the dots with float32 operands
            (2*m*n*k each, as the compiler's cost analysis counts them).
        other: flops of the dots with operands of other types (one pass each).
    """

    by_precision: dict[str, float]
    other: float = 0.0

    @property
    def extra_pass_flops(self) -> float:
        """The flops the passes after the first add: sum of (passes - 1) * flops."""
        return sum((PASSES[p] - 1) * f for p, f in self.by_precision.items())

    @property
    def precision(self) -> str | None:
        """The float32 dots' precision when they share one (the one with most flops otherwise)."""
        if not self.by_precision:
            return None
        return max(self.by_precision, key=lambda p: self.by_precision[p])


def _precision(ins: Instruction) -> str:
    algorithm = (ins.attr("algorithm") or "").removeprefix("dot_")
    if algorithm in _BY_ALGORITHM:
        return _BY_ALGORITHM[algorithm]
    named = [q.strip().upper() for q in (ins.attr("operand_precision") or "").strip("{}").split(",") if q.strip()]
    if not named:
        return "DEFAULT"
    return max((q if q in PASSES else "DEFAULT" for q in named), key=PASSES.__getitem__)


def dot_passes(ins: Instruction, computation: Any) -> int:
    """The bf16 passes a ``dot`` or ``convolution`` of ``computation`` takes: by its precision
    when an operand is float32, else one."""
    operands = [computation.get(name) for name in ins.operands[:2]]
    types = [o.shape.array.dtype if o is not None and o.shape.array is not None else "" for o in operands]
    return PASSES[_precision(ins)] if "f32" in types else 1


def dot_flops(hlo: str) -> DotFlops:
    """The dots (``dot``, ``convolution``) of an optimized HLO module, by operand type and precision."""
    by_precision: dict[str, float] = {}
    other = 0.0
    for body in parse_module(hlo).computations:
        for ins in body.instructions:
            if ins.opcode not in ("dot", "convolution") or len(ins.operands) != 2:
                continue
            operands = [body.get(name) for name in ins.operands]
            types = [o.shape.array if o is not None else None for o in operands]
            flops = matmul_flops(ins, body)
            if flops is None or None in types:
                continue
            if "f32" in (types[0].dtype, types[1].dtype):
                precision = _precision(ins)
                by_precision[precision] = by_precision.get(precision, 0.0) + flops
            else:
                other += flops
    return DotFlops(by_precision, other)
