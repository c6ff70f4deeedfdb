"""The events tracers record: frozen, slotted dataclasses (the tracers' shared language).

Every event carries the same header: an ``id`` (unique within a run, assigned
by the run writer), ``ts`` (when the activity began, in seconds since the run
started, from a monotonic clock), the execution ``mode`` (``"eager"``, ``"compiled"`` or ``None``), the
native ``thread`` id and the user ``location`` (see :mod:`.location`). The
fields after the header are the event's own. ``kind`` is a class constant that
names the event in the run store.

An event kind is declared in one place, its class: the fields with their types,
``kind``, ``stored`` (a :class:`Stored`: its detail table and which fields
the shared header keeps) and ``view`` (the TUI view that shows it, if any). ``@register_event`` adds it to :data:`EVENT_TYPES`;
the run store derives the table's columns from the field types, and its
writer and queries follow from the same declaration (see :mod:`.store`).

``SCHEMA_VERSION`` is the version of the run store layout these events map to
(see :mod:`.store`); it changes whenever a reader of the old layout would
misread the new one. ``OLDEST_READABLE_SCHEMA`` is the oldest layout readers
still read.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

# One input of a compiled program, in its recorded form (static values as their repr text):
# the class the runtime reports inputs with, shared so there is one definition
from tpu_debug.core.argspec import ArgSpec as ArgInfo
from tpu_debug.core.records import (
    CollectiveDone,
    CollectiveInfo,
    DesyncInfo,
    FallbackInfo,
    InvalidValueInfo,
    TransferInfo,
)

__all__ = [
    "SCHEMA_VERSION",
    "OLDEST_READABLE_SCHEMA",
    "SourceLocation",
    "ArgInfo",
    "DIFF_ASPECTS",
    "KeyDiff",
    "Stored",
    "carried",
    "carried_fields",
    "column",
    "Event",
    "OpEvent",
    "CompileEvent",
    "COMPILE_PHASES",
    "CompilePhaseEvent",
    "CompileLinesEvent",
    "LineCost",
    "TransferEvent",
    "CollectiveCallEvent",
    "CollectiveDesyncEvent",
    "CollectiveDoneEvent",
    "FallbackEvent",
    "GraphBreakEvent",
    "GuardFailureEvent",
    "RecompileLimitEvent",
    "Crossing",
    "DivergenceEvent",
    "InternalErrorEvent",
    "InvalidValueEvent",
    "MaterializationEvent",
    "INTERNAL_ERRORS_KEPT",
    "StepEvent",
    "WaitEvent",
    "PaddedBuffer",
    "TargetCompileEvent",
    "TargetStepEvent",
    "TargetSummaryEvent",
    "MemoryHolder",
    "MemoryStepEvent",
    "MemorySummaryEvent",
    "MemoryFix",
    "MemoryFindingEvent",
    "ProgramBuffer",
    "ProgramMemoryEvent",
    "ProgramProtoEvent",
    "DivergenceSite",
    "UncomparedOp",
    "DivergenceSummaryEvent",
    "TensorBoardSummaryEvent",
    "DryRunSummaryEvent",
    "ProcessEvent",
    "CollectivesTargetEvent",
    "ShardingRematEvent",
    "FitCollective",
    "FitEvent",
    "EVENT_TYPES",
    "event_type",
    "register_event",
]

# 4: key differences stored as typed columns (aspect, argument, dimensions), not as prose
# 5: divergences carry a triage verdict (noise or a wrong op) and the zero crossings behind it
# 6: a compile says whether it was read back from the persistent compile cache, and what that saved
# 7: the divergence, TensorBoard, dry-run, process and collectives-target summaries are event kinds
# 8: an event about a runtime record keeps the whole record: a transfer's runtime op, a collective
#    call's shapes as dimensions, a desync's message and each rank's shapes as a list
# 9: a step keeps the time of the programs it read back from the compile cache, an upload what
#    its data follows (a tensor, a module), a recompile-limit hit the identity of what it compiled
# 10: a compile splits its time into measured phases (lowering, XLA's compile, the read-back, its
#    wall time), names its dynamo compile, counts its HLO before and after XLA and keeps its cache
#    entry and why the cache missed
SCHEMA_VERSION = 10
# the oldest layout a reader still reads: schema 6 differs from 7 only in keeping the run
# summaries as JSON objects in the ``meta`` table (see ``RunQuery``'s summaries), 7 from 8 in
# columns each carried record declares how to read (``carried(legacy=...)``), and 8 from 9 and 9
# from 10 in columns that read as their defaults or from older columns (``column(legacy=...)``)
OLDEST_READABLE_SCHEMA = 6


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLocation:
    """A line of user code: the innermost frame outside torch, jax, tpu_debug, the stdlib and
    installed packages (see :mod:`.location`)."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


DIFF_ASPECTS = (
    "shape",
    "dtype",
    "layout",
    "static",
    "scalar",
    "inputs",
    "precision",
    "grad",
    "config",
    "guard",
    "graph",
    "key",
)


@dataclasses.dataclass(frozen=True, slots=True)
class KeyDiff:
    """One difference between a compile's key and the closest earlier key of
    the same op or graph (filled by the recompile tracer, :mod:`.recompiles`).

    The difference is data; :attr:`field` and :meth:`render` are its prose.

    ``aspect`` says what differs (one of :data:`DIFF_ASPECTS`):

    - ``"shape"``: an input's shape (``before``/``now`` are avals, ``f32[8,128]``),
      or, read from a dynamo guard, one dimension's size (``dims``) or a
      tensor's rank (``detail="rank"``);
    - ``"dtype"``: an input's dtype;
    - ``"layout"``: how a tensor is read, ``detail`` says which part: ``"view"``
      (a view's access pattern: slice, permuted, strided), ``"storage"`` (the
      shape of the storage it views), ``"device"`` (a host scalar), ``"stride"``
      (a dynamo stride guard); a view's offset is an operand, never a difference;
    - ``"static"``: a static argument baked into the executable;
    - ``"scalar"``: a Python number baked in;
    - ``"inputs"``: the number of inputs (``before``/``now``: both signatures);
    - ``"precision"``: the float32 matmul precision;
    - ``"grad"``: ``detail`` is ``"grad mode"``, ``"graph kind"``, ``"global state"``
      (dynamo's) or ``"requires_grad"`` (of a tensor);
    - ``"config"``: another runtime setting in the key (``detail``: its name);
    - ``"guard"``: any other failed dynamo guard (``before``: its text);
    - ``"graph"``: a lazy fused graph's ops (``detail``: ``"ops"`` for their number,
      ``"op <i>"`` for the first op that differs, with the op's line when known,
      ``"outputs"`` for the values it returns);
    - ``"key"``: nothing above explains it (``detail``: ``"graph code"``,
      ``"signature"``, or None for the key as a whole).

    ``arg_index`` is the input's position among the program's arguments (None
    for a tensor known only by the name a dynamo guard gives it, or when no
    input differs); ``arg_name`` is its name (the parameter's, or dynamo's source
    for it: ``x``, ``m.weight``). ``dims`` are the dimensions that differ.
    ``source`` is ``"key"`` (read from the compiled keys) or ``"guard"`` (read
    from dynamo's failed guard).
    """

    aspect: str
    before: str
    now: str
    arg_index: int | None = None
    arg_name: str | None = None
    dims: tuple[int, ...] = ()
    detail: str | None = None
    source: str = "key"

    def __post_init__(self) -> None:
        if self.aspect not in DIFF_ASPECTS:
            raise ValueError(f"KeyDiff aspect {self.aspect!r}; use one of {', '.join(DIFF_ASPECTS)}")
        if self.source not in ("key", "guard"):
            raise ValueError(f"KeyDiff source {self.source!r}; use 'key' or 'guard'")

    @property
    def subject(self) -> str:
        """The input the difference is about: ``arg 0 'self'``, ``arg 1``, ``tensor 'x'``
        (empty when it is about no input)."""
        if self.arg_index is not None:
            if self.arg_name is None or self.arg_name == f"arg{self.arg_index}":
                return f"arg {self.arg_index}"
            return f"arg {self.arg_index} '{self.arg_name}'"
        return f"tensor '{self.arg_name}'" if self.arg_name is not None else ""

    @property
    def field(self) -> str:
        """What differs, as a label: ``arg 0 'self'``, ``static arg 'dim'``,
        ``tensor 'x' dim 0``, ``matmul precision``."""
        aspect, subject, detail = self.aspect, self.subject, self.detail
        if aspect == "shape":
            if self.arg_index is not None:
                return subject
            if detail == "rank":
                return f"{subject} rank"
            return f"{subject} dim {','.join(map(str, self.dims))}" if self.dims else subject
        if aspect == "dtype":
            return f"{subject} dtype"
        if aspect == "layout":
            if self.arg_index is None and self.dims:
                return f"{subject} {detail} {','.join(map(str, self.dims))}"
            return f"{subject} {detail}"
        if aspect == "static":
            return f"static arg '{self.arg_name}'"
        if aspect == "scalar":
            return f"python scalar baked in '{self.arg_name}'"
        if aspect == "inputs":
            return "inputs"
        if aspect == "guard":
            return "dynamo guard"
        if aspect == "grad" and detail == "requires_grad":
            return f"{subject} requires_grad"
        if aspect == "precision":
            return detail or "matmul precision"
        if aspect == "graph":
            return detail or "graph"
        return detail or aspect

    def render(self) -> str:
        return f"{self.field}: {self.before} -> {self.now}"


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """Where an event kind is kept in the run store (``stored`` on its class).

    Args:
        table: the kind's detail table, one row per event keyed by ``event_id``:
            every field not kept in the header gets a column there, named after
            the field (or :func:`column`'s ``name``) and typed from its
            annotation (``str``, ``int``, ``float``, ``bool``, tuples of those as
            JSON, ``tuple[ArgInfo, ...]`` as JSON, ``X | None`` nullable). A
            ``tuple`` of records (a dataclass such as :class:`KeyDiff`) goes to
            its own child table, named by :func:`column`'s ``table``. None: the
            header holds every field.
        name, seconds, program: the fields the header keeps in its ``name``
            (indexed per kind), ``seconds`` and ``program_id`` (a program's
            content hash) columns; None leaves the column empty.
        header: ``"events"``, the table every kind shares (indexed by kind and
            time, kind and name), or ``"executions"`` for a kind recorded
            millions of times (no kind column, no secondary index).
        cap: ``(field, n)``: at most ``n`` events per value of ``field`` are
            stored; the store counts the rest (``RunQuery.capped_counts``), so an
            error repeated a million times is not a million rows.
    """

    table: str | None
    name: str | None = None
    seconds: str | None = None
    program: str | None = None
    header: str = "events"
    cap: tuple[str, int] | None = None


def column(
    name: str | None = None, *, table: str | None = None, default: Any = dataclasses.MISSING,
    legacy: str | None = None,
) -> Any:
    """A field stored under another column ``name`` (a field named like an SQL
    keyword), or a tuple of records stored in the child ``table``.

    ``legacy``: how a run recorded before the column existed reads it, an SQL expression
    over that run's columns, each named in braces (``"MAX({step} - 1, 0)"``; ``{name}`` is the
    header's name column when the detail table has none of that name). A field
    whose meaning changes gets a new column name and says here how to read the old one,
    so runs of both layouts read alike (a field without it reads as its default)."""
    return dataclasses.field(default=default, metadata={"column": name, "table": table, "legacy": legacy})


def carried(
    *, columns: Mapping[str, str] | None = None, legacy: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()
) -> Any:
    """A record of the runtime's (``tpu_debug.core.records``) that the event carries as it was
    reported: its fields are the event's columns, and the event answers for each of them
    (``event.nbytes`` is ``event.transfer.nbytes``) unless it declares a field of that name itself.

    ``columns`` stores some fields under another column (a field named like an SQL keyword, a
    field whose meaning a column of earlier runs had otherwise); a key ``"calls.shapes"`` reaches
    into a tuple of records the record holds (its child table). ``legacy``: how a run recorded
    before a column existed reads it, by the same keys (see :func:`column`). ``skip``: fields the
    recording side reads while the run goes on (a lowered node, a lazy site), each with a
    default, which the run does not keep."""
    return dataclasses.field(
        metadata={"carried": True, "columns": dict(columns or {}), "legacy": dict(legacy or {}), "skip": tuple(skip)}
    )


def carried_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of an event class that carry a runtime record (see :func:`carried`)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("carried")]


def _answer_for(cls: type, field: dataclasses.Field, record: type) -> None:
    """Give ``cls`` a read-only attribute per field of its carried ``record`` it does not declare."""
    own = {f.name for f in dataclasses.fields(cls)}
    for g in dataclasses.fields(record):
        if g.name in own or hasattr(cls, g.name):
            continue
        getter = operator.attrgetter(f"{field.name}.{g.name}")
        setattr(cls, g.name, property(getter, doc=f"``{field.name}.{g.name}``"))


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """The header every event carries."""

    kind: ClassVar[str] = "event"
    stored: ClassVar[Stored | None] = None
    # the TUI view (its mode name: "recompiles", "ops", ...) that shows events of this kind
    view: ClassVar[str | None] = None

    id: int
    ts: float
    mode: str | None
    thread: int
    location: SourceLocation | None


EVENT_TYPES: dict[str, type[Event]] = {}


def register_event(cls: type[Event]) -> type[Event]:
    """Make ``cls`` an event kind the run store records and reads back (a class decorator).

    Raises:
        TypeError: ``cls`` is no frozen, slotted Event dataclass with a ``stored`` declaration.
        ValueError: another class already registered its ``kind``.

    Example:
        >>> @register_event
        ... @dataclasses.dataclass(frozen=True, slots=True)
        ... class CheckpointEvent(Event):
        ...     kind: ClassVar[str] = "checkpoint"
        ...     stored: ClassVar[Stored] = Stored("checkpoints", name="path", seconds="seconds")
        ...     path: str
        ...     seconds: float
    """
    if not (
        isinstance(cls, type)
        and issubclass(cls, Event)
        and dataclasses.is_dataclass(cls)
        and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        and "__slots__" in cls.__dict__
    ):
        raise TypeError(
            f"{cls!r} is not a frozen, slotted Event dataclass; declare it with "
            "@dataclasses.dataclass(frozen=True, slots=True)"
        )
    if not isinstance(cls.__dict__.get("stored"), Stored):
        raise TypeError(f"{cls.__name__} declares no 'stored' (a Stored: its table and header fields)")
    known = EVENT_TYPES.get(cls.kind)
    if known is not None and known is not cls:
        raise ValueError(
            f"event kind {cls.kind!r} is registered twice: {known.__module__}.{known.__qualname__} "
            f"and {cls.__module__}.{cls.__qualname__}"
        )
    hints = typing.get_type_hints(cls)
    for f in carried_fields(cls):
        record = hints[f.name]
        if not dataclasses.is_dataclass(record):
            raise TypeError(f"{cls.__name__}.{f.name}: a carried field holds a record (a dataclass), not {record!r}")
        missing = [s for s in f.metadata["skip"] if next(
            (g for g in dataclasses.fields(record) if g.name == s and g.default is not dataclasses.MISSING), None) is None]
        if missing:
            raise TypeError(f"{cls.__name__}.{f.name}: skipped fields {missing} have no default to read back")
        _answer_for(cls, f, record)
    EVENT_TYPES[cls.kind] = cls
    return cls


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class OpEvent(Event):
    """One execution of an eager op's executable (recorded only with
    ``op_events=True``; otherwise executions are aggregated per program)."""

    kind: ClassVar[str] = "op"
    view: ClassVar[str | None] = "ops"
    stored: ClassVar[Stored] = Stored(
        None, name="name", seconds="seconds", program="program", header="executions"
    )

    name: str
    seconds: float
    program: str | None = None  # content hash of the program, see CompileEvent


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CompileEvent(Event):
    """An executable was compiled: an eager op for one key, or a compiled graph.

    ``program`` is the content hash of its HLO (stored once per run; ``None``
    when HLO recording is off). ``previous`` is the id of the compile of the
    same ``name`` whose key is closest, and ``diffs`` how this key differs
    from it: both are empty for a first compile.
    ``identity`` is what was compiled again: the op, or for a graph the
    function dynamo compiled and the direction (``"step in train.py (forward)"``,
    see ``tracers/reading/recompile_analysis.py``). A compile with diffs is a recompile; its
    ``previous`` is None when the closest key was compiled before the trace.
    ``from_cache`` marks an executable read back from the persistent compile
    cache: nothing was compiled (``seconds`` is the read-back, ``saved_seconds``
    the compile time it saved), so it is never a compile or a recompile: compile
    and recompile counts leave it out and count it apart (its ``diffs`` still say
    what is new about its key).

    Where its time went, as the runtime measured it: ``wall_seconds`` is the runtime's whole
    compile of the program, of which ``lower_seconds`` traced it to a jaxpr and lowered it to
    StableHLO, ``xla_seconds`` is XLA's compile for this machine and ``read_seconds`` the
    read-back from the persistent compile cache (see ``tracers/reading/compile_time.py``;
    a run recorded before they were measured reads its ``seconds`` as XLA's compile or the
    read-back, and as the wall time). ``frame`` is dynamo's compile id (``"0/1"``) of a
    compiled graph's capture. ``hlo_before`` counts the operations of the StableHLO module
    XLA was handed, ``hlo_after`` the instructions of its optimized HLO (None: HLO not
    recorded). ``cache_entry`` is the persistent compile cache's file the program was looked
    up at (None: the cache was off); ``cache_miss`` why an earlier run's compile of the same
    program was not read back (``"flag"``, ``"version"``, ``"path"``, ``"program"``: see
    ``runtime/compile_cache.py``'s ``why_missed``), with ``cache_miss_detail`` saying which.
    """

    kind: ClassVar[str] = "compile"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("compiles", name="name", seconds="seconds", program="program")

    name: str
    signature: str
    args: tuple[ArgInfo, ...]
    seconds: float
    program: str | None = None
    previous: int | None = column("previous_id", default=None)
    diffs: tuple[KeyDiff, ...] = column(table="key_diffs", default=())
    identity: str | None = None
    from_cache: bool = False
    saved_seconds: float = 0.0
    wall_seconds: float = column(default=0.0, legacy="{seconds}")
    lower_seconds: float = 0.0
    xla_seconds: float = column(default=0.0, legacy="CASE WHEN {from_cache} THEN 0 ELSE {seconds} END")
    read_seconds: float = column(default=0.0, legacy="CASE WHEN {from_cache} THEN {seconds} ELSE 0 END")
    frame: str | None = None
    hlo_before: int | None = None
    hlo_after: int | None = None
    cache_entry: str | None = None
    cache_miss: str | None = None
    cache_miss_detail: str | None = None


# the phases a compile's time is split into (tracers/reading/compile_time.py), in the order a
# compile goes through them; "other" is what no measured phase holds
COMPILE_PHASES = (
    "dynamo_trace",
    "dynamo_guards",
    "aot_graph",
    "aot_partition",
    "lowering",
    "xla_compile",
    "target_compile",
    "cache_read",
    "other",
)


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CompilePhaseEvent(Event):
    """A span of dynamo's compile of a function, as dynamo timed it (its compile events, what
    ``torch._dynamo.utils.compile_times()`` and tlparse read): ``seconds`` from ``ts``.

    ``unit`` is ``"frame"`` for dynamo's whole compile of one frame (``entire_frame_compile``)
    and ``"backward"`` for AOTAutograd's deferred compile of its backward
    (``entire_backward_compile``): the spans a compile's wall time is read from, their time
    that no phase inside them holds being ``"other"``. Otherwise ``unit`` is None and
    ``phase`` names one of :data:`COMPILE_PHASES` (``"dynamo_trace"``: bytecode tracing,
    ``"dynamo_guards"``: building the guards, ``"aot_graph"``: AOTAutograd's metadata pass and
    joint graph, ``"aot_partition"``: its split into forward and backward). ``source`` is
    dynamo's name of the span, ``compile_id`` its compile (``"0/1"``), ``function`` the
    function compiled, when dynamo said.
    """

    kind: ClassVar[str] = "compile_phase"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("compile_phases", name="phase", seconds="seconds")

    phase: str
    seconds: float
    source: str
    unit: str | None = None
    compile_id: str | None = None
    function: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class LineCost:
    """What one source line of the user's code put into a compiled program: its graph nodes
    (``nodes``), the StableHLO operations lowered from them (``hlo_before``) and the optimized
    HLO instructions that carry their names (``hlo_after``). ``file`` None: what no node's line
    is known for (a program's parameters and outputs, what XLA adds). ``instances``: the
    distinct instances of one class of the user's modules the line was traced in, ``module``
    that class (a loop over 12 layers traces a layer's line in 12 instances of its class);
    ``caller_*``: the user's line that called the line's function (the loop's line), when the
    graph's stack traces show one."""

    file: str | None
    line: int | None
    function: str | None
    nodes: int
    hlo_before: int
    hlo_after: int
    instances: int = 0
    module: str | None = None
    caller_file: str | None = None
    caller_line: int | None = None
    caller_function: str | None = None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CompileLinesEvent(Event):
    """The source lines a compiled graph's program came from (compiled mode's graphs, lazy
    mode's fused graphs), each with its share of the program (:class:`LineCost`): the
    compile ``compile_event`` (a :class:`CompileEvent`'s id) of program ``name``. Their
    ``hlo_before`` and ``hlo_after`` add up to the compile's."""

    kind: ClassVar[str] = "compile_lines"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("compile_lines", name="name")

    name: str
    compile_event: int
    lines: tuple[LineCost, ...] = column(table="compile_line_costs", default=())


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class TransferEvent(Event):
    """Data crossed between host and device: the runtime's record of the copy (``transfer``:
    direction, bytes, shape, dtype, its time, the upload's fingerprint, and ``transfer.op``, how
    the runtime was asked: ``"item"``, ``"to"``, ``"copy"``, ``"scalar"``, ...), and what the
    user did that moved it.

    ``op`` is that cause, read from the user's stack (``tracers/recording/transfer_sites.py``):
    ``"item"``, ``"tolist"``, ``"print"``, ``"bool"``, ``"float"``, ``"int"``,
    ``"index"``, ``"scalar"`` (a CPU scalar operand), ``"fallback:<aten op>"``,
    ``"cpu"``, ``"to"``, ``"tensor"``, ``"copy"``; ``implicit`` is true when the
    user did not ask for a copy (a sync forced by ``.item()``, ``print``,
    ``if t:``, a scalar operand, a CPU fallback). ``context`` is the library frame that moved
    the data when it was not the user's own line (``"file:line in function"``: a sync inside
    transformers' ``generate()``, reached from ``location``), else None; ``origin``, for an
    upload, the factory that made the data on the host in the step as the user's line shows it
    (``"torch.randn"``: data that could be made on the device; ``recording/host_origin.py``), and
    what it goes with: ``follows``, the tensor whose shape or device the code reads for it
    (``"x_start"`` of ``torch.randn(x_start.shape).to(x_start.device)``), ``module``, the
    ``nn.Module`` class whose method uploads it (``"GaussianDiffusion"``), and ``made_line``, the
    line of the upload's file and function that made it when that is another line than the
    upload's (``noise = torch.randn(...)`` two lines above ``noise.to("tpu")``), else None.
    """

    kind: ClassVar[str] = "transfer"
    view: ClassVar[str | None] = "transfers"
    stored: ClassVar[Stored] = Stored("transfers", name="op", seconds="transfer.seconds")

    # the header's name holds the cause, as it always has; the runtime's own word is "runtime_op"
    # (a run recorded before it was kept reads the cause there too)
    transfer: TransferInfo = carried(columns={"op": "runtime_op"}, legacy={"op": "{name}"})
    op: str
    implicit: bool
    context: str | None = None
    origin: str | None = None
    follows: str | None = None
    module: str | None = None
    made_line: int | None = None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveCallEvent(Event):
    """A rank entered a c10d collective of the `tpu` process group (``dist.all_reduce``, DDP's
    bucket all-reduce, an FSDP2 all-gather...), at ``location``, the user's line: the runtime's
    :class:`~tpu_debug.core.records.CollectiveInfo`, carried as ``call``. Recorded on entry, so
    a rank stuck in a collective has recorded it; comparing the ranks' sequences per group
    (``group``, ``seq``) shows where they stopped calling the same collectives.
    """

    kind: ClassVar[str] = "collective_call"
    stored: ClassVar[Stored] = Stored("collective_calls", name="call.op")

    # GROUP is an SQL keyword; the shapes were once kept as text ("[4, 2]")
    call: CollectiveInfo = carried(
        columns={"group": "group_name", "ranks": "group_ranks", "shapes": "shape_dims"},
        legacy={"shapes": "REPLACE({shapes}, '\"', '')"},
    )


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveDoneEvent(Event):
    """A rank returned from the c10d collective it entered as the :class:`CollectiveCallEvent`
    with the same ``group``, ``rank`` and ``seq``: the runtime's
    :class:`~tpu_debug.core.records.CollectiveDone`, carried as ``done``. A call with no done
    event is one the rank never returned from: it was stuck there, raised or was killed.
    """

    kind: ClassVar[str] = "collective_done"
    stored: ClassVar[Stored] = Stored("collective_dones", name="done.op", seconds="done.seconds")

    done: CollectiveDone = carried(columns={"group": "group_name"})  # GROUP is an SQL keyword



# a rank's shapes as runs recorded them before they were a list: "[4]; [2, 3]" -> ["[4]", "[2, 3]"]
_JOINED_SHAPES = "CASE WHEN {shapes} = '' THEN '[]' ELSE '[\"' || REPLACE({shapes}, '; ', '\", \"') || '\"]' END"


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveDesyncEvent(Event):
    """The live check of a c10d group found its ranks calling different collectives, or a rank
    not arriving, and this rank raised: the runtime's :class:`~tpu_debug.core.records.DesyncInfo`
    (each rank's :class:`~tpu_debug.core.desync.RankCall` among it), carried as ``desync``;
    ``location`` is this rank's line.
    """

    kind: ClassVar[str] = "collective_desync"
    stored: ClassVar[Stored] = Stored("collective_desyncs", name="desync.reason")

    # GROUP is an SQL keyword; each rank's shapes were once kept joined by "; "
    desync: DesyncInfo = carried(
        columns={"group": "group_name", "ranks": "group_ranks", "calls": "collective_desync_calls",
                 "calls.shapes": "shape_list"},
        legacy={"message": "''", "calls.shapes": _JOINED_SHAPES},
    )


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class FallbackEvent(Event):
    """An op ran on CPU because it has no lowering: the runtime's
    :class:`~tpu_debug.core.records.FallbackInfo`, carried as ``fallback`` (its arguments in
    their recorded form)."""

    kind: ClassVar[str] = "fallback"
    view: ClassVar[str | None] = "ops"
    stored: ClassVar[Stored] = Stored("fallbacks", name="fallback.op", seconds="fallback.seconds")

    fallback: FallbackInfo = carried()

    @property
    def name(self) -> str:
        """The op, as the ops table names rows."""
        return self.fallback.op


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class GraphBreakEvent(Event):
    """Dynamo split a compiled function.

    ``name`` is the function, ``reason`` dynamo's ("Data-dependent branching:
    ..."), ``location`` the user's line that broke the graph or reached the break.
    ``context`` is the library frame where the break is, when it is not in user
    code (``".../torch/_dynamo/external_utils.py:69 in inner"``), and
    ``deliberate`` marks a break PyTorch's own code makes on purpose around
    Python-only work (``torch._dynamo.graph_break()`` in ``torch/optim``).
    """

    kind: ClassVar[str] = "graph_break"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("graph_breaks", name="name")

    name: str
    reason: str
    context: str = ""
    deliberate: bool = False


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class GuardFailureEvent(Event):
    """Dynamo found no cached graph of a function whose guards pass, and compiles it again.

    ``name`` is the function, ``compile_id`` dynamo's id of the new compile
    (``"0/3"``), ``guards`` the failed guard of each cached entry, most recent
    first (``"0/2: tensor 'x' size mismatch at index 0. expected 8, actual 9"``);
    ``location`` is the user's call.
    """

    kind: ClassVar[str] = "guard_failure"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("guard_failures", name="name")

    name: str
    compile_id: str
    guards: tuple[str, ...]


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class RecompileLimitEvent(Event):
    """A function hit dynamo's recompile limit: from then on it runs without compiling.

    ``name`` is the function in the user's names (a module's class, the name it is called by
    and the line that compiled it; a function's name and line), ``limit_type`` names the limit
    (``"recompile_limit"``), ``limit`` its value, ``reason`` the last failed guard, ``identity``
    the identity its compiles carry (their forward graph's; None when not known).
    """

    kind: ClassVar[str] = "recompile_limit"
    view: ClassVar[str | None] = "recompiles"
    stored: ClassVar[Stored] = Stored("recompile_limits", name="name")

    name: str
    limit_type: str
    limit: int = column("limit_value")  # LIMIT is an SQL keyword
    reason: str
    identity: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Crossing:
    """Elements that took another branch of a non-smooth op on the device than in the CPU run.

    A relu passes an element the device computed as ``+1e-9`` and zeroes the
    CPU's ``-1e-9``: a float32 rounding difference becomes a difference of a
    whole value there, and later (a gradient through that relu) one far over
    tolerance. ``op`` is the op (``relu``, ``threshold_backward``, ``gt.Scalar``,
    ``max.dim``), ``branch`` what was crossed (``"zero"``, ``"bounds"``,
    ``"threshold"``, ``"comparison"``, ``"tie"``), ``elements`` how many of its
    ``numel`` elements crossed; ``module`` the module whose forward ran it
    (``layer3.0.relu``; empty when unknown), ``file``/``line`` its source line.

    Example:
        >>> Crossing("relu", 1, 4096, branch="zero", module="layer3.0", file="/x/net.py", line=20).render()
        "1 element (of 4096) crosses relu's zero in `layer3.0` (net.py:20)"
    """

    op: str
    elements: int
    numel: int
    branch: str = "zero"
    module: str = ""
    file: str = ""
    line: int = 0
    phase: str = "forward"

    def render(self) -> str:
        one = self.elements == 1
        text = (
            f"{self.elements} element{'' if one else 's'} (of {self.numel}) "
            f"cross{'es' if one else ''} {self.op}'s {self.branch}"
        )
        where = []
        if self.module:
            where.append(f"in `{self.module}`")
        if self.file:
            where.append(f"({self.file.rsplit('/', 1)[-1]}:{self.line})")
        if self.phase == "backward":
            where.append("in backward")
        return " ".join([text, *where])


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class DivergenceEvent(Event):
    """An op or graph node's result compared with PyTorch on CPU (``tracers/recording/divergence/``).

    ``measure`` is ``"local"`` (CPU op on the device op's inputs) or
    ``"drift"`` (against a CPU shadow of the whole computation). ``name`` is the
    aten op (eager) or the FX node (compiled; ``target`` is its aten op and
    ``graph`` the compiled graph). ``mismatched`` counts elements over
    tolerance (``|device - cpu| > atol + rtol * |cpu|``, or NaN/Inf on one
    side only); ``tolerance`` is the allowed absolute error at the worst
    element and ``ratio`` the worst error in units of its tolerance.
    ``nan_origin``: the device output holds NaN/Inf its inputs did not.
    ``first``: the first over tolerance (per measure; per graph when compiled).
    ``highest``: with TPU numerics, whether the op is within tolerance when re-run
    at precision "highest" (None: not checked).

    Triage (``tracers/recording/divergence/triage.py``): ``verdict`` is ``"noise"`` (rounding
    differences of the dtype, no op is wrong), ``"wrong"`` (an op computes something
    else than PyTorch) or ``""`` (not triaged). ``basis`` says how it was reached:
    ``"float64"``, the op re-run in float64 on both sides on the same inputs upcast
    (``f64_max_abs``, ``f64_mismatched``: what differed then); ``"upstream"``, a
    drift whose op matches CPU on its own inputs, judged by the ops before it:
    ``upstream`` names the op over tolerance it comes from (``"silu at
    model.py:12"``), ``crossings`` the elements that took another branch of a
    non-smooth op on its way (the first ones, in order).
    """

    kind: ClassVar[str] = "divergence"
    view: ClassVar[str | None] = "divergence"
    stored: ClassVar[Stored] = Stored("divergences", name="name")

    name: str
    measure: str
    max_abs: float
    max_rel: float
    ulp: float | None
    mismatched: int
    nan_origin: bool
    tolerance: float
    first: bool
    # the measurement's details, with defaults so a caller names only those it has
    rtol: float = 0.0
    atol: float = 0.0
    ratio: float = 0.0
    numel: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""  # the CPU result's
    device_dtype: str = ""  # differs from dtype on a dtype mismatch
    device_nonfinite: int = 0  # elements NaN/Inf on the device only
    cpu_nonfinite: int = 0  # elements NaN/Inf on CPU only
    phase: str = "forward"  # "forward" | "backward"
    graph: str | None = None
    target: str = ""
    autograd_node: str = ""  # eager backward: the autograd node that ran the op
    highest: bool | None = None
    verdict: str = ""  # "noise" | "wrong" | "" (not triaged)
    basis: str = ""  # "float64" | "upstream" | ""
    f64_max_abs: float | None = None
    f64_mismatched: int = 0
    upstream: str = ""
    crossings: tuple[Crossing, ...] = column(table="divergence_crossings", default=())

    @property
    def over(self) -> bool:
        """Some element is over tolerance."""
        return self.mismatched > 0

    def triage_text(self) -> str:
        """The verdict as a sentence (empty when not triaged).

        Example:
            >>> e = DivergenceEvent(1, 0.0, "eager", 1, None, "sum", "local", 0.1, 1e-6, None, 3, False,
            ...                     1e-5, True, dtype="float32", verdict="noise", basis="float64",
            ...                     f64_max_abs=2e-17)
            >>> e.triage_text()
            'float32 noise: in float64 the device matches CPU (max |error| 2e-17)'
        """
        floating = self.dtype.startswith(("float", "bfloat", "complex"))
        noise = f"{self.dtype} noise" if floating else "rounding noise"  # a bool result: the noise upstream
        if self.basis == "float64" and self.verdict == "noise":
            return f"{noise}: in float64 the device matches CPU (max |error| {_fmt(self.f64_max_abs)})"
        if self.basis == "float64" and self.verdict == "wrong":
            return (
                f"the op is wrong: in float64 the device still differs ({self.f64_mismatched} element(s), "
                f"max |error| {_fmt(self.f64_max_abs)})"
            )
        if self.basis != "upstream" or self.verdict not in ("noise", "wrong"):
            return ""
        if self.verdict == "wrong":
            return f"an op before it is wrong: {self.upstream} (in float64 the device still differs there)"
        text = f"{noise}: this op matches CPU on its own inputs"
        if self.crossings:
            return f"{text}; the difference starts where {self.crossings[0].render()}"
        if self.upstream:
            return f"{text}; the difference starts at {self.upstream} (in float64 the device matches there)"
        return f"{text}, as does every op before it; their rounding differences add up"

    @property
    def dtype_mismatch(self) -> bool:
        return bool(self.device_dtype) and self.device_dtype != self.dtype


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.2g}"


# how many internal errors of one ``where`` the store keeps; it counts the rest
INTERNAL_ERRORS_KEPT = 100


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class InternalErrorEvent(Event):
    """A tracer failed; the traced program went on. Kept so the report can say so.

    The run store keeps the first :data:`INTERNAL_ERRORS_KEPT` of each ``where``
    and counts the rest (``RunQuery.capped_counts("internal_error")``).
    """

    kind: ClassVar[str] = "internal_error"
    stored: ClassVar[Stored] = Stored("internal_errors", name="where", cap=("where", INTERNAL_ERRORS_KEPT))

    where: str
    message: str


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class InvalidValueEvent(Event):
    """An op was called with argument values PyTorch on CPU refuses and XLA computes with
    silently (``runtime/value_checks.py``): an index out of range, which a TPU clamps into
    range and reads another row with; a probability distribution with a negative, ``nan``
    or ``inf`` entry, which a TPU samples from (``tracers/recording/invalid_value_tracer.py``
    records it). It carries the runtime's :class:`~tpu_debug.core.records.InvalidValueInfo`
    (``check``: the op, the argument, the first offending value and the values accepted,
    PyTorch's error and its type, what XLA does instead, whether it was raised).

    ``location`` is the user's line: the op's caller (eager), the line that recorded the
    op (lazy), the line dynamo recorded for the graph node (compiled); the record's ``site``
    and ``node``, which lead there while recording, are not kept. ``phase`` is
    ``"backward"`` for an op autograd ran (``autograd_node``: its node in eager and lazy
    mode, ``"GatherBackward0"``), else ``"forward"``.

    One place is recorded per (line, op, argument): its first occurrence at once, and,
    when it came again, one more event as the trace ends whose ``count`` is how many
    times it came in all (``session.invalid_values()`` keeps the last one of each place).
    """

    kind: ClassVar[str] = "invalid_value"
    stored: ClassVar[Stored] = Stored("invalid_values", name="check.op")

    check: InvalidValueInfo = carried(skip=("site", "node"), legacy={"mode": "NULL"})
    phase: str = "forward"
    autograd_node: str = ""
    count: int = 1


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class MaterializationEvent(Event):
    """Lazy mode ran its pending graph because a value was needed (runtime/lazy.py).

    ``trigger`` is what needed it, as :mod:`.lazy_graphs` names it: a host read
    (``"item"``, ``"print"``, ``"bool"``, ``"float"``, ``"int"``, ``"tolist"``,
    ``"index"``, ``"numpy"``, ``"cpu"``, ``"to"``, ``"copy"``), ``"read"`` (a value
    read by a compiled program or another path), ``"synchronize"``,
    ``"optimizer_step"``, ``"size_limit"``, ``"mode_change"``,
    ``"fallback:<op>"`` or ``"data_dependent:<op>"``; ``location`` is the user's
    line that needed it. ``graph`` is its program's name, ``program`` its HLO hash
    and ``compile`` the id of its compile event when it compiled for this run
    (``compiled``). ``ops``: ops recorded; ``outputs``: values computed (0: nothing
    still referenced, nothing ran); ``inputs``: arrays read. ``step``: optimizer
    steps ended before it (each ``optimizer.step()`` ends one). ``seconds``: the
    whole materialization, compile included. ``after_step``: the read that needed it
    is written after the ``optimizer.step()`` call that ended the last step
    (:class:`~.lazy_graphs.StepFrames`), so it does not cut a step's work.
    """

    kind: ClassVar[str] = "materialize"
    view: ClassVar[str | None] = "recompiles"  # lazy mode's fused graphs are compiles there
    stored: ClassVar[Stored] = Stored("materializations", name="trigger", seconds="seconds", program="program")

    trigger: str
    graph: str
    ops: int
    outputs: int
    inputs: int
    compiled: bool
    seconds: float
    step: int
    program: str | None = None
    compile: int | None = column("compile_id", default=None)
    # a read written after the optimizer.step() that ended the last step (a metric after the
    # step, a read after an inner loop): it runs what came after the step, not part of one
    after_step: bool = False


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class WaitEvent(Event):
    """The program's thread waited on something other than its own Python (recorded by
    ``tracers/recording/step_hooks.py``, one event per wait, at the user's line).

    ``what``: ``"input"`` (a ``DataLoader`` iterator's ``__next__``: loading, collating
    and pinning the next batch, or waiting for the workers that do), ``"checkpoint"``
    (``torch.save``, ``torch.distributed.checkpoint``'s ``save``/``async_save``, its
    blocking part) or ``"synchronize"`` (``torch.tpu.synchronize()`` waiting for the
    device's queued work). ``api`` names the call (``"DataLoader"``, ``"torch.save"``,
    ``"dcp.save"``, ``"dcp.async_save"``, ``"torch.tpu.synchronize"``). A loader's
    ``workers``, ``pin_memory`` and ``prefetch_factor`` are its settings (None for
    other waits), so a fix can name the one to change.
    """

    kind: ClassVar[str] = "wait"
    view: ClassVar[str | None] = "steps"
    stored: ClassVar[Stored] = Stored("waits", name="what", seconds="seconds")

    what: str
    seconds: float
    api: str
    workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None


def event_type(kind: str) -> type[Event]:
    """The event class for ``kind``.

    Raises:
        ValueError: ``kind`` names no event type.
    """
    try:
        return EVENT_TYPES[kind]
    except KeyError:
        raise ValueError(
            f"unknown event kind {kind!r}; known kinds: {', '.join(sorted(EVENT_TYPES))}"
        ) from None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class StepEvent(Event):
    """One training step, with what ran in it (``tracers/recording/step_tracker.py`` records these).

    A step is the work between two step ends: each ``optimizer.step()`` that
    updates ``tpu`` parameters (``detected="optimizer"``), each explicit
    ``tpu_debug.step()`` (``"explicit"``; once used, only explicit marks count),
    or, for a run with neither, each iteration of the loop found in the
    sequence of ops the run executed (``"loop"``, recorded when the trace ends).
    What ran after the last step end is no step of the run; ``StepTracker.unfinished``
    describes it, unrecorded, with ``"unfinished"``. ``index`` counts from 0, as ``for step in range(n)`` and xprof's step
    numbers do; ``ts`` is when the step began and ``end`` when it ended
    (``seconds`` between them). Every other event belongs to the step whose
    [``ts``, ``end``) holds its ``ts`` (see ``tracers.reading.step_phases.StepIndex``).

    The counts are what ran in the step: eager op executions, compiled-graph
    runs and their dispatch time, compiles (and how many compiled an op or
    graph compiled before), transfers, CPU fallbacks. ``sequence`` is a hash of
    the executables run, in order: two steps with the same ``sequence`` ran
    the same programs (the warm-up ends when it repeats; see
    ``tracers.reading.step_phases.step_phases``). ``read_backs`` counts executables read back
    from the persistent compile cache: not compiles, but a step that makes
    programs ready all the same (warm-up); ``read_back_seconds`` the time that took, which is
    the compile side of the step (what a cold cache would have spent compiling);
    ``trace_seconds`` dynamo's own work compiling frames (tracing a graph, AOTAutograd), beside
    the XLA compiles it asks for, which is the compile side too. ``optimizer_seconds`` is the
    time inside a ``tpu`` optimizer's ``step()`` (its Python and its ops), ``optimizer_ops`` the
    eager ops it ran and ``optimizer_op_seconds`` their time, compiles included (their runs hold
    any wait for the device work queued before them): an optimizer left outside a compiled
    step (``advisor.step_rules``).

    Where the step's time went, on the thread that ran it (``tracers.reading.step_time``
    splits ``seconds`` into parts from these): ``input_seconds`` waiting for
    input (a ``DataLoader``'s ``__next__``, host-to-device copies), ``sync_seconds``
    waiting on the device (device-to-host reads such as ``.item()``,
    ``torch.tpu.synchronize()``), ``collective_seconds`` in c10d collectives,
    ``checkpoint_seconds`` saving checkpoints (``torch.save``, DCP's ``save``).
    Compiles and op runs inside one of those are its time: ``inner_op_seconds``
    and ``inner_compile_seconds`` say how much of ``op_seconds`` and of
    ``compile_seconds`` with ``read_back_seconds`` and ``trace_seconds`` that was. None in a run recorded before the split was
    kept, and in an imported log's steps.
    """

    kind: ClassVar[str] = "step"
    view: ClassVar[str | None] = "steps"
    stored: ClassVar[Stored] = Stored("steps", name="detected", seconds="seconds")

    index: int = column("step_index")  # INDEX and END are SQL keywords
    detected: str
    end: float = column("end_ts")
    seconds: float
    eager_ops: int = 0
    graph_runs: int = 0
    op_seconds: float = 0.0
    compiles: int = 0
    recompiles: int = 0
    compile_seconds: float = 0.0
    transfers: int = 0
    transfer_bytes: int = 0
    transfer_seconds: float = 0.0
    fallbacks: int = 0
    sequence: str = ""
    read_backs: int = 0
    input_seconds: float | None = None
    sync_seconds: float | None = None
    collective_seconds: float | None = None
    checkpoint_seconds: float | None = None
    inner_op_seconds: float = 0.0
    inner_compile_seconds: float = 0.0
    read_back_seconds: float = 0.0
    trace_seconds: float = 0.0
    optimizer_ops: int = 0
    optimizer_seconds: float = 0.0
    optimizer_op_seconds: float = 0.0

    @property
    def ops(self) -> int:
        """Executions in the step: eager ops and compiled-graph runs."""
        return self.eager_ops + self.graph_runs


# -- collectives (tracers/reading/program_collectives.py) --------------------------------------------------

# one collective instruction, as core/collectives.py reads it from a program's HLO:
# shared with the runtime (ranks compare collectives before running a program together)
from tpu_debug.core.collectives import Collective  # noqa: E402

__all__ += ["Collective", "CollectivesEvent"]


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CollectivesEvent(Event):
    """What a program spread over several devices costs each device: its collectives
    (which XLA's SPMD partitioner inserted, with bytes, groups and the op and line
    that caused each) and the memory one device needs for it.

    ``name`` is the op or graph (as in :class:`CompileEvent`), ``program`` the
    content hash of its HLO (None when HLO is not recorded, or for a target),
    ``devices`` how many devices the program runs on. ``target`` is empty for
    this run's own devices; for a TPU target (``"v5e:2x4"``) the same program
    compiled by XLA's TPU compiler for that topology, where ``error`` holds the
    compiler's refusal (an HBM out-of-memory) when there is one. Memory figures
    are bytes per device from XLA's buffer assignment (None when the backend
    gives none).
    """

    kind: ClassVar[str] = "collectives"
    view: ClassVar[str | None] = "collectives"
    stored: ClassVar[Stored] = Stored("collective_programs", name="name", seconds="seconds", program="program")

    name: str
    program: str | None
    devices: int
    target: str
    collectives: tuple[Collective, ...] = column(table="collective_ops", default=())
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    code_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def memory_bytes(self) -> int | None:
        """Arguments + outputs - aliased + temporaries + code: what one device holds for it."""
        parts = (self.argument_bytes, self.output_bytes, self.temp_bytes)
        if any(p is None for p in parts):
            return None
        return sum(parts) - (self.alias_bytes or 0) + (self.code_bytes or 0)

    @property
    def collective_bytes(self) -> int:
        """Bytes each device sends for one run of the program (ring estimates)."""
        return sum(c.wire_bytes for c in self.collectives)


# -- TPU target (tracers/reading/target_findings.py) ------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PaddedBuffer:
    """One array of a target program that TPU tiles pad (a row of ``target_padding``).

    ``name``/``opcode`` are the HLO instruction holding it in the program's entry
    computation (``parameter`` for an input), ``layout`` its TPU layout
    (``{1,0:T(8,128)}``). ``padded_bytes - logical_bytes`` is what the tiles waste.
    ``pad_dims`` are the logical dimensions the tiles pad, ``pad_multiples`` the
    multiple each would have to be to pad nothing (128 lanes, 8 sublanes for
    float32). ``op`` is what made it: the aten op of an eager program, the FX
    node (``addmm_1|aten::addmm``) of a compiled one; ``file``/``line``/``function``
    the user line of that op or node. ``flops_wasted``: for the result of a matrix
    multiply or convolution, the products its padded output tiles compute for
    nothing (its flops times padded / logical output elements, minus its flops).
    """

    name: str
    opcode: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    logical_bytes: int
    padded_bytes: int
    pad_dims: tuple[int, ...] = ()
    pad_multiples: tuple[int, ...] = ()
    op: str = ""
    flops_wasted: float = 0.0
    file: str | None = None
    line: int | None = None
    function: str | None = None

    @property
    def wasted_bytes(self) -> int:
        return self.padded_bytes - self.logical_bytes

    @property
    def waste(self) -> float:
        """Fraction of the padded bytes that is padding (0.22 for 100 of 128)."""
        return self.wasted_bytes / self.padded_bytes if self.padded_bytes else 0.0


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class TargetCompileEvent(Event):
    """One program the runtime compiled, compiled again for a real TPU target
    (``trace(target="v5e")``, :mod:`.target`).

    ``name`` is the op or graph as its local compile names it, ``identity`` what
    was compiled (the op, or the function dynamo compiled and its direction),
    ``program`` the local program's content hash (None when HLO recording is
    off) and ``tpu_program`` the content hash of the TPU's optimized HLO, stored
    once per run in the same programs table (mode ``"target"``). ``location`` is
    the user line that made the runtime compile it.

    ``status``: ``"ok"``, ``"hbm_oom"`` (the program does not fit one device's
    HBM: ``required_bytes`` of ``available_bytes``, for ``error_what``) or
    ``"compile_error"``; ``error_code`` XLA's code of the refusal (``"E1001:
    CompileTimeScopedVmemOom"``: ``runtime/target/error_codes.py`` says what it means and
    what to change), printed by the compiler (``error_code_printed``) or recognised from its
    message; ``error_instruction`` the HLO instruction the message is about, with the op
    (``error_op``) and the PyTorch line (``error_file``/``error_line``/``error_function``)
    that made it; ``error_source_file``/``error_source_line``/``error_source_function`` the
    line of a Pallas kernel whose operation Mosaic refused (E2001-E2003). ``seconds`` is the TPU compile time (of the compile that
    produced the result when it came from the on-disk cache: ``cached``);
    ``relowered``: the local lowering held a CPU-only custom call, so the function
    was lowered again for the TPU.

    Memory is per device, from XLA's buffer assignment; cost is the TPU
    compiler's (``flops``, ``transcendentals``, ``bytes_accessed``;
    ``xla_seconds`` its own time estimate). ``intensity``, ``bound`` and
    ``estimated_seconds`` place it on the target's roofline (a model estimate:
    max(flops / peak, bytes / HBM bandwidth)). ``padding_*`` add up the arrays
    of the entry computation, ``worst`` the ones the tiles pad most.

    ``larger_targets`` (an HBM out-of-memory): the generations whose one device
    offers more HBM than ``required_bytes``, with what their compiler offers
    (``larger_hbm_bytes``) and their spec sheet's figure (``larger_spec_bytes``).
    ``optimization_level``: XLA's effort level of the compile (None: the
    compiler's default; a dry run compiles at ``"O0"``, whose temporaries and
    bytes accessed can differ from the default level's; flops do not).
    """

    kind: ClassVar[str] = "target_compile"
    view: ClassVar[str | None] = "ops"
    stored: ClassVar[Stored] = Stored("target_compiles", name="name", seconds="seconds", program="program")

    name: str
    target: str
    signature: str
    args: tuple[ArgInfo, ...]
    seconds: float
    status: str
    identity: str | None = None
    program: str | None = None
    tpu_program: str | None = None
    cached: bool = False
    relowered: bool = False
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    code_bytes: int | None = None
    flops: float | None = None
    transcendentals: float | None = None
    bytes_accessed: float | None = None
    xla_seconds: float | None = None
    intensity: float | None = None
    bound: str | None = None
    estimated_seconds: float | None = None
    padding_logical_bytes: int | None = None
    padding_padded_bytes: int | None = None
    worst: tuple[PaddedBuffer, ...] = column(table="target_padding", default=())
    error_code: str | None = None
    error_message: str | None = None
    required_bytes: int | None = None
    available_bytes: int | None = None
    error_what: str | None = None
    error_code_printed: bool = False
    error_instruction: str | None = None
    error_op: str | None = None
    error_file: str | None = None
    error_line: int | None = None
    error_function: str | None = None
    error_source_file: str | None = None
    error_source_line: int | None = None
    error_source_function: str | None = None
    larger_targets: tuple[str, ...] = ()
    larger_hbm_bytes: tuple[int, ...] = ()
    larger_spec_bytes: tuple[int, ...] = ()
    optimization_level: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def memory_bytes(self) -> int | None:
        """What one device holds for the program: arguments + outputs - aliased +
        temporaries + code (None when it did not compile)."""
        parts = (self.argument_bytes, self.output_bytes, self.alias_bytes, self.temp_bytes, self.code_bytes)
        if any(p is None for p in parts):
            return None
        arg, out, alias, temp, code = parts
        return arg + out - alias + temp + code  # type: ignore[operator]

    @property
    def padding_wasted_bytes(self) -> int:
        if self.padding_logical_bytes is None or self.padding_padded_bytes is None:
            return 0
        return self.padding_padded_bytes - self.padding_logical_bytes


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class TargetStepEvent(Event):
    """A training step as it would run on the TPU target, estimated from the target
    compiles of the programs it ran (recorded when the trace ends).

    ``step`` is the :class:`StepEvent` index of the step (from 0: the tracer
    listens to the run's steps, so every per-step figure of a run has one
    numbering). Work after the last step end is one more record, ``unfinished``,
    numbered as the next step would have been; in a run that ended no step it is
    the whole run (``whole_run``, step 0). A step that ran no program (an
    optimizer stepping CPU tensors) is not recorded. ``executions`` are the
    program runs of the step, ``estimated`` how many of them have an estimate
    (their program compiled for the target). ``estimated_seconds`` adds up the
    roofline time of each run, back to back, with no host dispatch or launch
    gaps; ``flops``/``bytes_accessed`` add up the compiler's counts. ``mfu`` is
    flops / (estimated_seconds x the device's peak): a model estimate, not a
    measurement. ``peak_memory_bytes`` is the largest program's memory.
    """

    kind: ClassVar[str] = "target_step"
    stored: ClassVar[Stored] = Stored("target_steps", name="target", seconds="estimated_seconds")

    target: str
    # run files of an older layout keep a ``step`` column counted from 1, 0 being the whole run
    step: int = column("step_index", legacy="MAX({step} - 1, 0)")
    executions: int
    estimated: int
    estimated_seconds: float
    flops: float
    bytes_accessed: float
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    unfinished: bool = False
    whole_run: bool = column(default=False, legacy="{step} = 0")


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class TargetSummaryEvent(Event):
    """How the target compiles of a trace went (one per trace, recorded when it ends).

    The target as compiled for (``target`` spec, ``topology``, ``chips``) with the
    per-device figures the estimates use (``hbm_bytes``, ``peak_flops``,
    ``hbm_bandwidth``, from ``runtime/target/hardware.py``); the libtpu version.
    ``programs`` distinct programs were submitted; ``compiled`` of them compiled,
    ``cached`` came from the on-disk cache, ``refused`` were refused by the
    compiler (HBM out-of-memory or another error), ``failed`` could not be compiled
    for a reason of the tracer's, and ``unfinished`` were still compiling or
    queued when the trace stopped waiting (after ``waited_seconds``, at most
    ``wait_limit``): their programs have no estimate. ``compile_seconds`` adds up
    the TPU compile time spent in this run.
    """

    kind: ClassVar[str] = "target_summary"
    stored: ClassVar[Stored] = Stored("target_summaries", name="target")

    target: str
    topology: str
    chips: int
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    libtpu: str
    programs: int
    compiled: int
    cached: int
    refused: int
    failed: int
    unfinished: int
    compile_seconds: float
    waited_seconds: float
    wait_limit: float


# -- device memory (tracers/reading/memory_view.py) ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryHolder:
    """Device bytes live at one moment, grouped by the line that allocated them.

    ``file``/``line``/``function`` are the user's line (``file`` empty for tensors
    allocated before the trace began), ``phase`` when it ran (``"forward"``,
    ``"backward"``, ``"optimizer"``, ``"before trace"``), ``nbytes`` and
    ``tensors`` what that line's storages held then, ``shape``/``dtype`` its largest
    allocation's. With a TPU target ``nbytes`` are the bytes in HBM (padded to the
    target's tiles) and ``logical_bytes`` the same tensors' logical bytes; 0 where not
    recorded. ``kind``: what they are, from when they were made and whether they outlived
    their step (``tracers.recording.memory_tracker.holder_kind``: ``"parameter"``, ``"gradient"``,
    ``"optimizer_state"``, ``"activation"``, ``"temporary"``); "" where not recorded.
    ``call_file``/``call_line``: for the outputs of a compiled graph, whose line is the
    graph node's inside the model, the user's line that called the graph ("" and 0 otherwise).
    """

    file: str
    line: int
    function: str
    phase: str
    nbytes: int
    tensors: int
    shape: tuple[int, ...] = ()
    dtype: str = ""
    logical_bytes: int = 0
    kind: str = ""
    call_file: str = ""
    call_line: int = 0


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStepEvent(Event):
    """Device bytes held by `tpu` tensors over one step (``ts``: the step's start).

    ``live_bytes`` at the step's end, ``peak_bytes`` the most held at once within it
    (at ``peak_ts``), ``tensors`` the storages alive at its end. ``holders``: the
    top holders at the peak, kept only for a step whose peak was the run's highest
    so far. ``step`` is the :class:`StepEvent` index of the step (the memory tracer
    listens to the run's steps); what ran after the last step is one more record,
    and a run without steps is one step.
    """

    kind: ClassVar[str] = "memory_step"
    view: ClassVar[str | None] = "memory"
    stored: ClassVar[Stored] = Stored("memory_steps")

    step: int
    live_bytes: int
    peak_bytes: int
    peak_ts: float
    tensors: int
    holders: tuple[MemoryHolder, ...] = column(table="memory_step_holders", default=())


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class MemorySummaryEvent(Event):
    """The run's device memory, and whether it fits its TPU target (written when the trace ends).

    ``peak_bytes``: the most the `tpu` tensors held at once (in step ``peak_step``,
    of the ``steps`` the run's step source ended; 1 for a run without steps);
    ``persistent_bytes`` what was still held at that step's end (parameters,
    gradients, optimizer state, inputs kept); ``activation_bytes`` the forward's
    tensors held at the peak and gone by the step's end (kept for backward);
    ``float32_bytes`` float32 tensors at the peak. ``temp_bytes``: the temporaries
    of ``temp_program``, the program whose temporaries on top of what was held when
    it began (``temp_live_bytes``; None: not known, counted at the peak) reach
    highest (``temp_source`` ``"target"``: the TPU compiler's figure, ``"local"``:
    this machine's compiler's). ``required_bytes``: the larger of the peak and that
    sum, the estimate compared with ``capacity_bytes``, one device of ``target``
    (``fits`` None without a target); ``trains``: a backward pass or an optimizer
    step allocated (an inference run has no gradients or optimizer state to shard;
    None: not known). A dry run (``dry_run``) compiled ``programs`` for the target, ``oom_programs`` of them
    out of memory; ``stopped`` is what made it stop early (a value it does not
    have), with the line in ``location``. ``holders``: the top holders at the peak.
    """

    kind: ClassVar[str] = "memory"
    view: ClassVar[str | None] = "memory"
    stored: ClassVar[Stored] = Stored("memory_summaries")

    peak_bytes: int
    peak_step: int
    end_bytes: int
    steps: int
    persistent_bytes: int
    activation_bytes: int
    float32_bytes: int
    temp_bytes: int
    required_bytes: int
    dry_run: bool
    programs: int
    oom_programs: int
    temp_program: str | None = None
    temp_source: str | None = None
    target: str | None = None
    capacity_bytes: int | None = None
    fits: bool | None = None
    stopped: str | None = None
    holders: tuple[MemoryHolder, ...] = column(table="memory_peak_holders", default=())
    temp_live_bytes: int | None = None
    trains: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryFix:
    """One way a run that does not fit could, with the need estimated after it (per device).

    ``remedy``: ``"bfloat16"`` (float32 tensors in bfloat16: ``factor`` is what their
    bytes become, as the target's tiles pad bfloat16 arrays of their shapes), ``"checkpointing"``
    (activation checkpointing), ``"batch"`` (a smaller batch: ``factor`` is the
    largest fraction of the current one that fits, 0 when none does),
    ``"chips"`` (``factor`` chips, parameters, gradients and optimizer state
    sharded and the batch split across them; ``detail`` names the slice, ``v5e-4``).
    ``fits``: the estimate is within capacity. ``trains``: the run trained (False: an
    inference run, whose fixes name no gradients or optimizer state; None: not known).
    """

    remedy: str
    estimate_bytes: int
    factor: float
    fits: bool
    detail: str = ""
    trains: bool | None = None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class MemoryFindingEvent(Event):
    """The evidence of a run's fit in its TPU target's memory, as data (the memory
    tracer writes it; whether it is a finding is the advisor's rule,
    ``tracers/advisor/fit_rules.py``).

    ``finding`` says which record it is: ``"estimate"`` (written for every run with
    a target: the need, ``required_bytes``, against one device's
    ``capacity_bytes``, with what each remedy would bring it to) or
    ``"program_oom"`` (the TPU compiler refused ``program`` for want of HBM;
    ``required_bytes`` is what it had counted). Runs recorded before the advisor
    made that decision hold ``"does_not_fit"`` (an estimate over capacity) instead
    of ``"estimate"``. ``holders``: the biggest holders at the peak; ``fixes``:
    estimates, best first.
    """

    kind: ClassVar[str] = "memory_finding"
    view: ClassVar[str | None] = "memory"
    stored: ClassVar[Stored] = Stored("memory_findings", name="finding")

    finding: str
    target: str
    required_bytes: int
    capacity_bytes: int
    program: str | None = None
    holders: tuple[MemoryHolder, ...] = column(table="memory_finding_holders", default=())
    fixes: tuple[MemoryFix, ...] = column(table="memory_fixes", default=())


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramBuffer:
    """One buffer holding memory at a program's peak (a row of ``program_memory_buffers``).

    ``kind``: what it is (one of ``tracers.reading.peak_buffers.KINDS``: ``"parameter"``,
    ``"optimizer_state"``, ``"gradient"``, ``"activation"`` (a forward value kept for the
    backward), ``"temporary"``, ``"collective"``, ``"host"``, ``"input"``, ``"output"``,
    ``"other"``, or ``"unused"``: the heap's fragmentation there). ``nbytes``: the bytes it
    is counted for at the peak (its own size in the compiler's layout, padding included;
    less, for a value sharing bytes with another); ``logical_bytes`` its elements times
    their size; ``padding_bytes`` what the layout's tiles add to it (its size less its
    logical bytes, where the compiler's layout is tiled; 0 elsewhere). ``name`` the value
    (its instruction, ``{i}`` for a tuple element), ``opcode`` the instruction that made it
    (copies and tuples followed), ``op`` what made that (the FX node and aten op,
    ``mm_1|aten::mm``, or the JAX operation) or, for a program's input, the user's name for
    it (``qkv.weight``, ``exp_avg of 0.weight``, ``x``), ``start`` and ``end`` its live
    range in program order. ``file``/``line``/``function``: the PyTorch line that made it
    (the user's; ``library`` when only library code, a model in transformers say, is
    known); ``note`` what it is in words where the line does not say it (an input made
    before the trace, the incoming gradient). ``reserved``: the bytes are not in use at the
    peak but held for this value, written at another point in the allocation it shares over
    time with other values (``allocation_bytes``: that allocation's size, when shared).
    ``count`` > 1: a row folding that many smaller buffers of its kind (``name`` empty).
    """

    kind: str
    nbytes: int
    logical_bytes: int = 0
    dtype: str = ""
    shape: tuple[int, ...] = ()
    name: str = ""
    opcode: str = ""
    op: str = ""
    start: int = -1
    end: int = -1
    file: str | None = None
    line: int | None = None
    function: str | None = None
    library: bool = False
    count: int = 1
    note: str = ""
    reserved: bool = False
    allocation_bytes: int = 0
    padding_bytes: int = 0


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class ProgramMemoryEvent(Event):
    """A compiled program's memory at its peak, buffer by buffer, from its compiler's buffer
    assignment (``tracers/reading/peak_buffers.py``).

    ``name`` is the program as the run names it (a graph, a lazy graph, an op); ``source``
    ``"local"`` (this machine's compiler) or ``"target"`` (the TPU compiler, for
    ``target``). ``status``: ``"ok"`` or ``"hbm_oom"`` (the TPU compiler refused it: the
    assignment is the one it gave up on, ``required_bytes`` of ``available_bytes`` its
    message's figures). ``total_bytes``: the buffer assignment's bytes in the device's
    memory (every allocation: parameters, outputs, constants, and the temporaries' heap of
    ``heap_bytes``), which the buffers add up to with ``unused_bytes`` (the heap's
    fragmentation at the peak). ``compiler_bytes``: the executable's own figure, arguments
    + outputs - aliased + temporaries (None for a refusal). ``peak_position`` of
    ``length`` program points, where ``peak_op`` runs. ``host_bytes``: what the program
    keeps in the host's memory space (offloaded). ``kinds``/``kind_bytes``: the peak's bytes
    by kind, every buffer counted. ``buffers``: the largest, then one row per kind for
    the rest, so they too add up to ``total_bytes``. ``timeline_*``: bytes in use over
    program order (the static allocations and the live temporaries). ``program``: the
    local program's content hash, ``tpu_program`` the target's HLO.
    """

    kind: ClassVar[str] = "program_memory"
    view: ClassVar[str | None] = "memory"
    stored: ClassVar[Stored] = Stored("program_memories", name="name", program="program")

    name: str
    source: str
    status: str
    total_bytes: int
    heap_bytes: int
    unused_bytes: int
    peak_position: int
    length: int
    peak_op: str = ""
    target: str | None = None
    compiler_bytes: int | None = None
    required_bytes: int | None = None
    available_bytes: int | None = None
    host_bytes: int = 0
    kinds: tuple[str, ...] = ()
    kind_bytes: tuple[int, ...] = ()
    buffers: tuple[ProgramBuffer, ...] = column(table="program_memory_buffers", default=())
    timeline_positions: tuple[int, ...] = ()
    timeline_bytes: tuple[int, ...] = ()
    program: str | None = None
    tpu_program: str | None = None

    def by_kind(self) -> dict[str, int]:
        """The peak's bytes per kind."""
        return dict(zip(self.kinds, self.kind_bytes))


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class ProgramProtoEvent(Event):
    """A compiled program as XLA's ``HloProto``: its optimized module with its buffer assignment
    and heap-simulator traces, serialized and base64-encoded in ``proto``. It is what xprof's
    memory viewer reads: the TensorBoard export writes it into the run's profile, listed as
    ``name`` (``program_id`` tells programs of one name apart). ``source`` and ``target`` as
    :class:`ProgramMemoryEvent`'s."""

    kind: ClassVar[str] = "program_proto"
    stored: ClassVar[Stored] = Stored("program_protos", name="name")

    name: str
    program_id: int
    source: str
    proto: str
    target: str | None = None


# -- run summaries (one per run, written when the tracer that counts them stops) ----------


@dataclasses.dataclass(frozen=True, slots=True)
class DivergenceSite:
    """One place divergences occurred (an op, or a node of a compiled graph), with how
    often: ``count`` occurrences, ``recorded`` of them kept as events (the rest over
    the tracer's per-site limit). ``file``/``line``: the user's line, when known."""

    mode: str | None
    measure: str
    phase: str | None
    graph: str | None
    name: str
    file: str | None
    line: int | None
    count: int
    recorded: int


@dataclasses.dataclass(frozen=True, slots=True)
class UncomparedOp:
    """An op PyTorch on CPU could not run on the device op's inputs, and why (the first error)."""

    op: str
    reason: str


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class DivergenceSummaryEvent(Event):
    """What the divergence tracer compared in a run (written when the trace ends).

    The comparison's settings: ``numerics`` (``"cpu"`` or ``"tpu"``), the matmul
    ``precision`` in effect, ``tolerances`` (as given, ``"default"`` when none) and
    ``sample`` (every n-th op compared). The counts: eager ops compared with PyTorch
    on CPU (``ops_compared``; ``ops_copied`` only copied, not compared), compiled
    graphs and their nodes compared; divergences over tolerance per measure
    (``over_local``, ``over_drift``) and NaN/Inf origins. ``not_compared``: the ops
    CPU could not run; ``sites``: the busiest sites, most occurrences first.
    """

    kind: ClassVar[str] = "divergence_summary"
    view: ClassVar[str | None] = "divergence"
    stored: ClassVar[Stored] = Stored("divergence_summaries")

    numerics: str
    precision: str
    tolerances: str
    sample: int
    ops_compared: int
    ops_copied: int
    graphs_compared: int
    nodes_compared: int
    over_local: int
    over_drift: int
    nan_origins: int
    not_compared: tuple[UncomparedOp, ...] = column(table="divergence_uncompared", default=())
    sites: tuple[DivergenceSite, ...] = column(table="divergence_sites", default=())
    # the real compiled programs: outputs compared with CPU, how many were over tolerance,
    # fused single-node programs run to name the first drifting node, calls not checked
    outputs_compared: int = 0
    over_output: int = 0
    fused_programs: int = 0
    calls_skipped: int = 0


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class TensorBoardSummaryEvent(Event):
    """What the TensorBoard export captured (written when it starts, hits its cap and stops;
    the last one is the run's).

    ``status``: ``"capturing"``, ``"not capturing"`` (another profile was running),
    ``"capped"``, ``"finished"`` or ``"failed"`` (the export could not start: ``notes``
    say why). ``dir``: the export's directory; ``profile``: the profile files in it,
    relative to it; ``spans`` emitted of at most ``max_events``; ``capped_after_seconds``:
    when the cap stopped the capture (None: it did not); ``dropped_spans``: spans
    left out after it; ``steps``: step marks.
    """

    kind: ClassVar[str] = "tensorboard_summary"
    stored: ClassVar[Stored] = Stored("tensorboard_summaries", name="status")

    status: str
    dir: str = ""
    profile: tuple[str, ...] = ()
    spans: int = 0
    max_events: int | None = None
    capped: bool = False
    capped_after_seconds: float | None = None
    dropped_spans: int = 0
    steps: int = 0
    notes: tuple[str, ...] = ()


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class DryRunSummaryEvent(Event):
    """A dry run's outcome (written when the trace ends): the ``target`` it compiled for
    (None: no target), ``programs`` compiled for it, and ``notes`` from the dry mode."""

    kind: ClassVar[str] = "dry_run"
    view: ClassVar[str | None] = "memory"
    stored: ClassVar[Stored] = Stored("dry_run_summaries", name="target")

    target: str | None
    programs: int
    notes: tuple[str, ...] = ()


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class ProcessEvent(Event):
    """This run's process in a multi-process run (written when the trace starts; a
    single-process run has none): ``rank`` (``jax.process_index()``) of ``world_size``
    processes, the ``devices`` they share and this process's ``local_devices``, and the
    ``coordinator`` address they joined through."""

    kind: ClassVar[str] = "process"
    stored: ClassVar[Stored] = Stored("processes")

    rank: int
    world_size: int
    devices: int
    local_devices: int
    coordinator: str | None = None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class CollectivesTargetEvent(Event):
    """How the collectives tracer's target compiles ended (written when the trace ends):
    the ``target`` they compiled for and how many were still ``unfinished`` (their
    collectives have no target figures)."""

    kind: ClassVar[str] = "collectives_target"
    view: ClassVar[str | None] = "collectives"
    stored: ClassVar[Stored] = Stored("collectives_targets", name="target")

    target: str | None
    unfinished: int


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class ShardingRematEvent(Event):
    """XLA's SPMD partitioner could not turn a value's sharding into the one its user needs
    and gathered the whole tensor onto every device to split it again (its "Involuntary
    full rematerialization" warning, read from the compile's log instead of left on
    stderr). ``name`` is the op or graph compiled (as in :class:`CompileEvent`),
    ``program`` its HLO's content hash (None without HLO); ``from_sharding`` and
    ``to_sharding`` are XLA's sharding strings (``{devices=[2,1,4]<=[4,2]T(1,0)}``),
    ``instruction``, ``shape`` and ``opcode`` the HLO instruction resharded (its
    per-device shape), ``aten_op`` and ``node`` the aten op and FX node its metadata
    names ("" when none), ``message`` XLA's text. The location is the user's line of
    that node (compiled mode) or of the call that compiled the program."""

    kind: ClassVar[str] = "sharding_remat"
    view: ClassVar[str | None] = "collectives"
    stored: ClassVar[Stored] = Stored("sharding_remats", name="name", program="program")

    name: str
    program: str | None
    from_sharding: str
    to_sharding: str
    instruction: str = ""
    shape: str = ""
    opcode: str = ""
    aten_op: str = ""
    node: str = ""
    message: str = ""


# -- a fit answer (fit/answer.py) ------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FitCollective:
    """The collectives of one ``kind`` in a fit's compiled step, per chip (a row of
    ``fit_collectives``): ``count`` instructions moving ``data_bytes`` (what each chip
    contributes or receives) and ``wire_bytes`` (what it sends with ring algorithms), taking
    ``seconds`` on the ICI (an estimate; None where the generation publishes no ICI figure)."""

    kind: str
    count: int
    data_bytes: int
    wire_bytes: int
    seconds: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FitBound:
    """One collective kind of a fit's compiled step beside the plan's least bytes of it, per
    chip and step (a row of ``fit_communication``): ``compiled_bytes`` against ``bound_bytes``
    (0: the plan needs none), counted as ``basis`` says; ``reasons``: where the bytes well over
    the bound come from, measured in the compiled HLO (empty when the kind is near its bound).
    ``kind`` may be ``"gradient reduction"``: reduce-scatters and all-reduces bounded together,
    when the compiler reduces gradients with all-reduces."""

    kind: str
    compiled_bytes: int
    bound_bytes: int
    basis: str
    reasons: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        """compiled / bound (None when the plan needs none of this kind)."""
        return self.compiled_bytes / self.bound_bytes if self.bound_bytes else None


@register_event
@dataclasses.dataclass(frozen=True, slots=True)
class FitEvent(Event):
    """The answer of ``tpu_debug.fit`` (``tpu-debug fit``): one training (or forward) step of
    ``model`` compiled for the slice ``target`` (``chips`` x ``device_kind``) under ``plan``
    (``"fsdp=8"``), for ``job`` at global ``batch`` x ``seq``.

    Per chip: ``fits`` (True, False for the compiler's HBM out-of-memory, None for another
    refusal, whose text is ``error``), ``required_bytes`` of ``capacity_bytes`` (from
    ``capacity_source``: ``"compiler"`` or ``"spec"``); the compiler's ``argument_bytes``,
    ``output_bytes``, ``alias_bytes``, ``temp_bytes``, ``code_bytes``, ``total_bytes`` and
    the breakdown read from the shardings (``parameter_bytes``, ``optimizer_bytes``,
    ``batch_bytes``, ``gradient_bytes``, ``activation_bytes``, ``kv_cache_bytes`` for
    prefill and decode); None when the compile failed. ``host_bytes``: what the step places
    in the host's memory space (offloaded activations), outside the HBM figures; None when
    not known. ``collectives`` per kind. The estimates (model estimates, not measurements):
    ``compute_seconds``, ``memory_seconds``, ``comm_seconds``, ``step_seconds``,
    ``overlapped_seconds``, ``tokens_per_second``, ``model_flops``, ``mfu``,
    ``mfu_overlapped`` under ``assumptions``, and ``op_by_op_seconds``, ``mfu_op_by_op`` (the
    step's ops one after another; None when not worked out). ``unsharded``: parameters no plan axis
    split; ``caveats``, ``extrapolation`` and ``method`` as the answer says them;
    ``verified_fixes``: each change ``fixes`` compiled, with its need and verdict, the
    recommended first (empty when none was asked for); ``candidate_of``: the question of
    the plan search this answer was a candidate of, set on every candidate but the last
    (the search's answer), which alone the advisor judges; ``communication``: each collective
    kind beside the plan's bound (empty in a run recorded without bounds); ``seconds`` the
    whole answer and ``compile_seconds`` its TPU compiles, wall clock. ``location`` is the
    user line that asked (None from the command line)."""

    kind: ClassVar[str] = "fit"
    view: ClassVar[str | None] = "fit"
    stored: ClassVar[Stored] = Stored("fits", name="model", seconds="seconds")

    model: str
    target: str
    chips: int
    device_kind: str
    plan: str
    job: str
    batch: int
    seq: int
    parameters: int
    fits: bool | None
    capacity_bytes: int
    capacity_source: str
    required_bytes: int | None
    seconds: float
    compile_seconds: float
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    code_bytes: int | None = None
    total_bytes: int | None = None
    parameter_bytes: int | None = None
    optimizer_bytes: int | None = None
    batch_bytes: int | None = None
    gradient_bytes: int | None = None
    activation_bytes: int | None = None
    collectives: tuple[FitCollective, ...] = column(table="fit_collectives", default=())
    compute_seconds: float | None = None
    memory_seconds: float | None = None
    comm_seconds: float | None = None
    step_seconds: float | None = None
    overlapped_seconds: float | None = None
    tokens_per_second: float | None = None
    model_flops: float | None = None
    mfu: float | None = None
    mfu_overlapped: float | None = None
    assumptions: tuple[str, ...] = ()
    unsharded: tuple[str, ...] = ()
    op_by_op_seconds: float | None = None
    mfu_op_by_op: float | None = None
    caveats: tuple[str, ...] = ()
    error: str | None = None
    extrapolation: str | None = None
    method: str | None = None
    kv_cache_bytes: int | None = None
    verified_fixes: tuple[str, ...] = ()
    candidate_of: str | None = None
    host_bytes: int | None = None
    communication: tuple[FitBound, ...] = column(table="fit_communication", default=())

    @property
    def headroom_bytes(self) -> int | None:
        """capacity - required: positive bytes to spare, negative bytes short."""
        return None if self.required_bytes is None else self.capacity_bytes - self.required_bytes

    def breakdown(self) -> dict[str, int]:
        """The breakdown's parts by name (empty when the compile failed)."""
        parts = {"parameters": self.parameter_bytes, "optimizer state": self.optimizer_bytes,
                 "batch": self.batch_bytes, "gradients": self.gradient_bytes,
                 "activations": self.activation_bytes}
        return {k: v for k, v in parts.items() if v is not None}
