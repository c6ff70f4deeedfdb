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
import re

from tpu_debug.core.hlo_text import array, matmul_flops, scan

__all__ = ["PASSES", "DotFlops", "dot_flops"]

PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}

_PRECISION = re.compile(r"operand_precision=\{([a-z_,]+)\}")
# a dot may name its algorithm instead of a precision: the bf16 ones say their passes
_ALGORITHM = re.compile(r"algorithm=dot_(bf16_bf16_f32(?:_x\d)?)\b")
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


def _precision(attrs: str) -> str:
    m = _ALGORITHM.search(attrs)
    if m is not None:
        return _BY_ALGORITHM.get(m.group(1), "DEFAULT")
    m = _PRECISION.search(attrs)
    if m is None:
        return "DEFAULT"
    named = [q.upper() for q in m.group(1).split(",")]
    return max((q if q in PASSES else "DEFAULT" for q in named), key=PASSES.__getitem__)


def dot_flops(hlo: str) -> DotFlops:
    """The dots (``dot``, ``convolution``) of an optimized HLO module, by operand type and precision."""
    by_precision: dict[str, float] = {}
    other = 0.0
    computations, _ = scan(hlo)
    for body in computations.values():
        for ins in body.values():
            if ins.opcode not in ("dot", "convolution") or len(ins.operands) != 2:
                continue
            operands = [body.get(name) for name in ins.operands]
            types = [array(o.shape) if o is not None else None for o in operands]
            flops = matmul_flops(ins, body)
            if flops is None or None in types:
                continue
            if "f32" in (types[0][0], types[1][0]):
                precision = _precision(ins.attributes)
                by_precision[precision] = by_precision.get(precision, 0.0) + flops
            else:
                other += flops
    return DotFlops(by_precision, other)
