"""A compiled program's memory at its peak, buffer by buffer: its kind, the op and the PyTorch line.

The compiler's buffer assignment (``core/buffers.py``) says where every value of a program
lives and when; :func:`analyse` turns it into a :class:`~.events.ProgramMemoryEvent`: the
point in program order where the temporaries occupy the most, and every buffer holding
memory there, largest first, each with

- the instruction that made it (a copy, a tuple or a loop's state followed back to what
  computed it), and the op that made that: the runtime runs each FX node of a compiled
  graph in the named scope ``<node>|<aten op>``, each op of a lazy graph in ``n<i>``, and
  XLA keeps the scope in the instruction's ``op_name``; a JAX program (``fit``'s step)
  names its own operations there;
- the PyTorch line that made that node (its stack trace; for a lazy graph the line that
  recorded the op), the user's own when there is one, else the library's (a model's
  ``modeling_llama.py``);
- its kind (:data:`KINDS`), decided from what the runtime knows of the program's inputs and
  from program order, never from names of the user's variables:

  * an entry parameter is what its input is: dynamo's source of a compiled graph's
    input (``_parameters``, ``.grad``, an optimizer's ``state``), a backward graph's
    placeholder (``primals_``: a forward input, ``tangents_``: the incoming gradient,
    anything else a tensor the forward saved), ``fit``'s step's own inputs;
  * a temporary made by a collective is a ``"collective"`` buffer, one in the host's
    memory space ``"host"``;
  * in a program that holds a backward pass (a train step, a backward graph, a JAX
    gradient), a value the forward made that a backward instruction reads last is an
    ``"activation"`` kept for it, and a value the backward made that outlives the
    backward (it flows to the optimizer or out of the program) a ``"gradient"``;
  * the rest are ``"temporary"``; an output no input shares ``"output"``.

The buffers plus the heap's unused bytes add up to the assignment's total, which is the
compiler's figure (:mod:`tpu_debug.core.buffers`); the event keeps the largest buffers and
one row per kind for the rest, so its rows add up to it too.

:class:`ProgramMemoryTracer` records one event per distinct program a run compiles: a
graph's (compiled, lazy) as this machine's compiler assigns it, compiled again with a dump
on a worker thread, and, with a TPU target, every program the target's compiler assigned or
refused for HBM (the :class:`~.target.TargetTracer` hands each result over). This module
imports neither torch nor jax at module level.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tpu_debug.core.buffers import HOST_COLOR, BufferAssignment, PeakBuffer
from tpu_debug.core.collective_kinds import of_opcode
from tpu_debug.core.hlo_text import ELEMENT_BITS, Instruction, Module, parse_module, parse_shape, scope_parts
from tpu_debug.runtime.probes import CompileInfo
from tpu_debug.tracers.events import ProgramBuffer, ProgramMemoryEvent, ProgramProtoEvent, SourceLocation
from tpu_debug.tracers.location import split_frames, user_location

__all__ = [
    "KINDS",
    "KIND_TEXT",
    "NodeFacts",
    "ProgramContext",
    "ProgramMemoryTracer",
    "Remedy",
    "analyse",
    "context_of",
    "holder_remedies",
    "made_where",
    "node_facts",
    "peak_headline",
    "remedies",
    "remedy_text",
    "role_of",
    "shape_text",
    "sum_text",
]

#: what a buffer at the peak is, in the order the report lists kinds
KINDS = ("parameter", "optimizer_state", "gradient", "activation", "temporary", "collective", "host", "input",
         "output", "other", "unused")
KIND_TEXT = {
    "parameter": "parameters",
    "optimizer_state": "optimizer state",
    "gradient": "gradients",
    "activation": "activations kept for backward",
    "temporary": "temporaries",
    "collective": "collective buffers",
    "host": "offloaded to host",
    "input": "inputs",
    "output": "outputs",
    "other": "constants and scalars",
    "unused": "heap fragmentation",
}
#: buffers an event keeps one by one (the rest are folded into one row per kind)
KEPT_BUFFERS = 24
#: timeline points an event keeps
TIMELINE_POINTS = 200

# instructions that hand on a value another instruction computed
_MOVES = frozenset({"copy", "copy-start", "copy-done", "bitcast", "get-tuple-element", "reshape", "transpose",
                    "tuple", "while", "optimization-barrier", "call", "async-done", "dynamic-update-slice"})
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the runtime told about one node of a program: the pass it belongs to
    (``"forward"``, ``"backward"``, ``"optimizer"``, ``""`` when not known) and its line (the
    user's, or the library's when ``library``)."""

    phase: str = ""
    location: SourceLocation | None = None
    library: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramContext:
    """What the buffers' kinds and lines need of a compiled program, taken when it compiled.

    Attributes:
        name: the program (``g1/train_step``, ``lazy/optimizer_step``, an op).
        mode: ``"eager"``, ``"compiled"`` or ``"lazy"``.
        location: the user line that compiled it.
        nodes: node (scope) name -> :class:`NodeFacts`.
        inputs: the role (:func:`role_of`) of each of the program's array inputs, in order.
        program: the local program's content hash, when recorded.
        graph: the graph's kind (``"forward"``, ``"backward"``, ``"inference"``, ``"lazy"``;
            ``""`` for an eager op).
        sources: what each array input is called (dynamo's source, a placeholder), in order.
        named: for a JAX function of named arguments (``fit``'s step: ``params``, ``exp_avg``,
            ``tokens``...), each argument's name and the kind of its leaves: an entry
            parameter named ``params['w']`` is then that argument's.
        loop_nodes: the nodes of a loop's body (``fit``'s layer), for instructions whose scope
            is inside a ``while`` (their names may repeat the nodes outside it).
    """

    name: str
    mode: str
    location: SourceLocation | None = None
    nodes: Mapping[str, NodeFacts] = dataclasses.field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    program: str | None = None
    graph: str = ""
    sources: tuple[str, ...] = ()
    named: tuple[tuple[str, str], ...] = ()
    loop_nodes: Mapping[str, NodeFacts] = dataclasses.field(default_factory=dict)


# -- what a program's inputs are -----------------------------------------------------------


def role_of(source: str) -> str:
    """The kind of a program input from what the runtime calls it: dynamo's source
    (``"G['m']._parameters['weight']"``, ``"L['x']"``, ``"...['params'][0].grad"``), a lifted
    attribute (``"opt___state_..._exp_avg"``) or a backward placeholder (``"primals_3"``,
    ``"tangents_1"``, a saved ``"addmm"``).

    Example:
        >>> role_of("G['opt'].param_groups[0]['params'][1].grad"), role_of("tangents_1")
        ('gradient', 'gradient')
    """
    s = source.lower()
    if s.endswith((".grad", "_grad")) or s.startswith("tangents_"):
        return "gradient"
    # an optimizer's state: dynamo's source (``.state[p]['exp_avg']``) or the attribute it lifts
    # the state into (``opt___state_..._0____1``, ``args___1_state_...``)
    if "exp_avg" in s or "momentum" in s or "state[" in s or "___state" in s or "_state_list" in s:
        return "optimizer_state"
    if "_parameters" in s or "param_groups" in s or "parameters_" in s or "_buffers" in s:
        return "parameter"
    if s.startswith(("primals_", "l[", "g[", "arg")):
        return "input"
    return "activation"  # a backward's placeholder that is no primal or tangent: saved by the forward


def _stack_location(stack: str | None) -> tuple[SourceLocation | None, bool]:
    """The user's line of an FX node's stack trace, else the innermost line of the model's
    library (transformers' ``modeling_llama.py``: not torch, jax or tpu_debug)."""
    if not stack:
        return None, False
    frames = [SourceLocation(f, int(n), fn.strip()) for f, n, fn in _FRAME.findall(stack)]
    user, _ = split_frames(frames)
    if user is not None:
        return user, False
    model = next((f for f in reversed(frames) if not _machinery(f.file)), None)
    return (model or (frames[-1] if frames else None)), True


def _machinery(file: str) -> bool:
    """Code that runs a model rather than defines it: torch, jax, tpu_debug, the standard library."""
    from tpu_debug.tracers.location import is_own_file

    parts = file.replace("\\", "/").split("/")
    return (is_own_file(file) or any(p in ("torch", "jax", "jaxlib", "functorch") for p in parts)
            or not any(p in ("site-packages", "dist-packages") for p in parts))


def node_facts(node: Any, phase: str) -> NodeFacts:
    """The :class:`NodeFacts` of a lowered node (``name``, ``stack_trace``) in pass ``phase``."""
    where, library = _stack_location(node.stack_trace)
    return NodeFacts(phase, where, library)


def _optimizer_code(stack: str | None) -> bool:
    """The node was traced inside a torch optimizer's code (its step)."""
    return bool(stack) and f"{os.sep}torch{os.sep}optim{os.sep}" in stack


def context_of(info: CompileInfo, sites: Mapping[int, tuple[str, SourceLocation | None]] | None = None,
               location: SourceLocation | None = None, program: str | None = None) -> ProgramContext:
    """The :class:`ProgramContext` of a ``CompileInfo`` (cheap: read on the user's thread).

    Args:
        info: the runtime's ``CompileInfo``.
        sites: for a lazy graph, each site's (phase, line) as its ops were recorded.
        location: the user line that compiled it.
        program: the local program's content hash.
    """
    graph = info.graph
    nodes: dict[str, NodeFacts] = {}
    names: tuple[str, ...] = ()
    if graph is not None and graph.kind == "lazy":
        for node, op in zip(graph.nodes, graph.ops):
            phase, where = (sites or {}).get(op.site, ("", None)) if op.site is not None else ("", None)
            nodes[node.name] = NodeFacts(phase, where)
    elif graph is not None:
        for node in graph.nodes:
            phase = ("backward" if node.backward else "optimizer" if _optimizer_code(node.stack_trace)
                     or graph.label == "optimizer_step" else "forward")
            nodes[node.name] = node_facts(node, phase)
        sources = graph.inputs
        arrays = [a for a in info.args if a.shape is not None]
        if len(sources) == len(info.args):
            names = tuple(sources[i] for i, a in enumerate(info.args) if a.shape is not None)
        elif len(sources) == len(arrays):
            names = tuple(sources)
    kind = graph.kind if graph is not None else ""
    return ProgramContext(str(info.name), str(info.mode), location, nodes, tuple(role_of(n) for n in names),
                          program, kind, names)


# -- reading the program -----------------------------------------------------------------------


def _input_number(ins: Instruction) -> int | None:
    """Which of the jitted function's array inputs an entry parameter is: its ``op_name``
    (``dyn[3]``, ``args[0]``, ``arrays[12]``; JAX names parameters after the function's
    arguments, unused ones included, so this holds when XLA drops some) else its number."""
    name = ins.metadata.op_name
    if name.endswith("]") and "[" in name:
        inner = name[name.rfind("[") + 1:-1]
        if inner.isdigit():
            return int(inner)
    return ins.parameter_number


class _Reader:
    """The program's instructions, with what made each value and which pass it belongs to."""

    def __init__(self, module: Module, context: ProgramContext, sequence: tuple[str, ...]) -> None:
        self.module = module
        self.context = context
        self.by_name: dict[str, Instruction] = {}
        for ins in module.instructions():
            self.by_name.setdefault(ins.name, ins)
        entry = module.entry
        self.entry = entry.name if entry is not None else ""
        self.parameters = {i.parameter_number: i for i in entry.instructions if i.opcode == "parameter"} if entry else {}
        self.position = {name: i for i, name in enumerate(sequence)}
        self.phases = [self.phase(self.by_name.get(name)) for name in sequence]
        backward = [i for i, p in enumerate(self.phases) if p == "backward"]
        self.backward = (backward[0], backward[-1]) if backward else None

    def input_number(self, parameter: int | None) -> int | None:
        """Which array input of the program entry parameter ``parameter`` is."""
        ins = self.parameters.get(parameter)
        return _input_number(ins) if ins is not None else parameter

    def _argument(self, parameter: int | None) -> tuple[str, str] | None:
        """(its name, its argument's kind) of a parameter of a function of named arguments."""
        ins = self.parameters.get(parameter)
        if ins is None or not self.context.named:
            return None
        name = ins.metadata.op_name.replace("\\'", "'")
        head = name.split("[", 1)[0]
        return next(((name, role) for arg, role in self.context.named if arg == head), None)

    def role(self, parameter: int | None) -> str:
        """The kind of entry parameter ``parameter`` (what its input is)."""
        named = self._argument(parameter)
        if named is not None:
            return named[1]
        number = self.input_number(parameter)
        roles = self.context.inputs
        return roles[number] if number is not None and number < len(roles) else "input"

    def source(self, parameter: int | None) -> str:
        """What entry parameter ``parameter``'s input is called."""
        named = self._argument(parameter)
        if named is not None:
            return named[0]
        number = self.input_number(parameter)
        sources = self.context.sources
        return sources[number] if number is not None and number < len(sources) else f"input {number}"

    def facts_of(self, node: str, op_name: str) -> NodeFacts | None:
        """What the runtime told about ``node`` of an instruction whose scope is ``op_name``."""
        if self.context.loop_nodes and "while" in op_name:
            found = self.context.loop_nodes.get(node)
            if found is not None:
                return found
        return self.context.nodes.get(node)

    def phase(self, ins: Instruction | None) -> str:
        if ins is None:
            return ""
        op_name = ins.metadata.op_name
        if "transpose(" in op_name or "rematted_computation" in op_name:
            return "backward"
        nodes, _ = scope_parts(op_name)
        for node in nodes.split(",") if nodes else self._lazy_nodes(op_name):
            facts = self.facts_of(node, op_name)
            if facts is not None and facts.phase:
                return facts.phase
        return "forward" if "jvp(" in op_name else ""

    @staticmethod
    def _lazy_nodes(op_name: str) -> list[str]:
        return [part for part in op_name.split("/") if part[:1] == "n" and part[1:].isdigit()]

    def maker(self, name: str, index: tuple[int, ...]) -> Instruction | None:
        """The instruction that computed value ``name{index}``: copies, tuples, loop states and
        tuple reads followed back to it (a loop's state to the value that entered the loop)."""
        ins = self.by_name.get(name)
        for _ in range(16):
            if ins is None or ins.opcode not in _MOVES or not ins.operands:
                return ins
            if ins.opcode == "tuple" and index:
                name, index = ins.operands[index[0]] if index[0] < len(ins.operands) else ins.operands[0], index[1:]
            elif ins.opcode == "get-tuple-element":
                element = ins.ints("index")
                name, index = ins.operands[0], (element[0] if element else 0, *index)
            elif ins.opcode in ("while", "optimization-barrier", "call"):
                name = ins.operands[0]
            else:
                name, index = ins.operands[0], ()
            nxt = self.by_name.get(name)
            if nxt is None:
                return ins
            ins = nxt
        return ins

    def op_of(self, ins: Instruction | None) -> tuple[str, SourceLocation | None, bool]:
        """(the op that made ``ins``, its PyTorch line, whether that line is library code)."""
        if ins is None:
            return "", None, False
        op_name = ins.metadata.op_name
        nodes, aten = scope_parts(op_name)
        for node in (nodes.split(",") if nodes else self._lazy_nodes(op_name)):
            facts = self.facts_of(node, op_name)
            if facts is not None:
                label = f"{node}|{aten}" if aten else node
                return label, facts.location, facts.library
        if aten:  # an eager op's program: the op, at the line that compiled it
            return aten, self.context.location, False
        frames = self.module.stack(ins.metadata.stack_frame_id) if ins.metadata.stack_frame_id else ()
        where = None
        library = False
        if frames:
            user, inner = split_frames([SourceLocation(f, line, fn) for f, line, fn in reversed(frames)])
            where, library = (user, False) if user is not None else (inner, True)
        elif ins.metadata.source_file:
            where = SourceLocation(ins.metadata.source_file, ins.metadata.source_line, "")
            library = True
        return op_name.rsplit("/", 1)[-1] if op_name else ins.opcode, where, library

    def collective(self, ins: Instruction | None) -> bool:
        if ins is None:
            return False
        if of_opcode(ins.opcode.removesuffix("-done")) is not None:
            return True
        if ins.opcode in ("fusion", "async-start"):
            for called in ins.called:
                body = self.module.computation(called)
                if body is not None and any(of_opcode(i.opcode) is not None for i in body.instructions):
                    return True
        return False


def _kind(reader: _Reader, buf: PeakBuffer, maker: Instruction | None, peak: int) -> str:
    a, v = buf.allocation, buf.value
    shape = v.parsed_shape.array if v.shape else None
    if a.color == HOST_COLOR or (shape is not None and shape.layout is not None
                                 and shape.layout.memory_space == HOST_COLOR):
        return "host"
    if a.kind in ("constant", "thread_local") or not v.instruction:
        return "other"
    if a.kind == "parameter":
        return reader.role(a.parameter)
    if reader.collective(maker):
        return "collective"
    phase = reader.phase(maker)
    window = reader.backward
    if window is not None:
        first, last = window
        # kept for the backward: its last reader is a backward instruction (the scheduler may
        # hoist a backward instruction among the forward's, so the window alone does not say);
        # a last reader of no known pass leaves the window to decide
        ender = reader.phases[v.end] if 0 <= v.end < len(reader.phases) else ""
        if phase == "forward" and (ender == "backward" or (not ender and v.end >= first)):
            return "activation"
        if phase == "backward" and v.end > last:
            return "gradient"
    if maker is not None and maker.opcode == "parameter" and maker.computation == reader.entry:
        return reader.role(maker.parameter_number)  # an input's copy (its new value, written out)
    if a.kind == "output":
        # an AOT forward's outputs beyond the user's are what it saves for the backward
        return "activation" if reader.context.graph == "forward" else "output"
    return "temporary"


def _logical_bytes(shape_text: str) -> tuple[int, str, tuple[int, ...]]:
    shape = parse_shape(shape_text) if shape_text else None
    array = shape.array if shape is not None else None
    if array is None:  # a tuple's value is its table of pointers: no logical size beside its own
        return 0, "tuple" if shape is not None else "", ()
    bits = ELEMENT_BITS.get(array.dtype)
    elements = array.elements
    logical = (elements * bits + 7) // 8 if bits is not None and elements is not None else 0
    return logical, array.dtype, array.dims


def _row(reader: _Reader, buf: PeakBuffer, peak: int) -> ProgramBuffer:
    v = buf.value
    maker = reader.maker(v.instruction, v.index) if v.instruction else None
    op, where, library = reader.op_of(maker)
    parameter = buf.allocation.parameter if buf.allocation.kind == "parameter" else (
        maker.parameter_number if maker is not None and maker.opcode == "parameter"
        and maker.computation == reader.entry else None)
    if parameter is not None:  # an input (or its copy): named by what it is, made by no line here
        op, where, library = reader.source(parameter), None, False
        maker = reader.parameters.get(parameter, maker)
    logical, dtype, dims = _logical_bytes(v.shape)
    name = v.instruction + (f"{{{','.join(map(str, v.index))}}}" if v.index else "")
    return ProgramBuffer(
        _kind(reader, buf, maker, peak), int(buf.nbytes), int(min(logical, buf.nbytes) if logical else buf.nbytes
                                                              if dtype == "tuple" else 0), dtype,
        tuple(dims), name, maker.opcode if maker is not None else "", op, v.start, v.end,
        where.file if where else None, where.line if where else None, where.function if where else None,
        library,
    )


def _folded(rows: list[ProgramBuffer], unused: int) -> tuple[ProgramBuffer, ...]:
    """The largest rows one by one, the rest one row per kind (``count`` of them), then the
    heap's unused bytes: the rows still add up to the total."""
    kept = rows[:KEPT_BUFFERS]
    rest: dict[str, list[ProgramBuffer]] = {}
    for r in rows[KEPT_BUFFERS:]:
        rest.setdefault(r.kind, []).append(r)
    for kind, group in sorted(rest.items(), key=lambda kv: -sum(r.nbytes for r in kv[1])):
        kept.append(ProgramBuffer(kind, sum(r.nbytes for r in group), sum(r.logical_bytes for r in group),
                                  count=len(group)))
    if unused:
        kept.append(ProgramBuffer("unused", unused))
    return tuple(kept)


def analyse(assignment: BufferAssignment, hlo: str, context: ProgramContext, *, source: str = "local",
            target: str | None = None, status: str = "ok", compiler_bytes: int | None = None,
            required_bytes: int | None = None, available_bytes: int | None = None,
            tpu_program: str | None = None) -> ProgramMemoryEvent:
    """One program's memory at its peak (the event's header is blank: the recorder fills it).

    Args:
        assignment: the compiler's buffer assignment.
        hlo: the optimized module's text (the instructions the assignment names).
        context: what the runtime told about the program (:func:`context_of`).
        source: ``"local"`` or ``"target"``.
        target: the target's name, for a target's compile.
        status: ``"ok"`` or ``"hbm_oom"``.
        compiler_bytes: the executable's arguments + outputs - aliased + temporaries.
        required_bytes, available_bytes: a refusal's figures.
        tpu_program: the content hash the target's HLO is stored under.

    Returns:
        The :class:`~.events.ProgramMemoryEvent`.
    """
    peak = assignment.peak(0)
    reader = _Reader(parse_module(hlo), context, assignment.sequence)
    rows = sorted((_row(reader, b, peak.position) for b in peak.buffers), key=lambda r: -r.nbytes)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.kind] = kinds.get(r.kind, 0) + r.nbytes
    if peak.unused:
        kinds["unused"] = peak.unused
    order = [k for k in KINDS if k in kinds]
    timeline = assignment.timeline(0, TIMELINE_POINTS)
    maker = reader.by_name.get(peak.instruction)
    peak_op = reader.op_of(maker)[0] if maker is not None else ""
    return ProgramMemoryEvent(
        0, 0.0, context.mode, threading.get_native_id(), context.location,
        context.name, source, status, peak.total, peak.heap, peak.unused, peak.position,
        len(assignment.sequence), peak_op, target, compiler_bytes, required_bytes, available_bytes,
        assignment.total(HOST_COLOR), tuple(order), tuple(kinds[k] for k in order), _folded(rows, peak.unused),
        tuple(p for p, _ in timeline), tuple(b for _, b in timeline), context.program, tpu_program,
    )


# -- how a peak is written (the report, the TUI, diff and the advisor read these) -----------------


def shape_text(b: ProgramBuffer) -> str:
    """``f32[512,256]`` (``-`` for a folded row, ``tuple`` for a tuple's table)."""
    if b.count > 1 or b.kind == "unused":
        return "-"
    return f"{b.dtype}[{','.join(map(str, b.shape))}]" if b.dtype != "tuple" else "tuple"


def made_where(b: ProgramBuffer, cwd: str | None = None) -> str:
    """The PyTorch line that made a buffer (``train.py:12``; a library's line says so), what an
    input is called, or what a folded row holds."""
    from tpu_debug.core.format import format_location

    if b.count > 1:
        return f"{b.count} smaller buffers"
    if b.kind == "unused":
        return "between the buffers (the heap's layout)"
    if b.file:
        where = format_location(b.file, b.line, None, cwd=cwd)
        return f"{where} (library)" if b.library else where
    return _shortened(b.op) if b.op else "-"


def _shortened(name: str, width: int = 56) -> str:
    """A long name (dynamo's attribute for an optimizer's state) cut in its middle."""
    return name if len(name) <= width else f"{name[:width // 2 - 1]}…{name[-(width // 2):]}"


def peak_headline(e: ProgramMemoryEvent) -> str:
    """``g1/train_step on v5e: 18.50 GiB at its peak, while mm|aten::mm runs (point 1 of 3)``."""
    from tpu_debug.core.format import format_bytes

    where = f" on {e.target}" if e.target else ""
    at = f", while {e.peak_op} runs" if e.peak_op else ""
    point = f" (point {e.peak_position} of {e.length})" if e.peak_position >= 0 else ""
    text = f"{e.name}{where}: {format_bytes(e.total_bytes)} at its peak{at}{point}"
    if e.status == "hbm_oom":
        text += (f"; the TPU compiler refused it: {format_bytes(e.required_bytes)} needed, "
                 f"{format_bytes(e.available_bytes)} there")
    return text


def sum_text(e: ProgramMemoryEvent) -> str:
    """How the buffers add up, against the compiler's own figures."""
    from tpu_debug.core.format import format_bytes

    whose = "the TPU compiler's" if e.source == "target" else "this machine's compiler's"
    text = f"the buffers add up to {format_bytes(e.total_bytes)}, {whose} buffer assignment"
    if e.unused_bytes:
        text += f" ({format_bytes(e.unused_bytes)} of it unused between them)"
    if e.compiler_bytes is not None and e.compiler_bytes != e.total_bytes:
        text += (f"; the executable counts {format_bytes(e.compiler_bytes)} (arguments + outputs - aliased + "
                 "temporaries: no constants, its own rounding of the temporaries)")
    if e.host_bytes:
        text += f"; {format_bytes(e.host_bytes)} more in host memory (offloaded)"
    return text


# -- what to change, by kind ---------------------------------------------------------------------

#: a buffer at least this wide in its last dimension, made by the forward or the loss, is taken
#: for a vocabulary's logits (Llama 3: 128256; GPT-2: 50257)
LOGITS_WIDTH = 32768
#: a buffer whose padding is this fraction of its bytes or more is worth a shape that pads less
PADDING_SHARE = 0.2


@dataclasses.dataclass(frozen=True, slots=True)
class Remedy:
    """What to change for one kind of the bytes at a program's peak.

    ``kind``: ``"activation"``, ``"logits"``, ``"optimizer_state"``, ``"parameter"``,
    ``"gradient"``, ``"temporary"`` or ``"padding"``; ``nbytes`` the peak's bytes of it;
    ``estimate_bytes`` the peak with them gone (an estimate, not a bound: what the change keeps
    instead is not counted, and the peak may move to another point); ``change`` what to do in
    PyTorch; ``lines`` where they are made.
    """

    kind: str
    nbytes: int
    estimate_bytes: int
    change: str
    lines: tuple[str, ...] = ()


_CHANGES = {
    "activation": "activation checkpointing of the blocks that make them (torch.utils.checkpoint, or "
                  "create_selective_checkpoint_contexts to keep only the matmuls): the backward recomputes them",
    "logits": "a chunked (fused linear) cross-entropy, so that no whole [tokens, vocabulary] logits or their "
              "gradient exist at once (torchtune's chunked loss, Liger's LigerFusedLinearCrossEntropyLoss)",
    "optimizer_state": "shard the optimizer state over more chips (FSDP: fully_shard), or keep it in bfloat16 / "
                       "use an optimizer with less state",
    "parameter": "shard the parameters over more chips (FSDP: fully_shard), or keep them in bfloat16",
    "gradient": "reduce the gradients to their shards (FSDP) instead of keeping each whole",
    "temporary": "a smaller batch (the step's temporaries scale with it)",
    "padding": "shapes that pad less: the dimensions the tiles pad to a multiple of 128 (8 for a batch)",
}


def _is_logits(b: ProgramBuffer) -> bool:
    return b.kind in ("activation", "temporary") and len(b.shape) >= 2 and b.shape[-1] >= LOGITS_WIDTH


def remedies(e: ProgramMemoryEvent, cwd: str | None = None) -> tuple[Remedy, ...]:
    """What to change for each kind of the peak's bytes, the largest first, each with the need
    it would leave (``Remedy.estimate_bytes``: the total less that kind's bytes)."""
    parts: dict[str, list[ProgramBuffer]] = {}
    for b in e.buffers:
        kind = "logits" if _is_logits(b) else b.kind
        if kind in _CHANGES:
            parts.setdefault(kind, []).append(b)
    padded = [b for b in e.buffers if b.count == 1 and b.logical_bytes
              and b.nbytes - b.logical_bytes >= PADDING_SHARE * b.nbytes]
    if padded:
        parts["padding"] = padded
    out = []
    for kind, group in parts.items():
        saved = sum(b.nbytes - b.logical_bytes for b in group) if kind == "padding" else sum(b.nbytes for b in group)
        lines = tuple(dict.fromkeys(made_where(b, cwd) for b in group if b.file))[:4]
        out.append(Remedy(kind, saved, e.total_bytes - saved, _CHANGES[kind], lines))
    return tuple(sorted(out, key=lambda r: -r.nbytes))


def holder_remedies(holders: Any, required: int, cwd: str | None = None) -> tuple[Remedy, ...]:
    """What to change for each kind of the tensors held at an eager run's peak
    (``MemoryHolder`` records with their ``kind``), the largest first, each with the need it
    would leave of ``required``."""
    from tpu_debug.core.format import format_location

    parts: dict[str, list[Any]] = {}
    for h in holders:
        wide = len(h.shape) >= 2 and h.shape[-1] >= LOGITS_WIDTH and h.kind in ("activation", "temporary")
        kind = "logits" if wide else h.kind
        if kind in _CHANGES:
            parts.setdefault(kind, []).append(h)
    out = []
    for kind, group in parts.items():
        saved = sum(h.nbytes for h in group)
        lines = tuple(dict.fromkeys(format_location(h.file, h.line, None, cwd=cwd) for h in group if h.file))[:4]
        out.append(Remedy(kind, saved, max(required - saved, 0), _CHANGES[kind], lines))
    return tuple(sorted(out, key=lambda r: -r.nbytes))


def remedy_text(r: Remedy) -> str:
    """``activations kept for backward (8.00 GiB at model.py:12): <change>; without them the peak
    would be about 12.50 GiB``."""
    from tpu_debug.core.format import format_bytes

    what = KIND_TEXT.get(r.kind, "the vocabulary's logits" if r.kind == "logits" else r.kind)
    at = f" at {', '.join(r.lines)}" if r.lines else ""
    return (f"{what} ({format_bytes(r.nbytes)}{at}): {r.change}; without them the peak would be about "
            f"{format_bytes(r.estimate_bytes)} (an estimate: what the change keeps instead, and a peak that moves "
            "elsewhere, are not counted)")


# -- the tracer ----------------------------------------------------------------------------------

# frames between on_compile and the runtime: deliver() and probes.compiled (library frames)
_PROBE_DEPTH = 3
#: seconds the end of a trace waits for this machine's analyses still running
DEFAULT_WAIT = 60.0


class ProgramMemoryTracer:
    """Records each compiled program's memory at its peak (:class:`~.events.ProgramMemoryEvent`).

    A probe: ``on_compile`` takes what the kinds and lines need (:func:`context_of`) and
    queues this machine's buffer assignment of a graph's program (compiled again with a dump,
    ``runtime.buffers``) on one worker thread; ``on_defer`` keeps each lazy site's phase and
    line. With a TPU target, :meth:`on_target` (given to the ``TargetTracer``) records what the
    target's compiler assigned, for every program it compiled or refused for HBM.

    Args:
        writer: the run writer (``put``, ``new_id``).
        clock: seconds since the run started.
        local: analyse the local compiler's assignment of graphs (not in a dry run, which
            compiles nothing locally).
        record_error: ``(where, message)`` keeps a tracer failure in the run.
        phase: the pass running now (``"forward"``, ``"backward"``, ``"optimizer"``), for
            lazy sites; None leaves them unknown.
    """

    def __init__(self, writer: Any, *, clock: Callable[[], float] | None = None, local: bool = True,
                 record_error: Callable[[str, str], None] | None = None,
                 phase: Callable[[], str] | None = None) -> None:
        self.writer = writer
        self.local = local
        self._clock = clock or (lambda: 0.0)
        self._record_error = record_error
        self._phase = phase
        self._sites: dict[int, tuple[str, SourceLocation | None]] = {}
        self._contexts: dict[Any, ProgramContext] = {}  # CompileInfo key -> context
        self._seen: set[tuple[str, str]] = set()  # (source, program hash or name) recorded
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: set[concurrent.futures.Future] = set()
        self._closed = False
        # program ids of the protos written for xprof: far from those of JAX's own capture
        self._program_ids = 1_000_000

    # -- probe methods ------------------------------------------------------------------

    def on_defer(self, name: str, index: int, site: int) -> None:
        phase = self._phase() if self._phase is not None else ""
        self._sites[site] = (phase, user_location(_PROBE_DEPTH))

    def on_compile(self, info: CompileInfo) -> None:
        if info.replayed:
            return
        location = user_location(_PROBE_DEPTH)
        graph = info.graph is not None
        context = context_of(info, self._sites, location, _program_hash(info) if graph else None)
        with self._lock:
            if self._closed:
                return
            self._contexts[info.key] = context
        if self.local and graph and info.lowered is not None and info.compiled is not None:
            self._submit(info.lowered, context, _compiler_bytes(info.compiled.memory_analysis()))

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self._error(method, exc)

    # -- this machine's compiler --------------------------------------------------------

    def _submit(self, lowered: Any, context: ProgramContext, compiler: int | None) -> None:
        key = ("local", context.program or context.name)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tpu_debug-buffers")
            future = self._pool.submit(self._local, lowered, context, compiler)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _local(self, lowered: Any, context: ProgramContext, compiler: int | None) -> None:
        from tpu_debug.runtime.buffers import local_buffer_assignment

        try:
            assignment, hlo = local_buffer_assignment(lowered)
            if assignment is None or hlo is None:
                return
            self._put(analyse(assignment, hlo, context, source="local", compiler_bytes=compiler))
        except Exception as exc:  # noqa: BLE001 - a tracer error never reaches the program
            self._error(f"local buffers of {context.name}", exc)

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)

    # -- the target's compiler ----------------------------------------------------------

    def on_target(self, info: CompileInfo, result: Any, program: str | None, tpu_program: str | None) -> None:
        """A target compile of ``info`` finished (the ``TargetTracer``'s result listener, on its
        worker; ``program`` and ``tpu_program`` the content hashes of the local and the target's
        HLO): record the target's assignment, of a graph, or of any program it refused."""
        buffers = getattr(result, "buffers", None)
        hlo = getattr(result, "hlo", None)
        if buffers is None or not hlo:
            return
        refused = result.error is not None and result.error.kind == "hbm_oom"
        if info.graph is None and not refused:
            return  # an eager op's temporaries are the op's own: the held tensors tell that run's memory
        with self._lock:
            context = self._contexts.get(info.key)
            key = ("target", tpu_program or str(info.name))
            if key in self._seen:
                return
            self._seen.add(key)
        if context is None:
            context = context_of(info, self._sites)
        memory = result.memory
        compiler = (memory.argument_bytes + memory.output_bytes - memory.alias_bytes + memory.temp_bytes
                    if memory is not None else None)
        if context.program is None and program is not None:
            context = dataclasses.replace(context, program=program)
        error = result.error
        try:
            self._put(analyse(buffers, hlo, context, source="target", target=result.target.name,
                              status="hbm_oom" if refused else "ok", compiler_bytes=compiler,
                              required_bytes=error.required_bytes if refused else None,
                              available_bytes=error.available_bytes if refused else None,
                              tpu_program=tpu_program))
            if result.hlo_proto:
                self._put(ProgramProtoEvent(0, 0.0, context.mode, threading.get_native_id(), context.location,
                                            _viewer_name(context.name, result.target.name), self._next_id(), "target",
                                            base64.b64encode(result.hlo_proto).decode(), result.target.name))
        except Exception as exc:  # noqa: BLE001
            self._error(f"target buffers of {info.name}", exc)

    def _next_id(self) -> int:
        with self._lock:
            self._program_ids += 1
            return self._program_ids

    # -- the end ------------------------------------------------------------------------

    def close(self, wait: float = DEFAULT_WAIT) -> int:
        """Wait at most ``wait`` seconds for the local analyses still running; the count of
        those that did not finish (dropped)."""
        with self._lock:
            pending = set(self._pending)
        _, not_done = concurrent.futures.wait(pending, timeout=max(0.0, wait)) if pending else (set(), set())
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        for future in not_done:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        return len(not_done)

    def _put(self, event: ProgramMemoryEvent | ProgramProtoEvent) -> None:
        with self._lock:
            if self._closed:
                return
        self.writer.put(dataclasses.replace(event, id=self.writer.new_id(), ts=self._clock()))

    def _error(self, where: str, exc: BaseException) -> None:
        if self._record_error is not None:
            self._record_error(f"ProgramMemoryTracer.{where}", f"{type(exc).__name__}: {exc}")


def _viewer_name(program: str, target: str) -> str:
    """How xprof lists a program: its name is a file name there (``g1/train_step`` -> ``g1.train_step.v5e``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "." for c in program)
    return f"{safe}.{target}"


def _compiler_bytes(stats: Any) -> int | None:
    """Arguments + outputs - aliased + temporaries of an executable's ``memory_analysis()``."""
    if stats is None:
        return None
    return (int(stats.argument_size_in_bytes) + int(stats.output_size_in_bytes) - int(stats.alias_size_in_bytes)
            + int(stats.temp_size_in_bytes))


def _program_hash(info: Any) -> str | None:
    """The content hash the recorder stores the local program under."""
    from tpu_debug.tracers.hlo import program_hash

    try:
        return program_hash(info.stablehlo(), info.hlo())
    except Exception:  # noqa: BLE001 - a program without texts (a dry run's) has no hash
        return None
