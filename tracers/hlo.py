"""Per-program HLO: content hashing, instruction parsing, FX node -> instruction mapping.

Names come from JAX, not from guessing: the runtime runs each eager op inside
``jax.named_scope("aten::<op>")`` and each FX node of a compiled graph inside
a named scope carrying the node name, and XLA keeps those scopes in
every optimized instruction's ``metadata={op_name="jit(f)/<scope>/.../<prim>"}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tpu_debug.core.hlo_text import parse_module
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import is_library_file

__all__ = [
    "HloInstruction",
    "Program",
    "ProgramNode",
    "elide_literals",
    "fx_nodes_from",
    "instruction_lines",
    "make_program",
    "map_nodes",
    "parse_instructions",
    "program_hash",
]


@dataclasses.dataclass(frozen=True, slots=True)
class HloInstruction:
    """One instruction of an optimized HLO module."""

    computation: str
    name: str
    opcode: str
    op_name: str  # the named-scope path from metadata ("" when none)


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramNode:
    """An FX node of a stored compiled-graph program: its name, target and user source line."""

    name: str
    target: str
    location: SourceLocation | None


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    """One distinct program as the run store keeps it (once per content hash)."""

    hash: str
    mode: str
    name: str
    stablehlo: str
    hlo: str
    instructions: int
    fx_nodes: tuple[ProgramNode, ...] = ()
    node_instructions: tuple[tuple[str, str], ...] = ()  # (node, instruction)


def program_hash(stablehlo: str, hlo: str) -> str:
    """The content hash a program is stored under (sha256 of both texts)."""
    h = hashlib.sha256()
    h.update(stablehlo.encode())
    h.update(b"\0")
    h.update(hlo.encode())
    return h.hexdigest()


def parse_instructions(hlo: str) -> list[HloInstruction]:
    """Instructions of an optimized HLO module's text, in order, with their scope paths."""
    return [HloInstruction(i.computation, i.name, i.opcode, i.metadata.op_name)
            for i in parse_module(hlo).instructions()]


def instruction_lines(hlo: str, names: Iterable[str]) -> str:
    """The lines of ``hlo`` that define the named instructions (with their computation headers)."""
    wanted = set(names)
    text = hlo.splitlines()
    lines: list[str] = []
    for computation in parse_module(hlo).computations:
        found = [text[i.line] for i in computation.instructions if i.name in wanted]
        if found:
            lines.extend(([text[computation.line]] if computation.line >= 0 else []) + found)
    return "\n".join(lines)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')


def _location_from_stack_trace(stack_trace: str | None) -> SourceLocation | None:
    """The innermost user frame of an FX node's ``meta["stack_trace"]``."""
    if not stack_trace:
        return None
    found = None
    for m in _FRAME.finditer(stack_trace):
        file, line, function = m.group(1), int(m.group(2)), m.group(3).strip()
        if not is_library_file(file):
            found = SourceLocation(file, line, function)
    return found


def fx_nodes_from(nodes: Iterable[Any]) -> tuple[ProgramNode, ...]:
    """The stored form of a compiled graph's nodes (``CompileInfo.graph.nodes``).

    Accepts objects with ``name``, ``target`` and ``stack_trace`` (the
    runtime's ``LoweredNode``) or ``meta["stack_trace"]`` (``torch.fx.Node``),
    mappings with ``name`` and optional ``target``,
    ``stack_trace`` or ``location`` (``(file, line[, function])``), or plain
    node names.
    """
    out = []
    for node in nodes:
        if isinstance(node, str):
            out.append(ProgramNode(node, "", None))
            continue
        if isinstance(node, Mapping):
            name = str(node["name"])
            target = node.get("target", "")
            stack = node.get("stack_trace")
            loc = node.get("location")
        else:
            name = str(node.name)
            target = getattr(node, "target", "")
            stack = getattr(node, "stack_trace", None) or (getattr(node, "meta", None) or {}).get(
                "stack_trace"
            )
            loc = getattr(node, "location", None)
        location = None
        if loc is not None:
            location = SourceLocation(str(loc[0]), int(loc[1]), str(loc[2]) if len(loc) > 2 else "")
        else:
            location = _location_from_stack_trace(stack)
        target_name = target if isinstance(target, str) else getattr(target, "__name__", None) or str(target)
        out.append(ProgramNode(name, str(target_name), location))
    return tuple(out)


_TOKEN_END = re.compile(r"[\s(\[:|]")


def map_nodes(instructions: Iterable[HloInstruction], nodes: Iterable[str]) -> list[tuple[str, str]]:
    """(node, instruction) pairs: an instruction belongs to every node whose name is
    a component of its scope path, or the first word of one (``"mul_1|aten::mul.Tensor"``,
    the scope compiled mode gives each node, belongs to ``mul_1``)."""
    wanted = set(nodes)
    pairs = []
    for ins in instructions:
        if not ins.op_name:
            continue
        seen = set()
        for part in ins.op_name.split("/"):
            token = _TOKEN_END.split(part, maxsplit=1)[0]
            for cand in (part, token):
                if cand in wanted and cand not in seen:
                    seen.add(cand)
                    pairs.append((cand, ins.name))
    return pairs


def make_program(
    mode: str,
    name: str,
    stablehlo: str,
    hlo: str,
    fx_nodes: Iterable[Any] = (),
    *,
    content_hash: str | None = None,
) -> Program:
    """Build the stored form of one program, FX node mapping included when nodes are given
    (its StableHLO with large constants' elements elided: :func:`elide_literals`)."""
    instructions = parse_instructions(hlo)
    nodes = fx_nodes_from(fx_nodes) if fx_nodes else ()
    pairs = tuple(map_nodes(instructions, (n.name for n in nodes))) if nodes else ()
    content_hash = content_hash or program_hash(stablehlo, hlo)
    return Program(content_hash, mode, name, elide_literals(stablehlo), hlo, len(instructions), nodes, pairs)


# MLIR prints every element of a constant, where XLA's HLO printer elides large ones: a program
# holding an index array the size of an activation (a lazy graph's gathers) would be stored as
# gigabytes of hex, past what one SQLite string holds
_LARGE_LITERAL = re.compile(r'dense<"0x([0-9A-Fa-f]{64})[0-9A-Fa-f]{4096,}">')


def elide_literals(text: str) -> str:
    """StableHLO ``text`` with each constant of more than 2 KiB shown by its first 32 bytes.

    Example::

        elide_literals('%c = stablehlo.constant dense<"0x' + "00" * 4096 + '"> : tensor<1024xi32>')
        # '%c = stablehlo.constant dense<"0x00…00…(8128 hex digits elided)"> : tensor<1024xi32>'
        # (the first 64 hex digits kept)
    """
    if 'dense<"0x' not in text:
        return text
    def shown(m: re.Match) -> str:
        elided = len(m.group(0)) - len('dense<"0x">') - len(m.group(1))
        return f'dense<"0x{m.group(1)}…({elided} hex digits elided)">'

    return _LARGE_LITERAL.sub(shown, text)
