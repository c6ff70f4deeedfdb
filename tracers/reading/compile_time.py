"""Where compile time went: each compile split into its measured phases, and an estimate per
source line of the user's code.

**Phases (measured).** A compile's wall time is read from the spans that were timed around
it: each program the runtime compiled (a :class:`~tpu_debug.tracers.events.CompileEvent`:
its wall time, with the lowering, XLA's compile for this machine and the read-back from the
persistent compile cache measured inside it), dynamo's compile of a frame and AOTAutograd's
deferred backward compile (:class:`~tpu_debug.tracers.events.CompilePhaseEvent` units, with
dynamo's bytecode tracing, guards, AOTAutograd's joint graph and partition measured inside
them), and each compile for the TPU target (on the target compiler's own thread). Spans on
one thread nest (an eager op compiled while dynamo traces a frame): each span keeps only its
own time, what the spans inside it do not hold, so nothing is counted twice, and what no
measured phase holds inside a compile is its ``other``. The phases of a compile add up to
its wall time (less the compiles nested in it, which are compiles of their own), and the
run's phases to the time of all its compiles.

**Lines (an estimate).** Each compile's time is shared among the user's lines it came
from: a program's in proportion to each line's share of its StableHLO operations (what XLA
compiles and what the lowering emits grow with them), a dynamo or AOTAutograd compile's in
proportion to each line's share of the graph nodes of the programs it made, a TPU-target
compile's as the local program's operations, an eager op's to the line that called it. The
HLO counts themselves are counted, not estimated (``tracers/recording/compile_lines.py``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from tpu_debug.tracers.events import (
    COMPILE_PHASES,
    CompileEvent,
    CompileLinesEvent,
    CompilePhaseEvent,
    LineCost,
    SourceLocation,
    TargetCompileEvent,
)
from tpu_debug.tracers.reading.view import RunView

__all__ = ["LINES_METHOD", "CompileTime", "CompileUnit", "LineTime", "Phases", "compile_time"]

#: how the seconds of a line are estimated, in one sentence (the report and the JSON say it)
LINES_METHOD = (
    "estimated: each compile's measured time shared among the lines it came from, a program's by "
    "their share of its StableHLO operations, dynamo's and AOTAutograd's by their share of its graph nodes"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Phases:
    """Seconds of compile time per phase (the names of :data:`COMPILE_PHASES`, in order)."""

    dynamo_trace: float = 0.0
    dynamo_guards: float = 0.0
    aot_graph: float = 0.0
    aot_partition: float = 0.0
    lowering: float = 0.0
    xla_compile: float = 0.0
    target_compile: float = 0.0
    cache_read: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in COMPILE_PHASES)

    def items(self) -> list[tuple[str, float]]:
        """(phase, seconds) in the order a compile goes through them."""
        return [(name, getattr(self, name)) for name in COMPILE_PHASES]

    def __add__(self, other: Phases) -> Phases:
        return Phases(*(a + b for (_, a), (_, b) in zip(self.items(), other.items())))


@dataclasses.dataclass(frozen=True, slots=True)
class CompileUnit:
    """One compile whose wall time was measured.

    ``kind``: ``"program"`` (the runtime compiled one program: an eager op, a compiled graph,
    a lazy graph), ``"frame"`` (dynamo compiled a function), ``"backward"`` (AOTAutograd
    compiled a backward when it first ran) or ``"target"`` (a program compiled for the TPU
    target). ``name``: the program's (op, graph id) or the function's; ``compile_id``:
    dynamo's compile of a compiled graph or frame; ``event``: the event it was read from.
    ``wall``: its measured span (compiles nested in it included), ``phases``: its own time by
    phase (the nested compiles' left out), ``location``: the user's line that compiled it.
    """

    kind: str
    name: str
    mode: str | None
    compile_id: str | None
    event: int
    start: float
    wall: float
    phases: Phases
    location: SourceLocation | None
    from_cache: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class LineTime:
    """One source line's share of the run's compiles: the graph nodes and HLO counted for it
    in the programs it went into (each compile counted), and the compile ``seconds``
    estimated for it (:data:`LINES_METHOD`). ``file`` None: what no line is known for.
    ``instances``/``module``: the most instances of one class of the user's modules it was
    traced in within one program (a layer's line in a loop over 12 layers: 12)."""

    file: str | None
    line: int | None
    function: str | None
    seconds: float
    nodes: int = 0
    hlo_before: int = 0
    hlo_after: int = 0
    programs: int = 0
    instances: int = 0
    module: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CompileTime:
    """A run's compile time: its compiles (:class:`CompileUnit`, in time order), their phases
    added up, and the lines (most time first). ``total`` is the time of all its compiles;
    the lines' ``seconds`` add up to it."""

    units: tuple[CompileUnit, ...]
    phases: Phases
    lines: tuple[LineTime, ...]

    @property
    def total(self) -> float:
        return self.phases.total


@dataclasses.dataclass(slots=True, eq=False)
class _Span:
    thread: int
    start: float
    end: float
    unit: str | None  # a compile of its own ("program", "frame", ...), or None for a phase
    phase: str
    event: object
    fixed: tuple[tuple[str, float], ...] = ()  # phases measured inside a program, not as spans
    parent: _Span | None = None
    children: float = 0.0  # time of the spans directly inside it
    own: dict[str, float] = dataclasses.field(default_factory=dict)


def _spans(session: RunView) -> list[_Span]:
    spans = []
    for c in session.events(CompileEvent.kind):
        assert isinstance(c, CompileEvent)
        end = c.ts + c.seconds
        wall = max(c.wall_seconds or c.seconds, c.seconds)
        fixed = (("lowering", c.lower_seconds), ("xla_compile", c.xla_seconds), ("cache_read", c.read_seconds))
        spans.append(_Span(c.thread, end - wall, end, "program", "other", c, fixed))
    if session.records(CompilePhaseEvent.kind):
        for p in session.events(CompilePhaseEvent.kind):
            assert isinstance(p, CompilePhaseEvent)
            spans.append(_Span(p.thread, p.ts, p.ts + p.seconds, p.unit, p.phase, p))
    for t in session.events(TargetCompileEvent.kind):
        assert isinstance(t, TargetCompileEvent)
        if not t.cached:  # a result from the target's on-disk cache compiled nothing now
            spans.append(_Span(t.thread, t.ts, t.ts + t.seconds, "target", "target_compile", t))
    return spans


def _nest(spans: list[_Span]) -> None:
    """Give each span the one directly around it on its thread, and its own time."""
    by_thread: dict[int, list[_Span]] = collections.defaultdict(list)
    for s in spans:
        by_thread[s.thread].append(s)
    for group in by_thread.values():
        group.sort(key=lambda s: (s.start, -(s.end - s.start)))
        stack: list[_Span] = []
        for s in group:
            while stack and stack[-1].end <= s.start:
                stack.pop()
            if stack:
                parent = stack[-1]
                s.start, s.end = max(s.start, parent.start), min(s.end, parent.end)
                s.parent = parent
                parent.children += s.end - s.start
            stack.append(s)
    for s in spans:
        own = max(0.0, s.end - s.start - s.children)
        fixed = sum(v for _, v in s.fixed)
        scale = min(1.0, own / fixed) if fixed > 0 else 0.0
        for name, value in s.fixed:
            s.own[name] = s.own.get(name, 0.0) + value * scale
        s.own[s.phase] = s.own.get(s.phase, 0.0) + own - fixed * scale


def _unit_of(s: _Span) -> _Span:
    while s.unit is None and s.parent is not None:
        s = s.parent
    return s


def _unit(s: _Span, phases: dict[str, float]) -> CompileUnit:
    e = s.event
    if isinstance(e, CompileEvent):
        return CompileUnit("program", e.name, e.mode, e.frame, e.id, s.start, s.end - s.start, Phases(**phases),
                           e.location, e.from_cache)
    if isinstance(e, TargetCompileEvent):
        return CompileUnit("target", e.name, e.mode, None, e.id, s.start, s.end - s.start, Phases(**phases),
                           e.location)
    assert isinstance(e, CompilePhaseEvent)
    return CompileUnit(s.unit or "frame", e.function or e.compile_id or e.source, e.mode, e.compile_id, e.id,
                       s.start, s.end - s.start, Phases(**phases), e.location)


def _units(spans: list[_Span]) -> list[CompileUnit]:
    own: dict[int, dict[str, float]] = {}
    heads: dict[int, _Span] = {}
    for s in spans:
        head = _unit_of(s)
        heads[id(head)] = head
        mine = own.setdefault(id(head), {})
        for phase, seconds in s.own.items():
            mine[phase] = mine.get(phase, 0.0) + seconds
    units = [_unit(head, own[key]) for key, head in heads.items()]
    return sorted(units, key=lambda u: (u.start, u.event))


# -- lines -------------------------------------------------------------------------------------


_Key = tuple  # (file, line, function), or (None, None, None)


@dataclasses.dataclass(slots=True)
class _Row:
    seconds: float = 0.0
    nodes: int = 0
    hlo_before: int = 0
    hlo_after: int = 0
    programs: int = 0
    instances: int = 0
    module: str | None = None


def _key(loc: SourceLocation | None) -> _Key:
    return (loc.file, loc.line, loc.function) if loc is not None else (None, None, None)


def _share(rows: dict[_Key, _Row], seconds: float, weights: Sequence[tuple[_Key, float]],
           fallback: SourceLocation | None) -> None:
    """``seconds`` into ``rows`` in proportion to ``weights``; all to ``fallback``'s line when
    nothing weighs."""
    total = sum(w for _, w in weights)
    if total <= 0:
        rows.setdefault(_key(fallback), _Row()).seconds += seconds
        return
    for key, w in weights:
        rows.setdefault(key, _Row()).seconds += seconds * w / total


def _lines(session: RunView, units: Sequence[CompileUnit]) -> list[LineTime]:
    costs: dict[int, tuple[LineCost, ...]] = {}
    if session.records(CompileLinesEvent.kind):
        for e in session.events(CompileLinesEvent.kind):
            assert isinstance(e, CompileLinesEvent)
            costs[e.compile_event] = e.lines
    compiles = {c.id: c for c in session.events(CompileEvent.kind) if isinstance(c, CompileEvent)}
    by_frame: dict[str, list[int]] = collections.defaultdict(list)
    by_program: dict[str, int] = {}
    for c in compiles.values():
        if c.frame is not None:
            by_frame[c.frame].append(c.id)
        if c.program is not None:
            by_program.setdefault(c.program, c.id)
    targets = {t.id: t.program for t in session.events(TargetCompileEvent.kind) if isinstance(t, TargetCompileEvent)}
    rows: dict[_Key, _Row] = {}
    for c in compiles.values():  # what each program compile put in, counted
        lines = costs.get(c.id)
        if lines is None:
            row = rows.setdefault(_key(c.location), _Row())
            row.hlo_before += c.hlo_before or 0
            row.hlo_after += c.hlo_after or 0
            row.programs += 1
            continue
        for line in lines:
            row = rows.setdefault((line.file, line.line, line.function), _Row())
            row.nodes += line.nodes
            row.hlo_before += line.hlo_before
            row.hlo_after += line.hlo_after
            row.programs += 1
            if line.instances > row.instances:
                row.instances, row.module = line.instances, line.module

    def program_weights(compile_id: int | None) -> list[tuple[_Key, float]]:
        lines = costs.get(compile_id, ()) if compile_id is not None else ()
        return [((x.file, x.line, x.function), float(x.hlo_before)) for x in lines]

    for u in units:
        seconds = u.phases.total
        if u.kind == "program":
            _share(rows, seconds, program_weights(u.event), u.location)
        elif u.kind == "target":
            target = targets.get(u.event)
            _share(rows, seconds, program_weights(by_program.get(target) if target else None), u.location)
        else:
            weights = [((x.file, x.line, x.function), float(x.nodes))
                       for cid in by_frame.get(u.compile_id or "", ()) for x in costs.get(cid, ())]
            _share(rows, seconds, weights, u.location)
    out = [LineTime(k[0], k[1], k[2], r.seconds, r.nodes, r.hlo_before, r.hlo_after, r.programs, r.instances,
                    r.module) for k, r in rows.items()]
    return sorted(out, key=lambda x: (-x.seconds, x.file is None, x.file or "", x.line or 0))


def compile_time(session: RunView) -> CompileTime:
    """The run's compiles split into their phases, and the lines they came from.

    Example::

        ct = compile_time(session)
        ct.total, ct.phases.xla_compile, ct.lines[0].file, ct.lines[0].line
    """
    spans = _spans(session)
    _nest(spans)
    units = _units(spans)
    phases = sum((u.phases for u in units), Phases())
    return CompileTime(tuple(units), phases, tuple(_lines(session, units)))

