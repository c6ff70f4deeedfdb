"""The collectives of a compiled XLA program, read from its optimized HLO text.

XLA's SPMD partitioner turns a program over sharded inputs into one program per
device plus the collectives the layout needs: ``all-reduce`` (sum partial
results), ``all-gather`` (rebuild a sharded value), ``reduce-scatter``,
``all-to-all`` (reshard) and ``collective-permute`` (shift between neighbours).
They appear in the optimized HLO as instructions with their result shape,
``replica_groups`` (which devices talk together) and ``metadata``: the named
scope of the op that caused them (``op_name="jit(fn)/mm_1|aten::mm.default/dot_general"``:
FX node ``mm_1`` of a compiled graph, or ``aten::mm`` for an eager op) and a
``stack_frame_id`` into the module's stack-frame tables (the Python stack that
traced it).

This module reads the collectives through the one HLO reader (``core/hlo_text.py``),
shared by the runtime (ranks compare the collectives they are about to run) and the
tracers (which record them); it imports neither torch nor jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tpu_debug.core.collective_kinds import HLO_OPCODES, of_opcode
from tpu_debug.core.hlo_text import Instruction, Module, module_devices, parse_module

__all__ = [
    "COLLECTIVE_OPCODES",
    "Collective",
    "module_devices",
    "parse_collectives",
]

# the opcodes of collectives (an asynchronous pair counts once, at its "-start"), declared
# with the rest of each kind in core/collective_kinds.py
COLLECTIVE_OPCODES = HLO_OPCODES


@dataclasses.dataclass(frozen=True, slots=True)
class Collective:
    """One collective instruction of a compiled program.

    Attributes:
        opcode: ``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"``,
            ``"all-to-all"``, ``"collective-permute"``, ...
        instruction: its name in the HLO module.
        shape: its result as XLA prints it (``f32[8,16]``; a tuple when XLA combined
            several collectives into one).
        nbytes: the data one device contributes or receives, whichever is larger
            (an all-reduce's buffer, an all-gather's gathered result, a
            reduce-scatter's input).
        wire_bytes: bytes each device sends over the interconnect with ring
            algorithms (an estimate: an all-reduce of S bytes over n devices sends
            2(n-1)/n S, an all-gather or reduce-scatter (n-1)/n S).
        group_size: devices in each group that communicates.
        groups: how many such groups run side by side.
        replica_groups: the groups as XLA prints them.
        scope: the named scope from the instruction's metadata (``op_name``).
        node: the FX node of a compiled graph that caused it (``""`` if none; several,
            comma-separated, when XLA combined their collectives into one).
        op: the aten op that caused it (``"aten::mm.default"``; ``""`` if unknown).
        asynchronous: XLA split it into a start/done pair to overlap it with compute.
        file, line, function: the user source line, when known.
    """

    opcode: str
    instruction: str
    shape: str
    nbytes: int
    wire_bytes: int
    group_size: int
    groups: int
    replica_groups: str
    scope: str
    node: str
    op: str
    asynchronous: bool = False
    file: str | None = None
    line: int | None = None
    function: str | None = None

    @property
    def location(self) -> str:
        """``file:line`` of the user code that caused it (``"-"`` when unknown)."""
        return f"{self.file}:{self.line}" if self.file else "-"

    def describe(self) -> str:
        """``all-reduce f32[8,16] over 4 devices x2 groups``."""
        groups = f" x{self.groups} groups" if self.groups > 1 else ""
        return f"{self.opcode} {self.shape} over {self.group_size} devices{groups}"


def _groups(ins: Instruction, devices: int) -> tuple[str, int, int]:
    """(replica groups as printed, group size, number of groups) of a collective; a permute's
    source-target pairs count as one group of as many devices as pairs."""
    groups = ins.replica_groups
    if groups is not None:
        return groups.text, groups.size(devices), groups.count(devices)
    pairs = ins.source_target_pairs
    if pairs is not None:
        return ins.attr("source_target_pairs") or "", max(len(pairs), 1), 1
    return "", devices, 1


def _sizes(opcode: str, asynchronous: bool, sizes: list[int], group: int) -> tuple[int, int]:
    """(nbytes, wire bytes) of one collective from the byte sizes of its result's arrays."""
    kind = of_opcode(opcode)
    if not sizes or kind is None:
        return 0, 0
    if asynchronous and kind.start_returns_operand and len(sizes) > 1:
        # a start's result is (operand, result, ...): the result is the second array
        data = sizes[1]
    else:
        data = sum(sizes)
    if kind.scatters:
        data *= group  # the result is one device's slice of the reduced input
    return data, kind.wire_bytes(data, group)


def _origin(ins: Instruction, module: Module, node: str, user_file: Callable[[str], bool] | None,
            node_lines: dict[str, tuple[str, int, str]] | None) -> tuple[str | None, int | None, str | None]:
    """(file, line, function) of the user code that caused a collective: its FX node's line,
    else the innermost user frame of the stack that traced it, else its source metadata."""
    first = node.split(",", 1)[0]
    if first and node_lines and first in node_lines:
        return node_lines[first]
    meta = ins.metadata
    file, line, function = (meta.source_file, meta.source_line or None, None) if meta.source_file else (None, None, None)
    if meta.stack_frame_id and user_file is not None:
        for f, ln, fn in module.stack(meta.stack_frame_id):
            if user_file(f):
                return f, ln, fn
    return file, line, function


def parse_collectives(
    hlo: str,
    *,
    user_file: Callable[[str], bool] | None = None,
    node_lines: dict[str, tuple[str, int, str]] | None = None,
) -> tuple[Collective, ...]:
    """Every collective of an optimized HLO module (all its computations), in text order.

    Args:
        hlo: the module's text (``compiled.as_text()``).
        user_file: tells user files from library ones; a collective's line is then the
            innermost user frame of the stack that traced it.
        node_lines: FX node name -> (file, line, function) of the user code that made it;
            a collective caused by a known node takes that line first.

    Example::

        [c.describe() for c in parse_collectives(compiled.as_text())]
        # ['all-reduce f32[8,16] over 4 devices x2 groups']
    """
    module = parse_module(hlo)
    devices = module.devices
    out = []
    for ins in module.instructions():
        asynchronous = ins.opcode.endswith("-start")
        base = ins.opcode.removesuffix("-start")
        if base not in COLLECTIVE_OPCODES:
            continue
        text, size, groups = _groups(ins, devices)
        nbytes, wire = _sizes(base, asynchronous, [a.nbytes for a in ins.shape.arrays if a.nbytes is not None], size)
        scope = ins.metadata.op_name
        node, op = ins.metadata.scope
        file, line, function = _origin(ins, module, node, user_file, node_lines)
        out.append(Collective(base, ins.name, ins.shape.plain(), nbytes, wire, size, groups, text, scope, node, op,
                              asynchronous, file, line, function))
    return tuple(out)
