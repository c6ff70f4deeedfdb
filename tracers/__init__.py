"""What is recorded, and how a run is read back: two directions over one store.

``tracers/`` holds what both directions share: the event kinds
(:mod:`~tpu_debug.tracers.events`), the run store's layout
(:mod:`~tpu_debug.tracers.store`), per-program HLO (:mod:`~tpu_debug.tracers.hlo`),
where the user's line is (:mod:`~tpu_debug.tracers.location`). Then:

- ``recording/``: what records, inside the user's process: the probes that turn the
  runtime's reports into events (the recorder, the step tracker, the memory, target,
  collectives and divergence tracers), the run writer, the TensorBoard exporter.
- ``reading/``: what reads, a function of a recorded run: the queries (one part per
  subject over one reader) and every analysis of recorded events; it never imports the
  recording side, so a reader (the report, the TUI, ``diff``) never pays for a probe.
- ``advisor/``: the findings, rules over the reading side.

The names below are imported on first use, so importing one side never loads the other.
"""

from __future__ import annotations

from tpu_debug.core.autoload import lazy_exports

__all__ = [
    "DB_NAME",
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "ArgInfo",
    "DivergenceTracer",
    "Event",
    "KeyDiff",
    "Recorder",
    "RunQuery",
    "RunView",
    "RunWriter",
    "SourceLocation",
    "Stored",
    "TensorBoardExporter",
    "column",
    "connect",
    "register_event",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "tpu_debug.tracers.events": (
            "EVENT_TYPES", "SCHEMA_VERSION", "ArgInfo", "Event", "KeyDiff", "SourceLocation", "Stored", "column",
            "register_event",
        ),
        "tpu_debug.tracers.store": ("DB_NAME", "connect"),
        "tpu_debug.tracers.reading": ("RunQuery", "RunView"),
        "tpu_debug.tracers.recording": ("DivergenceTracer", "Recorder", "RunWriter", "TensorBoardExporter"),
    },
)
