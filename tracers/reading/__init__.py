"""Reading a run: typed queries over its database and the analyses of what it recorded.

A reader (the report, the TUI, ``diff``, the advisor) takes a :class:`RunView`: one run,
read-only. Every query is a plain SQL statement over indexed columns; results come back as the event
dataclasses of :mod:`tpu_debug.tracers.events` or the summary records beside each query.
:class:`RunQuery` (and :class:`~tpu_debug.Session`, which is one) is that view; it holds one part per
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
``q.memory()``                  each program's memory at its peak, buffer by buffer (:mod:`.memory`)
``q.events(kind)``              any kind of event (:mod:`.reader`)
==============================  =====================================================

The analyses are functions of recorded events, one module per question: steps and their
phases (:mod:`.step_phases`), where a step's time went (:mod:`.step_time`), recompiles
(:mod:`.recompile_analysis`), transfers by cause and line (:mod:`.transfer_causes`),
lazy graphs (:mod:`.lazy_graphs`), device memory (:mod:`.memory_view`), a program's peak
(:mod:`.peak_buffers`), the TPU target (:mod:`.target_findings`), multi-device programs
(:mod:`.program_collectives`), c10d calls across ranks (:mod:`.collective_calls`) and
programs across ranks (:mod:`.rank_programs`). Nothing here imports the recording side.

Example::

    q = RunQuery(Path("tpu_debug_runs/20260101T000000.000Z-train/run.db"))
    q.ops(limit=3); q.recompiles.groups(); q.divergences.first()
"""

from __future__ import annotations

from tpu_debug.tracers.reading.compiles_query import CompileGroup
from tpu_debug.tracers.reading.ops_query import OpSummary
from tpu_debug.tracers.reading.programs_query import ProgramSummary, ProgramText
from tpu_debug.tracers.reading.reader import DamagedRow, RunMetadata, op_name_of
from tpu_debug.tracers.reading.run_query import RunQuery
from tpu_debug.tracers.reading.transfers_query import TransferSite
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "CompileGroup",
    "DamagedRow",
    "OpSummary",
    "ProgramSummary",
    "ProgramText",
    "RunMetadata",
    "RunQuery",
    "RunView",
    "TransferSite",
    "op_name_of",
]
