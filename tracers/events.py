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
    "DivergenceEvent",
    "InternalErrorEvent",
    "EVENT_TYPES",
    "event_type",
]

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLocation:
    """A line of user code: the first frame outside torch, jax, tpu_debug and the stdlib."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True, slots=True)
class ArgInfo:
    """One input of a compiled program: a tensor aval (``shape``/``dtype``) or a
    static value (``static``, its ``repr``)."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    static: str | None = None

    def render(self) -> str:
        if self.shape is None:
            return f"{self.name}={self.static}"
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


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
    """

    kind: ClassVar[str] = "compile"

    name: str
    signature: str
    args: tuple[ArgInfo, ...]
    seconds: float
    program: str | None = None
    previous: int | None = None
    diffs: tuple[KeyDiff, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class TransferEvent(Event):
    """Data crossed between host and device.

    ``op`` is what moved it (``"copy"``, ``"to"``, ``"item"``, ``"scalar"``,
    ``"fallback:<aten op>"``); ``implicit`` is true when the user did not ask
    for a copy (a sync forced by ``.item()``, ``print``, a scalar operand, a
    CPU fallback).
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
    """Dynamo split a compiled function (issue 5 records these)."""

    kind: ClassVar[str] = "graph_break"

    name: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class DivergenceEvent(Event):
    """An op or graph node's result compared with PyTorch on CPU (issue 8 records these).

    ``measure`` is ``"local"`` (CPU op on the device op's inputs) or
    ``"drift"`` (against a CPU shadow of the whole computation).
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
