"""Reading a run: typed queries over its database (what the report, TUI and users call).

Every query is a plain SQL statement over indexed columns; results come back as the event
dataclasses of :mod:`tpu_debug.tracers.events` or the summary records beside each query.
:class:`RunQuery` (and :class:`~tpu_debug.Session`, which is one) holds one part per
subject, each in its own module over one reader (:mod:`.reader`: the connection, the
decoding of stored events, damaged rows):

==============================  =====================================================
``q.ops(...)``                  per op and mode: calls, time, compiles (:mod:`.ops`)
``q.programs(...)``             distinct programs, their texts and HLO (:mod:`.programs`)
``q.compiles(...)``             compile events, per op or graph (:mod:`.compiles`)
``q.recompiles(...)``           recompiles, their groups, dynamo's side (:mod:`.recompiles`)
``q.transfers(...)``            host <-> device transfers, by line (:mod:`.transfers`)
``q.divergences(...)``          the check against CPU (:mod:`.divergences`)
``q.steps()``                   the training steps (:mod:`.steps`)
``q.invalid_values()``          values a TPU computes with silently (:mod:`.invalid_values`)
``q.events(kind)``              any kind of event (:mod:`.reader`)
==============================  =====================================================

Example::

    q = RunQuery(Path("tpu_debug_runs/20260101T000000.000Z-train/run.db"))
    q.ops(limit=3); q.recompiles.groups(); q.divergences.first()
"""

from __future__ import annotations

from tpu_debug.tracers.query.compiles import CompileGroup
from tpu_debug.tracers.query.ops import OpSummary
from tpu_debug.tracers.query.programs import ProgramSummary, ProgramText
from tpu_debug.tracers.query.reader import DamagedRow, RunMetadata, op_name_of
from tpu_debug.tracers.query.run import RunQuery
from tpu_debug.tracers.query.transfers import TransferSite

__all__ = [
    "CompileGroup",
    "DamagedRow",
    "OpSummary",
    "ProgramSummary",
    "ProgramText",
    "RunMetadata",
    "RunQuery",
    "TransferSite",
    "op_name_of",
]
