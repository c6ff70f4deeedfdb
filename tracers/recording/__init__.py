"""What records, inside the user's process: probes that turn the runtime's reports into events.

The runtime reports through ``tpu_debug.runtime.probes``; :class:`Recorder` turns those
reports into :mod:`events <tpu_debug.tracers.events>` and hands them to a
:class:`RunWriter`; the step tracker, the memory, program memory, target, collectives,
invalid values and divergence tracers, the dynamo log hooks and the TensorBoard exporter
each record their own subject. ``tpu_debug.tracing`` wires them to a trace
(``tpu_debug/tracer_parts.py``). Nothing on the reading side imports this package.
"""

from __future__ import annotations

from tpu_debug.core.autoload import lazy_exports

__all__ = ["DivergenceTracer", "Recorder", "RunWriter", "TensorBoardExporter"]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "tpu_debug.tracers.recording.divergence": ("DivergenceTracer",),
        "tpu_debug.tracers.recording.recorder": ("Recorder",),
        "tpu_debug.tracers.recording.run_writer": ("RunWriter",),
        "tpu_debug.tracers.recording.tensorboard_exporter": ("TensorBoardExporter",),
    },
)
