"""Reading an optimized HLO module's text: its computations and instructions, and the
flops of its matmuls (``dot`` and ``convolution``).

Text only, standard library only: the roofline's precision passes
(``tpu_debug.runtime.target.precision``) and the target tracer's padding waste
(``tpu_debug.tracers.target``), which the reading verbs load without torch or jax,
both read HLO through it.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["Instruction", "array", "called", "matmul_flops", "scan"]


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"^([a-z][a-z0-9]*)\[([<=\d,]*)\](\{[^{}]*\})?$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\bcalls=(\{[^}]*\}|%[\w.\-]+)")
_DIMS = re.compile(r"\b(lhs_contracting_dims)=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"\bdim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_WINDOW_SIZE = re.compile(r"\bwindow=\{[^}]*?\bsize=([\dx]+)")
_GROUPS = re.compile(r"\bfeature_group_count=(\d+)")


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    name: str
    shape: str  # the result's shape text: "f32[64,100]{1,0:T(8,128)}" or a tuple
    opcode: str
    operands: tuple[str, ...]
    attributes: str


def _split_call(rest: str) -> tuple[str, str]:
    """``rest`` is what follows ``opcode(``: (the operands, the attributes after them)."""
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1 :]
    return rest, ""


def scan(hlo: str) -> tuple[dict[str, dict[str, Instruction]], str | None]:
    """The instructions of each computation of an HLO module's text, and the entry's name."""
    computations: dict[str, dict[str, Instruction]] = {}
    current: dict[str, Instruction] | None = None
    entry = None
    for line in hlo.splitlines():
        if not line:
            continue
        if line[0] not in " \t":
            m = _COMPUTATION.match(line)
            if m:
                current = computations.setdefault(m.group(2), {})
                if m.group(1):
                    entry = m.group(2)
            elif line.startswith("}"):
                current = None
            continue
        if current is None:
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        operands, attributes = _split_call(m.group(4))
        current[m.group(1)] = Instruction(
            m.group(1), m.group(2), m.group(3), tuple(_OPERAND.findall(operands)), attributes
        )
    return computations, entry


def array(shape_text: str) -> tuple[str, tuple[int, ...], str | None] | None:
    m = _ARRAY.match(shape_text.strip())
    if m is None:
        return None
    dims = tuple(int(d.lstrip("<=")) for d in m.group(2).split(",") if d)
    return m.group(1), dims, m.group(3)


def matmul_flops(ins: Instruction, computation: dict[str, Instruction]) -> float | None:
    """2 x output elements x contracted elements of a ``dot`` or ``convolution``."""
    out = array(ins.shape)
    lhs = computation.get(ins.operands[0]) if ins.operands else None
    lhs_array = array(lhs.shape) if lhs is not None else None
    if out is None or lhs_array is None:
        return None
    out_elements = math.prod(out[1])
    lhs_dims = lhs_array[1]
    if ins.opcode == "dot":
        m = _DIMS.search(ins.attributes)
        contracted = [int(d) for d in m.group(2).split(",") if d] if m else []
        k = math.prod(lhs_dims[d] for d in contracted if d < len(lhs_dims))
        return 2.0 * out_elements * k
    labels = _DIM_LABELS.search(ins.attributes)
    if labels is None or "f" not in labels.group(1):
        return None
    position = labels.group(1).index("f")
    if position >= len(lhs_dims):
        return None
    window = _WINDOW_SIZE.search(ins.attributes)
    taps = math.prod(int(s) for s in window.group(1).split("x")) if window else 1
    groups = _GROUPS.search(ins.attributes)
    features = lhs_dims[position] // (int(groups.group(1)) if groups else 1)
    return 2.0 * out_elements * features * taps


def called(ins: Instruction) -> list[str]:
    m = _CALLS.search(ins.attributes)
    return _OPERAND.findall(m.group(1)) if m else []
