"""What is recorded: event types, the recorder probe, per-op HLO, the run store and its queries.

The runtime reports through ``tpu_debug.runtime.probes``; :class:`Recorder`
turns those reports into :mod:`events <tpu_debug.tracers.events>` and hands
them to a :class:`RunWriter`; :class:`RunQuery` reads a run back.
"""

from __future__ import annotations

from tpu_debug.tracers.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    ArgInfo,
    CompileEvent,
    DivergenceEvent,
    Event,
    FallbackEvent,
    GraphBreakEvent,
    GuardFailureEvent,
    InternalErrorEvent,
    KeyDiff,
    OpEvent,
    RecompileLimitEvent,
    SourceLocation,
    StepEvent,
    Stored,
    TransferEvent,
    column,
    register_event,
)
from tpu_debug.tracers.hlo import Program, ProgramNode, make_program, parse_instructions, program_hash
from tpu_debug.tracers.location import user_location
from tpu_debug.tracers.query import OpSummary, ProgramSummary, ProgramText, RunMetadata, RunQuery
from tpu_debug.tracers.recorder import Recorder
from tpu_debug.tracers.store import DB_NAME, RunWriter, connect
from tpu_debug.tracers.tensorboard import TensorBoardExporter

__all__ = [
    "SCHEMA_VERSION",
    "EVENT_TYPES",
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
    "StepEvent",
    "Stored",
    "column",
    "register_event",
    "ArgInfo",
    "KeyDiff",
    "SourceLocation",
    "ProgramNode",
    "Program",
    "make_program",
    "parse_instructions",
    "program_hash",
    "user_location",
    "Recorder",
    "RunWriter",
    "RunQuery",
    "RunMetadata",
    "OpSummary",
    "ProgramSummary",
    "ProgramText",
    "DB_NAME",
    "connect",
    "TensorBoardExporter",
    "DivergenceTracer",
]


def __getattr__(name: str):
    # DivergenceTracer needs torch and the runtime; importing it on first use keeps
    # ``tpu_debug.tracers`` free of both, so the reading verbs and the TUI start fast
    if name == "DivergenceTracer":
        from tpu_debug.tracers.divergence import DivergenceTracer

        return DivergenceTracer
    raise AttributeError(f"module 'tpu_debug.tracers' has no attribute {name!r}")
