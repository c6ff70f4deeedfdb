"""A compiled program's buffers at its peak: each one's kind, the op that made it and its PyTorch line.

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

The program memory tracer (``program_memory_tracer.py``) and ``fit`` read their programs
with :func:`analyse`; how a peak is written, and what to change for each kind, is read back
by ``tracers/reading/peak_buffers.py``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tpu_debug.core.buffers import HOST_COLOR, BufferAssignment, PeakBuffer
from tpu_debug.core.collective_kinds import of_opcode
from tpu_debug.core.format import format_bytes
from tpu_debug.core.hlo_text import ELEMENT_BITS, Instruction, Module, parse_module, parse_shape, scope_parts
from tpu_debug.core.records import CompileInfo, InputOrigin
from tpu_debug.tracers.events import ProgramBuffer, ProgramMemoryEvent, SourceLocation
from tpu_debug.tracers.location import is_own_file, split_frames
from tpu_debug.tracers.reading.peak_buffers import KIND_TEXT, KINDS

__all__ = [
    "KINDS",
    "InputFacts",
    "NodeFacts",
    "ProgramContext",
    "StorageLines",
    "analyse",
    "context_of",
    "node_facts",
    "role_of",
    "value_frames",
]

#: buffers an event keeps one by one: the largest, and beyond them every buffer of at least
#: KEPT_LARGE bytes up to KEPT_MOST in all (the rest are folded into one row per kind)
KEPT_BUFFERS = 24
KEPT_LARGE = 16 << 20
KEPT_MOST = 256
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
class InputFacts:
    """What one array input of a program is to the user, taken when it compiled.

    ``name``: the user's name for it (``"qkv.weight"``, ``"exp_avg of 0.weight"``, ``"x"``;
    "" when none is known); ``op``: for a tensor the forward saved for the backward, the
    forward's op that computed it (``"_softmax|aten::_softmax.default"``); ``location`` the
    line that made it (that op's line, the line that allocated the tensor, or for the
    incoming gradient the ``backward()`` call's), the library's when ``library``; ``note``:
    what it is in words, where its line does not say it."""

    name: str = ""
    op: str = ""
    location: SourceLocation | None = None
    library: bool = False
    note: str = ""


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
        facts: what each array input is to the user (:class:`InputFacts`), in order.
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
    facts: tuple[InputFacts, ...] = ()


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


#: (the line that allocated a storage, whether that was before the trace began), by the
#: storage's serial id (``AllocInfo.storage``): the memory tracker's ``line_of``
StorageLines = Callable[[int], tuple[SourceLocation | None, bool] | None]


def _input_facts(source: str, origin: InputOrigin | None, location: SourceLocation | None,
                 lines: StorageLines | None) -> InputFacts:
    """What one input is to the user, from the runtime's :class:`InputOrigin` of it."""
    if origin is not None and origin.saved is not None:
        made = node_facts(origin.saved, "forward")
        return InputFacts("", origin.saved.scope, made.location, made.library, "kept by the forward for the backward")
    if source.startswith("tangents_"):
        # the backward runs (and compiles) inside the call that asked for the gradients
        return InputFacts("the incoming gradient", "", location, False,
                          "the gradient of the compiled graph's output, from the call that ran the backward")
    name = origin.name if origin is not None else ""
    known = lines(origin.storage) if lines is not None and origin is not None and origin.storage is not None else None
    if known is not None and known[0] is not None:
        return InputFacts(name, "", known[0], False, "")
    if known is not None and known[1]:
        return InputFacts(name, "", None, False, "made before the trace began")
    return InputFacts(name, "", None, False, "an input of the program: where it was made is recorded when memory is "
                      "tracked (trace(memory=True))")


def context_of(info: CompileInfo, sites: Mapping[int, tuple[str, SourceLocation | None]] | None = None,
               location: SourceLocation | None = None, program: str | None = None,
               lines: StorageLines | None = None) -> ProgramContext:
    """The :class:`ProgramContext` of a ``CompileInfo`` (cheap: read on the user's thread).

    Args:
        info: the runtime's ``CompileInfo``.
        sites: for a lazy graph, each site's (phase, line) as its ops were recorded.
        location: the user line that compiled it.
        program: the local program's content hash.
        lines: where each storage was allocated (:data:`StorageLines`), when memory is tracked.
    """
    graph = info.graph
    nodes: dict[str, NodeFacts] = {}
    names: tuple[str, ...] = ()
    facts: tuple[InputFacts, ...] = ()
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
        origins: tuple[InputOrigin | None, ...] = graph.origins if len(graph.origins) == len(sources) else (
            (None,) * len(sources))
        arrays = [a for a in info.args if a.shape is not None]
        if len(sources) == len(info.args):
            kept = [i for i, a in enumerate(info.args) if a.shape is not None]
        elif len(sources) == len(arrays):
            kept = list(range(len(sources)))
        else:
            kept = []
        names = tuple(sources[i] for i in kept)
        facts = tuple(_input_facts(sources[i], origins[i], location, lines) for i in kept)
    kind = graph.kind if graph is not None else ""
    roles = tuple("activation" if f.op else role_of(n) for n, f in zip(names, facts or ((InputFacts(),) * len(names))))
    return ProgramContext(str(info.name), str(info.mode), location, nodes, roles, program, kind, names, facts=facts)


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
        self._users: dict[tuple[str, str], list[Instruction]] | None = None
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

    def input_facts(self, parameter: int | None) -> InputFacts:
        """What entry parameter ``parameter``'s input is to the user: the runtime's account of
        it, else its argument's name (a function of named arguments), else words."""
        named = self._argument(parameter)
        if named is not None:
            return InputFacts(named[0], "", None, False, f"an input of the program ({KIND_TEXT.get(named[1], named[1])})")
        number = self.input_number(parameter)
        facts = self.context.facts
        if number is not None and number < len(facts):
            return facts[number]
        if self.context.graph == "lazy":
            return InputFacts("", "", None, False, "a tensor the lazy graph reads: made before the graph began")
        return InputFacts("", "", None, False, "an input of the program")

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
        return self.made(name, index)[0]

    def made(self, name: str, index: tuple[int, ...]) -> tuple[Instruction | None, tuple[int, ...]]:
        """:meth:`maker`, with the element of its result the value is (a multi-output fusion's)."""
        ins = self.by_name.get(name)
        for _ in range(16):
            if ins is None or ins.opcode not in _MOVES or not ins.operands:
                return ins, index
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
                return ins, index
            ins = nxt
        return ins, index

    def element(self, ins: Instruction | None, index: tuple[int, ...]) -> Instruction | None:
        """The instruction inside a multi-output fusion that computes element ``index`` of its
        result (each element has its own op and line: a fused split's three slices), else ``ins``."""
        if ins is None or ins.opcode != "fusion" or not index or not ins.called:
            return ins
        body = self.module.computation(ins.called[0])
        root = body.root if body is not None else None
        if root is None or root.opcode != "tuple" or index[0] >= len(root.operands):
            return ins
        inner = body.get(root.operands[index[0]])
        # a bitcast or copy inside the fusion hands on what its operand computed
        for _ in range(8):
            if inner is None or inner.opcode not in ("bitcast", "copy", "reshape") or not inner.operands:
                break
            if inner.metadata.op_name:
                break
            inner = body.get(inner.operands[0])
        return inner if inner is not None and inner.metadata.op_name else ins

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

    def handed_on(self, ins: Instruction) -> tuple[str, SourceLocation | None, bool, Instruction] | None:
        """For a value an instruction of the compiler's own makes (a kernel it wrote in place of
        the ops, as ``online-softmax`` for a softmax and the matmul after it), whose scope names
        no PyTorch op: the op and line of the view that reads it unchanged (a bitcast or
        reshape whose scope is the op whose output the value is), else None."""
        if self._users is None:
            users: dict[tuple[str, str], list[Instruction]] = {}
            for other in self.module.instructions():
                for operand in other.operands:
                    users.setdefault((other.computation, operand), []).append(other)
            self._users = users
        for user in self._users.get((ins.computation, ins.name), ()):
            if user.opcode in ("bitcast", "reshape", "copy") and user.metadata.op_name:
                op, where, library = self.op_of(user)
                if where is not None:
                    return op, where, library, user
        return None

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


def _kind(reader: _Reader, buf: PeakBuffer, maker: Instruction | None) -> str:
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


def _logical_bytes(shape_text: str) -> tuple[int, str, tuple[int, ...], bool]:
    """(logical bytes, dtype, dims, whether the layout is tiled) of a value's shape."""
    shape = parse_shape(shape_text) if shape_text else None
    array = shape.array if shape is not None else None
    if array is None:  # a tuple's value is its table of pointers: no logical size beside its own
        return 0, "tuple" if shape is not None else "", (), False
    bits = ELEMENT_BITS.get(array.dtype)
    elements = array.elements
    logical = (elements * bits + 7) // 8 if bits is not None and elements is not None else 0
    return logical, array.dtype, array.dims, bool(array.layout is not None and array.layout.tiles)


# what a value no PyTorch op made is, in words (XLA's own buffers)
_XLA_TEXT = {
    "constant": "a constant of the program (XLA's)",
    "thread_local": "a scalar XLA keeps for a reduction or a loop",
    "output": "the program's table of outputs (XLA's)",
}


def _reserved_note(buf: PeakBuffer, held: int) -> str:
    v = buf.value
    what = f"written at point {v.start}" if v.start >= 0 else "written at another point"
    if held:
        return (f"the rest of a {format_bytes(buf.allocation.size)} allocation shared over time: the buffer live at "
                f"the peak uses {format_bytes(held)} of it, this one takes it all when {what}")
    return f"not in use at the peak: its allocation is reserved for the whole program, and it is {what}"


def _row(reader: _Reader, buf: PeakBuffer, held: int = 0) -> ProgramBuffer:
    v = buf.value
    maker, index = reader.made(v.instruction, v.index) if v.instruction else (None, ())
    op, where, library = reader.op_of(reader.element(maker, index))
    note = ""
    parameter = buf.allocation.parameter if buf.allocation.kind == "parameter" else (
        maker.parameter_number if maker is not None and maker.opcode == "parameter"
        and maker.computation == reader.entry else None)
    if parameter is not None:  # an input (or its copy): named by what it is, with the line that made it
        facts = reader.input_facts(parameter)
        op, where, library, note = facts.op or facts.name, facts.location, facts.library, facts.note
        if maker is not None and maker.opcode == "parameter" and buf.allocation.kind != "parameter":
            note = "a copy the program makes of an input" + (f" ({note})" if note else "")
        maker = reader.parameters.get(parameter, maker)
    elif where is None and maker is not None and (read := reader.handed_on(maker)) is not None:
        made_as = maker.metadata.op_name or maker.opcode
        op, where, library, _user = read
        note = (f"the TPU compiler's own kernel {made_as!r} computes it in place of the ops; "
                f"{op.split('|', 1)[0]} at this line reads it as its output")
    elif where is None:
        note = _XLA_TEXT.get(buf.allocation.kind, "made by XLA, not by a PyTorch op")
    logical, dtype, dims, tiled = _logical_bytes(v.shape)
    if buf.reserved:
        note = _reserved_note(buf, held)
    padding = v.size - logical if tiled and logical and not buf.reserved and v.size > logical else 0
    name = v.instruction + (f"{{{','.join(map(str, v.index))}}}" if v.index else "")
    shared = buf.allocation.size if buf.allocation.kind == "output" and (buf.reserved or held) else 0
    return ProgramBuffer(
        _kind(reader, buf, maker), int(buf.nbytes), int(min(logical, buf.nbytes) if logical else buf.nbytes
                                                        if dtype == "tuple" else 0), dtype,
        tuple(dims), name, maker.opcode if maker is not None else "", op, v.start, v.end,
        where.file if where else None, where.line if where else None, where.function if where else None,
        library, note=note, reserved=buf.reserved, allocation_bytes=shared, padding_bytes=min(padding, buf.nbytes),
    )


def _folded(rows: list[ProgramBuffer], unused: int) -> tuple[ProgramBuffer, ...]:
    """The largest rows one by one, the rest one row per kind (``count`` of them), then the
    heap's unused bytes: the rows still add up to the total."""
    # the largest, and every large one up to a bound (each a line to look at)
    kept = [r for i, r in enumerate(rows) if i < KEPT_BUFFERS or (r.nbytes >= KEPT_LARGE and i < KEPT_MOST)]
    rest: dict[str, list[ProgramBuffer]] = {}
    for r in rows[len(kept):]:
        rest.setdefault(r.kind, []).append(r)
    for kind, group in sorted(rest.items(), key=lambda kv: -sum(r.nbytes for r in kv[1])):
        kept.append(ProgramBuffer(kind, sum(r.nbytes for r in group), sum(r.logical_bytes for r in group),
                                  count=len(group), padding_bytes=sum(r.padding_bytes for r in group)))
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
    # an output allocation shared over time: the bytes its live value holds, beside its reserved rest
    held = {b.allocation.index: b.nbytes for b in peak.buffers if b.allocation.kind == "output" and not b.reserved}
    rows = sorted((_row(reader, b, held.get(b.allocation.index, 0) if b.reserved else
                        (b.nbytes if any(o.reserved and o.allocation.index == b.allocation.index for o in peak.buffers)
                         else 0))
                   for b in peak.buffers), key=lambda r: -r.nbytes)
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


def value_frames(assignment: BufferAssignment, hlo: str, context: ProgramContext
                 ) -> Callable[[int], tuple[list[dict[str, Any]], int]]:
    """For a memory snapshot of the program (``tracers/recording/memory_snapshot.py``): each
    value's frames, innermost first (the PyTorch line that made it, then the program and the op
    or the input's name, or what it is in words), and its logical bytes, by value id."""
    reader = _Reader(parse_module(hlo), context, assignment.sequence)
    allocations = {a.index: a for a in assignment.allocations}
    values = {v.id: v for v in assignment.values}
    cache: dict[int, tuple[list[dict[str, Any]], int]] = {}

    def describe(value_id: int) -> tuple[list[dict[str, Any]], int]:
        found = cache.get(value_id)
        if found is not None:
            return found
        v = values.get(value_id)
        if v is None:
            return [], 0
        row = _row(reader, PeakBuffer(v, allocations[v.allocation], v.size))
        frames = []
        if row.file:
            frames.append({"filename": row.file, "line": row.line or 0, "name": row.function or ""})
        what = row.op if row.file or row.opcode == "parameter" else ""
        frames.append({"filename": f"<{context.name}>", "line": max(v.start, 0),
                       "name": " ".join(p for p in (what, f"({row.note})" if row.note else "") if p) or v.instruction})
        found = cache[value_id] = (frames, row.logical_bytes or v.size)
        return found

    return describe
