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

This module is plain text processing, shared by the runtime (ranks compare the
collectives they are about to run) and the tracers (which record them); it
imports neither torch nor jax.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from tpu_debug.core.collective_kinds import HLO_OPCODES, of_opcode

__all__ = [
    "COLLECTIVE_OPCODES",
    "Collective",
    "parse_collectives",
    "shape_bytes",
    "stack_frames",
    "module_devices",
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


_ELEMENT_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
    "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8, "f8e4m3": 8,
    "f8e3m4": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def shape_bytes(shape: str) -> list[int]:
    """The byte size of each array in an HLO shape text (one for an array, several for a tuple)."""
    sizes = []
    for dtype, dims in _ARRAY.findall(shape):
        bits = _ELEMENT_BITS.get(dtype)
        if bits is None:
            continue
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        sizes.append((n * bits + 7) // 8)
    return sizes


_INSTRUCTION = re.compile(
    r"^\s+(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s(?P<opcode>[a-z][\w\-]*)\((?P<rest>.*)$"
)
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SOURCE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"\s+source_line=(\d+)')
_NUM = re.compile(r"\b(num_partitions|replica_count)=(\d+)")


def module_devices(hlo: str) -> int:
    """Devices the module runs on: its partitions times its replicas (1 for a one-device program)."""
    found = {k: int(v) for k, v in _NUM.findall(hlo.split("\n", 1)[0])}
    return found.get("num_partitions", 1) * found.get("replica_count", 1)


def _braced(text: str, start: int) -> str:
    """The balanced ``{...}`` group of ``text`` beginning at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return text[start:]


_IOTA = re.compile(r"^\[([0-9,]+)\]<=\[[0-9,]+\](?:T\([0-9,]+\))?")
_MESH = re.compile(r"^mesh\[([^\]]*)\]\s*(\{[^}]*\})")


def _groups(attrs: str, devices: int) -> tuple[str, int, int]:
    """(replica groups as printed, group size, number of groups) of an instruction's attributes."""
    at = attrs.find("replica_groups=")
    if at < 0:
        pairs = attrs.find("source_target_pairs=")
        if pairs >= 0:
            text = _braced(attrs, pairs + len("source_target_pairs="))
            n = text.count("{") - 1
            return text, max(n, 1), 1
        return "", devices, 1
    text = attrs[at + len("replica_groups=") :]
    if text.startswith("{"):
        text = _braced(text, 0)
        inner = re.findall(r"\{([0-9,\s]*)\}", text[1:-1]) if len(text) > 2 else []
        if not inner:  # {}: one group of every device
            return text, devices, 1
        size = len([x for x in inner[0].split(",") if x.strip()])
        return text, max(size, 1), len(inner)
    m = _IOTA.match(text)
    if m:  # [groups,size]<=[devices]: an iota reshaped
        dims = [int(x) for x in m.group(1).split(",")]
        size = dims[-1]
        return m.group(0), size, math.prod(dims[:-1]) if len(dims) > 1 else 1
    m = _MESH.match(text)
    if m:  # mesh['a'=2,'b'=4] {'a'}: groups along the named mesh axes
        axes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        listed = re.findall(r"'([^']+)'", m.group(2))
        size = math.prod(axes.get(a, 1) for a in listed) if listed else math.prod(axes.values())
        total = math.prod(axes.values()) if axes else devices
        return m.group(0), size, max(total // max(size, 1), 1)
    return text.split(",", 1)[0], devices, 1


def stack_frames(hlo: str) -> Callable[[int], list[tuple[str, int, str]]]:
    """A function giving a ``stack_frame_id``'s Python stack, innermost frame first, as
    (file, line, function), from the module's ``FileNames``/``FunctionNames``/
    ``FileLocations``/``StackFrames`` tables.

    A frame's ``parent_frame_id`` is printed one above the parent's own id (0, printed
    as 1, is the root's "no parent"), as jaxlib 0.10 prints it.
    """
    files: dict[int, str] = {}
    functions: dict[int, str] = {}
    locations: dict[int, tuple[int, int, int]] = {}
    frames: dict[int, tuple[int, int]] = {}
    table = None
    for line in hlo.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = line
            continue
        if not line or line.startswith(("%", "ENTRY", "HloModule")):
            if line.startswith(("%", "ENTRY")):
                break  # the tables come before the computations
            table = None if not line else table
            continue
        head, _, rest = line.partition(" ")
        if not head.isdigit():
            continue
        key = int(head)
        if table == "FileNames":
            files[key] = rest.strip().strip('"')
        elif table == "FunctionNames":
            functions[key] = rest.strip().strip('"')
        elif table == "FileLocations":
            vals = dict(re.findall(r"(\w+)=(-?\d+)", rest))
            locations[key] = (int(vals.get("file_name_id", 0)), int(vals.get("function_name_id", 0)),
                              int(vals.get("line", 0)))
        elif table == "StackFrames":
            vals = dict(re.findall(r"(\w+)=(-?\d+)", rest))
            frames[key] = (int(vals.get("file_location_id", 0)), int(vals.get("parent_frame_id", 0)))

    def stack(frame_id: int) -> list[tuple[str, int, str]]:
        out = []
        seen = set()
        while frame_id in frames and frame_id not in seen:
            seen.add(frame_id)
            loc_id, parent = frames[frame_id]
            loc = locations.get(loc_id)
            if loc is not None:
                out.append((files.get(loc[0], "?"), loc[2], functions.get(loc[1], "?")))
            frame_id = parent - 1
        return out

    return stack


_NODE_OP = re.compile(r"([\w.]+)\|(aten::[\w.]+)")
_ATEN = re.compile(r"aten::[\w.]+")


def _scope_parts(op_name: str) -> tuple[str, str]:
    """(FX node(s), aten op) named by a scope path: ``jit(fn)/mm_1|aten::mm.default/dot_general``
    is node ``mm_1`` of op ``aten::mm.default``; ``jit(f)/aten::add.Tensor/add`` op
    ``aten::add.Tensor``. XLA joins the scopes of instructions it combined,
    ``jit(fn)/(mm_2|aten::mm.default/dot_general:mm_1|aten::mm.default/dot_general)``:
    their nodes are listed, comma-separated, in that order."""
    found = _NODE_OP.findall(op_name)
    if found:
        nodes = list(dict.fromkeys(n for n, _ in found))
        return ",".join(nodes), found[0][1]
    op = _ATEN.search(op_name)
    return "", op.group(0) if op else ""


def _sizes(opcode: str, asynchronous: bool, shape: str, group: int) -> tuple[int, int]:
    """(nbytes, wire bytes) of one collective from its result ``shape``."""
    kind = of_opcode(opcode)
    sizes = shape_bytes(shape)
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
    devices = module_devices(hlo)
    frames: Callable[[int], list] | None = None
    out = []
    for line in hlo.splitlines():
        if not line.startswith(" ") or "(" not in line:
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        opcode = m.group("opcode")
        asynchronous = opcode.endswith("-start")
        base = opcode[: -len("-start")] if asynchronous else opcode
        if base not in COLLECTIVE_OPCODES:
            continue
        rest = m.group("rest")
        text, size, groups = _groups(rest, devices)
        nbytes, wire = _sizes(base, asynchronous, m.group("shape"), size)
        op_name = _OP_NAME.search(rest)
        scope = op_name.group(1) if op_name else ""
        node, op = _scope_parts(scope)
        file = line_no = function = None
        first = node.split(",", 1)[0]
        if first and node_lines and first in node_lines:
            file, line_no, function = node_lines[first]
        else:
            src = _SOURCE.search(rest)
            if src:
                file, line_no = src.group(1), int(src.group(2))
            fid = _FRAME_ID.search(rest)
            if fid and user_file is not None:
                frames = frames or stack_frames(hlo)
                for f, ln, fn in frames(int(fid.group(1))):
                    if user_file(f):
                        file, line_no, function = f, ln, fn
                        break
        shape = re.sub(r"\{[^{}]*\}", "", m.group("shape")).strip()  # layouts dropped: f32[8,16]
        out.append(Collective(base, m.group("name"), shape, nbytes, wire, size, groups, text, scope, node, op,
                              asynchronous, file, line_no, function))
    return tuple(out)
