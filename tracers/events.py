"""The events tracers record: frozen, slotted dataclasses (the tracers' shared language).

Every event carries the same header: an ``id`` (unique within a run, assigned
by the run writer), ``ts`` (when the activity began, in seconds since the run
started, from a monotonic clock), the execution ``mode`` (``"eager"``, ``"compiled"`` or ``None``), the
native ``thread`` id and the user ``location`` (see :mod:`.location`). The
fields after the header are the event's own. ``kind`` is a class constant that
names the event in the run store.

``SCHEMA_VERSION`` is the version of the run store layout these events map to
(see :mod:`.store`); it changes whenever a reader of the old layout would
misread the new one.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

# One input of a compiled program, in its recorded form (static values as their repr text):
# the class the runtime reports inputs with, shared so there is one definition
from tpu_debug.argspec import ArgSpec as ArgInfo

__all__ = [
    "SCHEMA_VERSION",
    "SourceLocation",
    "ArgInfo",
    "KeyDiff",
    "Event",
    "OpEvent",
    "CompileEvent",
    "TransferEvent",
    "FallbackEvent",
    "GraphBreakEvent",
    "GuardFailureEvent",
    "RecompileLimitEvent",
    "DivergenceEvent",
    "InternalErrorEvent",
    "EVENT_TYPES",
    "event_type",
]

SCHEMA_VERSION = 3  # 2: divergence measurements (issue 8); 3: recompile identities, dynamo events (issue 5)


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLocation:
    """A line of user code: the first frame outside torch, jax, tpu_debug and the stdlib."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True, slots=True)
class KeyDiff:
    """One difference between a compile's key and the closest earlier key of
    the same op or graph (filled by the recompile tracer, issue 5).

    ``field`` names what differs (``"arg 0"``, ``"static arg 'dim'"``,
    ``"dtype"``, ``"dynamo guard"``); ``before``/``now`` are rendered values.
    """

    field: str
    before: str
    now: str

    def render(self) -> str:
        return f"{self.field}: {self.before} -> {self.now}"


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """The header every event carries."""

    kind: ClassVar[str] = "event"

    id: int
    ts: float
    mode: str | None
    thread: int
    location: SourceLocation | None


@dataclasses.dataclass(frozen=True, slots=True)
class OpEvent(Event):
    """One execution of an eager op's executable (recorded only with
    ``op_events=True``; otherwise executions are aggregated per program)."""

    kind: ClassVar[str] = "op"

    name: str
    seconds: float
    program: str | None = None  # content hash of the program, see CompileEvent


@dataclasses.dataclass(frozen=True, slots=True)
class CompileEvent(Event):
    """An executable was compiled: an eager op for one key, or a compiled graph.

    ``program`` is the content hash of its HLO (stored once per run; ``None``
    when HLO recording is off). ``previous`` is the id of the compile of the
    same ``name`` whose key is closest, and ``diffs`` how this key differs
    from it: both are empty for a first compile (issue 5 fills them).
    ``identity`` is what was compiled again: the op, or for a graph the
    function dynamo compiled and the direction (``"step in train.py (forward)"``,
    see ``tracers/recompiles.py``). A compile with diffs is a recompile; its
    ``previous`` is None when the closest key was compiled before the trace.
    """

    kind: ClassVar[str] = "compile"

    name: str
    signature: str
    args: tuple[ArgInfo, ...]
    seconds: float
    program: str | None = None
    previous: int | None = None
    diffs: tuple[KeyDiff, ...] = ()
    identity: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TransferEvent(Event):
    """Data crossed between host and device.

    ``op`` is what the user did that moved it (issue 5, ``tracers/transfers.py``):
    ``"item"``, ``"tolist"``, ``"print"``, ``"bool"``, ``"float"``, ``"int"``,
    ``"index"``, ``"scalar"`` (a CPU scalar operand), ``"fallback:<aten op>"``,
    ``"cpu"``, ``"to"``, ``"tensor"``, ``"copy"``; ``implicit`` is true when the
    user did not ask for a copy (a sync forced by ``.item()``, ``print``,
    ``if t:``, a scalar operand, a CPU fallback).
    """

    kind: ClassVar[str] = "transfer"

    direction: str  # "h2d" | "d2h" | "d2d"
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str
    implicit: bool
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class FallbackEvent(Event):
    """An op ran on CPU because it has no lowering."""

    kind: ClassVar[str] = "fallback"

    name: str
    args: tuple[ArgInfo, ...]
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class GraphBreakEvent(Event):
    """Dynamo split a compiled function (issue 5 records these).

    ``name`` is the function, ``reason`` dynamo's ("Data-dependent branching:
    ..."), ``location`` the line that broke the graph.
    """

    kind: ClassVar[str] = "graph_break"

    name: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class GuardFailureEvent(Event):
    """Dynamo found no cached graph of a function whose guards pass, and compiles it again (issue 5).

    ``name`` is the function, ``compile_id`` dynamo's id of the new compile
    (``"0/3"``), ``guards`` the failed guard of each cached entry, most recent
    first (``"0/2: tensor 'x' size mismatch at index 0. expected 8, actual 9"``);
    ``location`` is the user's call.
    """

    kind: ClassVar[str] = "guard_failure"

    name: str
    compile_id: str
    guards: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class RecompileLimitEvent(Event):
    """A function hit dynamo's recompile limit: from then on it runs without compiling (issue 5).

    ``limit_type`` names the limit (``"recompile_limit"``), ``limit`` its
    value, ``reason`` the last failed guard.
    """

    kind: ClassVar[str] = "recompile_limit"

    name: str
    limit_type: str
    limit: int
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class DivergenceEvent(Event):
    """An op or graph node's result compared with PyTorch on CPU (issue 8 records these).

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
    at precision "highest" (None: not checked). See ``tracers/divergence.py``.
    """

    kind: ClassVar[str] = "divergence"

    name: str
    measure: str
    max_abs: float
    max_rel: float
    ulp: float | None
    mismatched: int
    nan_origin: bool
    tolerance: float
    first: bool
    # issue 8: the rest of the measurement
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

    @property
    def over(self) -> bool:
        """Some element is over tolerance."""
        return self.mismatched > 0

    @property
    def dtype_mismatch(self) -> bool:
        return bool(self.device_dtype) and self.device_dtype != self.dtype


@dataclasses.dataclass(frozen=True, slots=True)
class InternalErrorEvent(Event):
    """A tracer failed; the traced program went on. Kept so the report can say so."""

    kind: ClassVar[str] = "internal_error"

    where: str
    message: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        OpEvent,
        CompileEvent,
        TransferEvent,
        FallbackEvent,
        GraphBreakEvent,
        GuardFailureEvent,
        RecompileLimitEvent,
        DivergenceEvent,
        InternalErrorEvent,
    )
}


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
