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
import math
import re

__all__ = ["PASSES", "DotFlops", "dot_flops"]

PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"^([a-z][a-z0-9]*)\[([\d,]*)\]")
_PRECISION = re.compile(r"operand_precision=\{([a-z_,]+)\}")
_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_NAME = re.compile(r"%([\w.\-]+)")
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


def _array(type_text: str) -> tuple[str, tuple[int, ...]] | None:
    m = _ARRAY.match(type_text.strip())
    if m is None:
        return None
    return m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)


def _operand_names(rest: str) -> list[str]:
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return _NAME.findall(rest[:i])
            depth -= 1
    return []


def _precision(attrs: str) -> str:
    m = _ALGORITHM.search(attrs)
    if m is not None:
        return _BY_ALGORITHM.get(m.group(1), "DEFAULT")
    m = _PRECISION.search(attrs)
    if m is None:
        return "DEFAULT"
    named = [q.upper() for q in m.group(1).split(",")]
    return max((q if q in PASSES else "DEFAULT" for q in named), key=PASSES.__getitem__)


def _flops(opcode: str, out: tuple[int, ...], lhs: tuple[int, ...], rhs: tuple[int, ...], attrs: str) -> float:
    if opcode == "convolution":
        m = _LABELS.search(attrs)
        if m is None:
            return 0.0
        kernel = m.group(2)
        window = math.prod(d for d, label in zip(rhs, kernel) if label != "o")
        return 2.0 * math.prod(out) * window
    m = _CONTRACTING.search(attrs)
    dims = [int(d) for d in m.group(1).split(",") if d] if m else []
    return 2.0 * math.prod(out) * math.prod(lhs[d] for d in dims)


def dot_flops(hlo: str) -> DotFlops:
    """The dots (``dot``, ``convolution``) of an optimized HLO module, by operand type and precision."""
    by_precision: dict[str, float] = {}
    other = 0.0
    types: dict[str, str] = {}
    for line in hlo.splitlines():
        if _COMPUTATION.match(line):
            types = {}
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, type_text, opcode, rest = m.groups()
        types[name] = type_text
        if opcode not in ("dot", "convolution"):
            continue
        operands = [_array(types.get(n, "")) for n in _operand_names(rest)]
        out = _array(type_text)
        if out is None or len(operands) != 2 or None in operands:
            continue
        (lt, lhs), (rt, rhs) = operands
        flops = _flops(opcode, out[1], lhs, rhs, rest)
        if "f32" in (lt, rt):
            precision = _precision(rest)
            by_precision[precision] = by_precision.get(precision, 0.0) + flops
        else:
            other += flops
    return DotFlops(by_precision, other)
