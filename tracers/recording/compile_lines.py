"""Compile cost by the user's line: a program's HLO counted before and after XLA, line by line.

A compiled graph's program is lowered node by node, each FX node inside a
``jax.named_scope`` carrying its name (``runtime/compiled.py``), a lazy graph's op by op
(``n12``: ``runtime/lazy.py``); JAX keeps those scopes in each StableHLO operation's
location and XLA in each optimized instruction's ``metadata={op_name=...}``. So the
operations of the module XLA was handed and the instructions of its optimized HLO are
each counted for the node whose scope their path names, and a node's line is the
innermost user frame of its stack trace (a lazy op's, the line that recorded it). What
names no node (parameters, the outputs' tuple, copies XLA adds) is counted under no line,
so the lines add up to the program.

The StableHLO module is walked as JAX's MLIR objects (the text would print a reduction's
body on one line and hide its operations); the optimized HLO is the text the run stores.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from tpu_debug.core.hlo_text import parse_module
from tpu_debug.core.records import CompileInfo, LoweredNode
from tpu_debug.tracers.events import LineCost, SourceLocation
from tpu_debug.tracers.hlo import fx_nodes_from
from tpu_debug.tracers.location import is_library_file

__all__ = ["ProgramCost", "hlo_scopes", "program_cost", "stablehlo_scopes"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramCost:
    """One program's operations before XLA (StableHLO) and instructions after (optimized HLO),
    in all and per source line (empty for a program of no graph: an eager op)."""

    hlo_before: int
    hlo_after: int
    lines: tuple[LineCost, ...] = ()


def stablehlo_scopes(lowered: Any) -> list[str]:
    """The named-scope path of every operation of ``lowered``'s StableHLO module, nested regions
    included (an operation of no name of its own, a reduction's body, takes the one of the
    operation holding it; ``""``: none)."""
    module = lowered.compiler_ir("stablehlo")
    out: list[str] = []
    stack: list[tuple[Any, str]] = [(module.operation, "")]
    while stack:
        op, held_by = stack.pop()
        own = op is not module.operation and op.name not in ("func.func", "builtin.module")
        name = (getattr(op.location, "name_str", "") or held_by) if own else ""
        if own:
            out.append(name)
        for region in op.regions:
            for block in region.blocks:
                stack.extend((child.operation, name) for child in block.operations)
    return out


# attributes naming the computations an instruction calls (a fusion's, a reduction's body...)
_CALLS = ("calls", "to_apply", "body", "condition", "branch_computations", "true_computation",
          "false_computation", "called_computations")
_COMPUTATION = re.compile(r"%?([\w.\-]+)")


def hlo_scopes(hlo: str) -> list[str]:
    """The named-scope path of every instruction of an optimized HLO module's text, in text
    order: its ``metadata={op_name=...}``, or for an instruction without one inside a called
    computation (a fusion's parameters), the path of the instruction that calls it."""
    module = parse_module(hlo)
    callers: dict[str, Any] = {}
    for ins in module.instructions():
        for key in _CALLS:
            value = ins.attr(key)
            if value:
                for name in _COMPUTATION.findall(value):
                    callers.setdefault(name, ins)
    inherited: dict[str, str] = {}
    for computation in reversed(module.computations):  # a callee is printed before its callers
        caller = callers.get(computation.name)
        if caller is not None:
            inherited[computation.name] = caller.metadata.op_name or inherited.get(caller.computation, "")
    return [i.metadata.op_name or inherited.get(i.computation, "") for i in module.instructions()]


def _node_of(path: str, scopes: dict[str, int]) -> int | None:
    for part in path.split("/"):
        found = scopes.get(part)
        if found is not None:
            return found
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')


def _caller(stack_trace: str | None) -> SourceLocation | None:
    """The user's frame that called the innermost user frame of an FX node's stack trace."""
    if not stack_trace:
        return None
    frames = [SourceLocation(m.group(1), int(m.group(2)), m.group(3).strip()) for m in _FRAME.finditer(stack_trace)]
    users = [f for f in frames if not is_library_file(f.file)]
    return users[-2] if len(users) > 1 else None


def _user_module(node: LoweredNode) -> tuple[str, str] | None:
    """The innermost module of the user's own code the node was traced in: (path, class)."""
    for path, name, file in reversed(node.modules):
        if file and not is_library_file(file):
            return path, name
    return None


def program_cost(info: CompileInfo, hlo: str, op_lines: Sequence[SourceLocation | None] = ()) -> ProgramCost:
    """Count ``info``'s program before and after XLA, per source line for a graph.

    Args:
        info: the compile, with its lowered program.
        hlo: its optimized HLO text (as the run stores it; empty when it has none).
        op_lines: for a lazy graph, the user's line of each op.
    """
    before = stablehlo_scopes(info.lowered) if info.lowered is not None else []
    after = hlo_scopes(hlo) if hlo else []
    graph = info.graph
    if graph is None or not graph.nodes:
        return ProgramCost(len(before), len(after))
    nodes = graph.nodes
    if graph.kind == "lazy":
        lines = [op_lines[i] if i < len(op_lines) else None for i in range(len(nodes))]
        callers: list[SourceLocation | None] = [None] * len(nodes)
    else:
        lines = [n.location for n in fx_nodes_from(nodes)]
        callers = [_caller(n.stack_trace) for n in nodes]
    scopes = {n.scope: i for i, n in enumerate(nodes)}
    per_node_before = collections.Counter(_node_of(p, scopes) for p in before)
    per_node_after = collections.Counter(_node_of(p, scopes) for p in after)
    rows: dict[tuple | None, list[int]] = {}
    modules: dict[tuple | None, collections.Counter] = collections.defaultdict(collections.Counter)
    paths: dict[tuple | None, set] = collections.defaultdict(set)
    called_from: dict[tuple | None, collections.Counter] = collections.defaultdict(collections.Counter)
    for i, (node, loc) in enumerate(zip(nodes, lines)):
        key = (loc.file, loc.line, loc.function) if loc is not None else None
        if callers[i] is not None:
            called_from[key][callers[i]] += 1
        row = rows.setdefault(key, [0, 0, 0])
        row[0] += 1
        row[1] += per_node_before.get(i, 0)
        row[2] += per_node_after.get(i, 0)
        owner = _user_module(node)
        if owner is not None:
            modules[key][owner[1]] += 1
            paths[(key, owner[1])].add(owner[0])
    loose = rows.setdefault(None, [0, 0, 0])
    loose[1] += per_node_before.get(None, 0)
    loose[2] += per_node_after.get(None, 0)
    costs = []
    for key, (n, b, a) in rows.items():
        if key is None and not (n or b or a):
            continue
        module = modules[key].most_common(1)[0][0] if modules.get(key) else None
        instances = len(paths[(key, module)]) if module is not None else 0
        file, line, function = key if key is not None else (None, None, None)
        caller = called_from[key].most_common(1)[0][0] if called_from.get(key) else None
        costs.append(LineCost(file, line, function, n, b, a, instances, module,
                              *((caller.file, caller.line, caller.function) if caller is not None else ())))
    return ProgramCost(len(before), len(after), tuple(costs))
