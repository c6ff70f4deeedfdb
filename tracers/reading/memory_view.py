"""Device memory read back: a run's memory records, the fit verdicts drawn from them, and their texts.

The memory tracker (``tracers/recording/memory_tracker.py``) writes one
:class:`~tpu_debug.tracers.events.MemoryStepEvent` per step, a
:class:`~tpu_debug.tracers.events.MemorySummaryEvent` and, with a TPU target, the
evidence of the fit (:class:`~tpu_debug.tracers.events.MemoryFindingEvent`).
:func:`memory_view` reads them back, :func:`fit_verdicts` decides what does not fit
(the advisor's fit rules and the views read that one decision), and the ``describe_*``
functions write a holder, a fix and the need as the report, the TUI and the advisor
show them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from tpu_debug.core.format import format_bytes
from tpu_debug.tracers.events import MemoryFindingEvent, MemoryFix, MemoryHolder, MemoryStepEvent, MemorySummaryEvent
from tpu_debug.tracers.reading.peak_buffers import KIND_TEXT
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "BEFORE_TRACE",
    "DOES_NOT_FIT",
    "ESTIMATE",
    "PHASE_TEXT",
    "PROGRAM_OOM",
    "MemoryView",
    "describe_fix",
    "describe_holder",
    "fit_verdicts",
    "memory_view",
    "need_text",
]

# the records of a fit (MemoryFindingEvent.finding): the evidence the tracker writes, and the
# verdict read from it (runs recorded before the advisor decided also hold DOES_NOT_FIT records)
ESTIMATE, PROGRAM_OOM, DOES_NOT_FIT = "estimate", "program_oom", "does_not_fit"
# the phase of what was allocated before tracking began
BEFORE_TRACE = "before trace"
PHASE_TEXT = {"forward": "forward/other", "backward": "backward", "optimizer": "optimizer",
              BEFORE_TRACE: "before trace"}


def describe_fix(fix: MemoryFix) -> str:
    """One line for a fix (what to do, the estimated need after it)."""
    est = f"~{format_bytes(fix.estimate_bytes)} per chip (estimated)"
    if fix.remedy == "bfloat16":
        if fix.trains is False:
            return f"bfloat16 instead of float32 (model.to(torch.bfloat16) for inference): {est}"
        return (f"bfloat16 instead of float32 (model.to(torch.bfloat16), or bf16 autocast with bf16 "
                f"optimizer state): {est}")
    if fix.remedy == "checkpointing":
        return (f"activation checkpointing (torch.utils.checkpoint around each block): {est}, at most: "
                "each block's input is still kept")
    if fix.remedy == "batch":
        if fix.factor <= 0:
            return "a smaller batch cannot fit it alone: what stays between steps is over capacity"
        return f"a batch {fix.factor:.2f}x the current one (activations and temporaries scale with it): {est}"
    if fix.remedy == "chips":
        n = int(fix.factor)
        if fix.trains is False:
            return (f"{n} chips ({fix.detail or 'a slice'}), the weights sharded across them (tensor "
                    f"parallel) and the batch split: {est}")
        return (f"{n} chips ({fix.detail or 'a slice'}), parameters, gradients and optimizer state "
                f"sharded (FSDP) and the batch split across them: {est}")
    return f"{fix.remedy}: {est}"


def need_text(summary: MemorySummaryEvent, fmt: Callable[[int], str] | None = None) -> str:
    """How the need is made: ``peak 12.0 GiB of tensors + 2.0 GiB temporaries of addmm`` (the
    program whose temporaries, on top of what was held when it ran, reach highest), or the peak
    alone when every program's temporaries fit under it. ``fmt`` formats bytes (:func:`~tpu_debug.core.format.format_bytes`)."""
    fmt = fmt or format_bytes
    peak = fmt(summary.peak_bytes)
    if not summary.temp_bytes:
        return f"peak {peak} of tensors"
    program = summary.temp_program or "the largest program"
    live, temp = summary.temp_live_bytes, fmt(summary.temp_bytes)
    if live is None or live >= summary.peak_bytes:
        return f"peak {peak} of tensors + {temp} temporaries of {program}"
    if summary.required_bytes > summary.peak_bytes:
        return f"{fmt(live)} of tensors held when {program} ran + its {temp} of temporaries (tensor peak {peak})"
    return (f"peak {peak} of tensors (every program's temporaries fit under it: the most, {program}'s "
            f"{temp}, ran with {fmt(live)} held)")


def describe_holder(h: MemoryHolder, cwd: str | None = None) -> str:
    """``train.py:12 in main (forward): 1.00 GiB in 3 tensors, largest float32[1024, 262144]``
    (``1.60 GiB (1.00 GiB logical) in ...`` where the target's tiles pad them)."""
    if h.file:
        file = h.file
        if cwd and os.path.isabs(file):
            rel = os.path.relpath(file, cwd)
            file = rel if not rel.startswith("..") else file
        where = f"{file}:{h.line} in {h.function}"
        if h.call_file:
            where += f" (called at {os.path.basename(h.call_file)}:{h.call_line})"
    else:
        where = "allocated before the trace began"
    largest = f", largest {h.dtype}{list(h.shape)}" if h.shape else ""
    kind = f"; {KIND_TEXT.get(h.kind, h.kind)}" if h.kind else ""
    phase = f" ({PHASE_TEXT.get(h.phase, h.phase)}{kind})" if h.file else ""
    logical = f" ({format_bytes(h.logical_bytes)} logical)" if h.logical_bytes and h.logical_bytes != h.nbytes else ""
    return f"{where}{phase}: {format_bytes(h.nbytes)}{logical} in {h.tensors} tensor(s){largest}"


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryView:
    """A run's memory records: steps in order, the summary (None when memory was not
    tracked or the run is still going), and the findings."""

    steps: list[MemoryStepEvent]
    summary: MemorySummaryEvent | None
    findings: list[MemoryFindingEvent]

    @property
    def recorded(self) -> bool:
        return bool(self.steps) or self.summary is not None

    def peak_holders(self) -> tuple[MemoryHolder, ...]:
        if self.summary is not None:
            return self.summary.holders
        best = max((s for s in self.steps if s.holders), key=lambda s: s.peak_bytes, default=None)
        return best.holders if best is not None else ()


def fit_verdicts(records: list[MemoryFindingEvent]) -> list[MemoryFindingEvent]:
    """What does not fit, from a run's fit evidence: the estimate when it is over capacity
    (as a ``"does_not_fit"`` record), then each program the compiler refused for HBM, with
    the estimate's holders and fixes. The advisor's fit rules and the views read this one
    decision (``tracers/advisor/fit_rules.py``).

    Args:
        records: the run's :class:`~.events.MemoryFindingEvent` records, in order.

    Returns:
        The verdicts, empty when everything fits (or no target was given).
    """
    estimates = [r for r in records if r.finding in (ESTIMATE, DOES_NOT_FIT)]
    estimate = estimates[-1] if estimates else None
    out = []
    if estimate is not None and estimate.required_bytes > estimate.capacity_bytes:
        out.append(dataclasses.replace(estimate, finding=DOES_NOT_FIT))
    for r in records:
        if r.finding == PROGRAM_OOM:
            if estimate is not None and not r.fixes:
                r = dataclasses.replace(r, holders=r.holders or estimate.holders, fixes=estimate.fixes)
            out.append(r)
    return out


def memory_view(run: RunView) -> MemoryView:
    """The memory records of a run; ``findings`` are the verdicts (:func:`fit_verdicts`),
    not the evidence they come from."""
    steps = [e for e in run.events(MemoryStepEvent.kind) if isinstance(e, MemoryStepEvent)]
    summaries = [e for e in run.events(MemorySummaryEvent.kind) if isinstance(e, MemorySummaryEvent)]
    records = [e for e in run.events(MemoryFindingEvent.kind) if isinstance(e, MemoryFindingEvent)]
    return MemoryView(steps, summaries[-1] if summaries else None, fit_verdicts(records))
