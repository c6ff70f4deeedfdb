"""The advisor's rules about fitting a TPU: memory, the target's compiler, the dry run.

They read the evidence the memory tracer and the TPU target tracer recorded
(``tracers/reading/memory_view.py``, ``tracers/reading/target_findings.py``) and decide, like every other
rule, what is worth a :class:`~.findings.Finding`: a run whose tensors and
temporaries need more HBM than one device of its target has, a program the
TPU compiler refused for want of HBM, an array the TPU's tiles pad by a
fifth and a mebibyte or more, and a dry run that stopped before the end of
what it measures.
A run recorded without a target (``trace(target=...)``, ``--target``) has
none of this evidence and gets none of these findings.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from tpu_debug.core.format import format_bytes, format_location
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule
from tpu_debug.tracers.events import (
    FitEvent,
    MemoryFindingEvent,
    MemoryHolder,
    MemorySummaryEvent,
    ProgramMemoryEvent,
    SourceLocation,
)
from tpu_debug.tracers.reading.memory_view import (
    DOES_NOT_FIT,
    PROGRAM_OOM,
    describe_fix,
    describe_holder,
    need_text,
)
from tpu_debug.tracers.reading.peak_buffers import (
    KIND_TEXT,
    holder_remedies,
    made_where,
    remedies,
    remedy_text,
    shape_text,
    sum_text,
)
from tpu_debug.tracers.reading.target_findings import TargetFinding, code_text, findings

__all__ = ["PADDING_FINDING_BYTES", "with_peak"]

# padding worth a finding wastes at least this much in one array: less takes under 1.3 µs of a
# v5e chip's HBM bandwidth (819 GB/s) per pass over it, below a program's launch cost. The TPU
# compiler lays large arrays out so that their tiles are nearly full (a [16384, 100] result
# puts the 16384 on the 128 lanes), so what pads a fifth or more is mostly small arrays, such
# as a 64-wide layer's; the TPU target section of the report still lists those
PADDING_FINDING_BYTES = 1 << 20


def _holder_location(holders: Iterable[MemoryHolder]) -> SourceLocation | None:
    """The user line holding the most at the peak (tensors from before the trace have none)."""
    return next((SourceLocation(h.file, h.line, h.function) for h in holders if h.file), None)


# the remedies to try first, by cause: tensors held between steps shrink with their dtype or
# spread over chips (a smaller batch or checkpointing leaves them as they are); a step's peak
# on top of them shrinks first with what the step keeps for backward and its batch
_PREFERRED = {
    "state": ("bfloat16", "chips", "checkpointing", "batch"),
    "peak": ("checkpointing", "batch", "bfloat16", "chips"),
}


def _fix_text(record: MemoryFindingEvent, cause: str) -> tuple[str, tuple[str, ...]]:
    """The fix to give (the first remedy for ``cause`` that fits alone, or what to combine) and
    the other remedies that fit alone."""
    order = _PREFERRED[cause]
    fitting = sorted(
        (f for f in record.fixes if f.fits),
        key=lambda f: order.index(f.remedy) if f.remedy in order else len(order),
    )
    if fitting:
        return describe_fix(fitting[0]), tuple(f"or: {describe_fix(f)}" for f in fitting[1:])
    partial = [describe_fix(f) for f in record.fixes]
    if not partial:
        return "hold less at once: a smaller batch, bfloat16, activation checkpointing, or more chips", ()
    return "no one change fits it alone; combine them: " + "; ".join(partial), ()


def _fix_counts(record: MemoryFindingEvent) -> tuple[Count, ...]:
    return tuple(Count(f"need after {f.remedy}", f.estimate_bytes, "B") for f in record.fixes)


def _cause(summary: MemorySummaryEvent | None, record: MemoryFindingEvent) -> str:
    """What is over: what stays between steps alone (parameters, gradients, optimizer state),
    or the step's peak on top of it (activations and temporaries)."""
    if summary is not None and summary.persistent_bytes > record.capacity_bytes:
        return "state"
    return "peak"


@rule(
    "memory_fit",
    about="tensors and temporaries need more HBM than one device of the TPU target has",
    view="memory",
)
def memory_fit(facts: RunFacts) -> Iterable[Finding]:
    summary = facts.memory.summary
    for record in facts.memory.findings:
        if record.finding != DOES_NOT_FIT:
            continue
        cause = _cause(summary, record)
        fix, others = _fix_text(record, cause)
        kinds = holder_remedies(record.holders, record.required_bytes)
        # a remedy checked to fit alone for the cause comes first: the largest kind's change is
        # an unchecked estimate (its bytes gone entirely, which neither bfloat16 nor sharding
        # gives), so it leads only when no checked remedy fits alone
        if kinds and any(f.fits for f in record.fixes):
            fix = f"{fix}. Also, for the largest kind held at the peak: {remedy_text(kinds[0])}"
        elif kinds:
            fix = f"{remedy_text(kinds[0])}. Otherwise: {fix}"
        title = (
            f"the run does not fit one {record.target} device: ~{format_bytes(record.required_bytes)} needed, "
            f"{format_bytes(record.capacity_bytes)} there"
        )
        counts = [
            Count("need per device", record.required_bytes, "B"),
            Count("HBM per device", record.capacity_bytes, "B"),
        ]
        if summary is not None:
            title += f" ({need_text(summary)}, in step {summary.peak_step})"
            counts += [
                Count("peak tensor bytes", summary.peak_bytes, "B"),
                Count("held between steps", summary.persistent_bytes, "B"),
                Count("temporaries", summary.temp_bytes, "B"),
            ]
        yield Finding(
            kind="memory_fit",
            severity="error",
            title=title,
            fix=fix,
            cost_seconds=0.0,
            evidence=Evidence(
                _holder_location(record.holders),
                (*counts, *_fix_counts(record)),
                (*(f"holds at the peak: {describe_holder(h)}" for h in record.holders), *others),
            ),
            steps=(summary.peak_step, summary.peak_step) if summary is not None else None,
            cause=cause,
            subject=record.target,
            estimated=True,
        )


def _oom_from_target(f: TargetFinding) -> Finding:
    required, available = f.figure("required_bytes"), f.figure("available_bytes")
    need = (
        f"needs {format_bytes(required)} of {format_bytes(available)} HBM" if required is not None else "does not fit its HBM"
    )
    what = f.figure("what")
    return Finding(
        kind="hbm_oom",
        severity="error",
        title=f"the TPU compiler refused {f.subject} for {f.target}: it {need}"
        + (f" ({what})" if what else ""),
        fix=f.fix,
        cost_seconds=0.0,
        evidence=Evidence(
            next((loc for loc in f.locations if loc is not None), None),
            tuple(
                Count(name, float(v), "B")
                for name, v in (("required", required), ("available", available))
                if v is not None
            ),
            (*(f"program: {p}" for p in f.programs), *((f.figure("code_text"),) if f.figure("code_text") else ())),
        ),
        cause="hbm",
        subject=f"{f.target}: {f.subject}",
        targets=(f.subject,),
    )


# ops that make a tensor from nothing (a factory, an initializer): a program of one of these is
# the allocation of one big tensor, which building the model on "meta" avoids
_MAKERS = ("empty", "zeros", "ones", "full", "rand", "normal", "uniform", "arange", "eye")


def _oom_from_dry_run(record: MemoryFindingEvent) -> Finding:
    program = record.program or "a program"
    # the run's remedies (estimated for its peak) are not this one program's: what it holds is
    # its own inputs, outputs and temporaries
    fix = (
        f"make {program} hold less on one device: shard it over more chips (a bigger "
        f"{record.target.split('-')[0]}-N slice, its inputs split), or shrink its inputs and outputs: "
        "bfloat16 instead of float32, a smaller batch"
    )
    if program.lstrip("_").startswith(_MAKERS):
        fix = (
            f"{program} makes one tensor too big for a device: build the model under "
            "torch.device('meta') and load or shard its weights (FSDP over more chips), or keep that "
            "tensor in bfloat16"
        )
    return Finding(
        kind="hbm_oom",
        severity="error",
        title=(
            f"the TPU compiler refused {program} for {record.target}: it counted "
            f"{format_bytes(record.required_bytes)} of {format_bytes(record.capacity_bytes)} HBM"
        ),
        fix=fix,
        cost_seconds=0.0,
        evidence=Evidence(
            _holder_location(record.holders),
            (Count("required", record.required_bytes, "B"), Count("available", record.capacity_bytes, "B")),
            tuple(f"holds at the peak: {describe_holder(h)}" for h in record.holders),
        ),
        cause="hbm",
        subject=f"{record.target}: {program}",
        targets=(program,),
    )


# buffers at a refused program's peak named in its finding's evidence
_PEAK_FACTS = 5


def _refused_peaks(facts: RunFacts) -> dict[str, ProgramMemoryEvent]:
    """The refused programs' peaks (``tracers.reading.peak_buffers``), by program name."""
    memory = getattr(facts.query, "memory", None)
    if memory is None:
        return {}
    return {e.name: e for e in reversed(memory(source="target")) if e.status == "hbm_oom"}


def _peak_of(peaks: dict[str, ProgramMemoryEvent], *names: str) -> ProgramMemoryEvent | None:
    """The peak of the program a finding names (by its name, or a signature ``name(...)``)."""
    for name in names:
        found = peaks.get(name) or peaks.get(name.split("(", 1)[0])
        if found is not None:
            return found
    return None


def with_peak(finding: Finding, peak: ProgramMemoryEvent) -> Finding:
    """``finding`` about a program that does not fit, told by its compiler's peak: the largest
    buffers there with their kinds and lines as evidence, the line of the largest one the user
    made as its location, and the remedy for the largest kind first (the other kinds', then
    the finding's own fix, after it)."""
    found = remedies(peak)
    buffers = [b for b in peak.buffers if b.count == 1 and b.kind != "unused"][:_PEAK_FACTS]
    lines = tuple(f"at the peak: {KIND_TEXT.get(b.kind, b.kind)}, {format_bytes(b.nbytes)} {shape_text(b)}, "
                  f"made at {made_where(b)}" for b in buffers)
    made = next((b for b in peak.buffers if b.file and not b.library and b.count == 1), None)
    location = SourceLocation(made.file, made.line or 0, made.function or "") if made is not None else None
    counts = tuple(Count(f"at the peak: {KIND_TEXT.get(k, k)}", v, "B") for k, v in peak.by_kind().items())
    fix = "; then ".join(remedy_text(r) for r in found[:2]) if found else finding.fix
    if found:
        fix += f". Otherwise: {finding.fix}"
    return dataclasses.replace(finding, fix=fix, evidence=Evidence(
        location or finding.evidence.location, (*finding.evidence.counts, *counts),
        (*lines, sum_text(peak), *finding.evidence.facts)))


@rule(
    "hbm_oom",
    about="a program the TPU target's compiler refuses: it needs more HBM than one device has",
    view="memory",
)
def hbm_oom(facts: RunFacts) -> Iterable[Finding]:
    dry = [r for r in facts.memory.findings if r.finding == PROGRAM_OOM]
    peaks = _refused_peaks(facts)
    # a dry run's refusal is in both records (the target tracer records the dry run's compile):
    # one finding, the dry run's, whose fix knows what the program makes
    refused_dry = {r.program for r in dry}
    compiles = [e for e in facts.target_compiles if not (e.status == "hbm_oom" and e.name in refused_dry)]
    for f in findings(compiles):
        if f.kind == "hbm_oom":
            finding = _oom_from_target(f)
            peak = _peak_of(peaks, f.subject, *f.programs)
            yield with_peak(finding, peak) if peak is not None else finding
    codes = {e.name: code_text(e) for e in facts.target_compiles if e.status == "hbm_oom"}
    for record in dry:
        finding = _oom_from_dry_run(record)
        code = codes.get(record.program or "")
        if code:  # XLA's code of the refusal, what it means and its page
            finding = dataclasses.replace(finding, evidence=dataclasses.replace(
                finding.evidence, facts=(code, *finding.evidence.facts)))
        peak = _peak_of(peaks, record.program or "")
        yield with_peak(finding, peak) if peak is not None else finding


@rule("tpu_padding", about="an array the TPU target's tiles pad by a fifth of its bytes or more", view="ops")
def tpu_padding(facts: RunFacts) -> Iterable[Finding]:
    for f in findings(facts.target_compiles):
        if f.kind != "padding" or f.figure("wasted_bytes", 0) < PADDING_FINDING_BYTES:
            continue
        wasted, padded = f.figure("wasted_bytes"), f.figure("padded_bytes")
        flops = f.figure("flops_wasted", 0.0)
        programs = ", ".join(f.programs[:3]) + (", ..." if len(f.programs) > 3 else "")
        yield Finding(
            kind="tpu_padding",
            severity="warning",
            title=(
                f"{f.subject} is {f.figure('waste', 0.0):.0%} padding on {f.target} (laid out "
                f"{f.figure('layout')}), in {f.figure('arrays')} array(s) of {programs}"
            ),
            fix=f.fix,
            cost_seconds=0.0,
            evidence=Evidence(
                next((loc for loc in f.locations if loc is not None), None),
                (
                    Count("padding bytes", wasted, "B"),
                    Count("padding bytes in all", f.cost, "B"),
                    Count("bytes with padding", padded, "B"),
                    Count("arrays", f.figure("arrays")),
                    Count("matrix FLOP on padding", flops),
                ),
                tuple(
                    f"also at {format_location(loc.file, loc.line)}"
                    for loc in f.locations[1:4]
                    if loc is not None
                ),
            ),
            cause="tile",
            subject=f"{f.target}: {f.subject} {f.figure('layout')}",
            targets=f.programs,
        )


@rule(
    "dry_run_stopped",
    about="a dry run that stopped early: the code read a value a dry run does not have",
    view="memory",
)
def dry_run_stopped(facts: RunFacts) -> Iterable[Finding]:
    summary = facts.memory.summary
    if summary is None or not summary.dry_run or not summary.stopped:
        return
    loc = summary.location
    where = f" at {format_location(loc.file, loc.line)}" if loc else ""
    yield Finding(
        kind="dry_run_stopped",
        severity="warning",
        title=(
            f"the dry run stopped{where}: {summary.stopped} needs a value, and a dry run's tensors hold "
            f"none; only what ran before it was measured ({summary.steps} step(s))"
        ),
        fix=(
            "move the read after the step being measured, or skip it in dry runs "
            "(if tpu_debug.runtime.dry_mode.active is None: ...), so the whole step is measured"
        ),
        cost_seconds=0.0,
        evidence=Evidence(
            summary.location, (Count("steps measured", summary.steps),), (f"read: {summary.stopped}",)
        ),
        cause="value",
        subject=f"dry run: {summary.stopped}",
    )


# the plan's axes that split parameters and optimizer state (dp replicates them)
_SPLITTING = re.compile(r"\b(fsdp|tp)=(\d+)")


def _state_floor(record: FitEvent) -> int:
    """A lower bound of one chip's parameters and AdamW moments (the step's arguments): 2 bytes
    a value (bfloat16, the smallest dtype fit takes), three values a parameter for training (the
    parameter and AdamW's two moments), one for a forward, split over every fsdp and tp chip."""
    ways = 1
    for _, n in _SPLITTING.findall(record.plan):
        ways *= int(n)
    return record.parameters * 2 * (3 if record.job == "train" else 1) // ways


def _fit_cause(record: FitEvent) -> tuple[str, str, int]:
    """What is over in a fit that does not fit: ``"state"`` (parameters, optimizer state,
    gradients, the batch) or ``"activations"`` (what the step keeps for backward and its
    temporaries), with the largest part's name and bytes. A refused compile gives no
    breakdown: its parameters and AdamW state at their smallest stand for the state, and the
    state is the cause when that floor alone is half the need or more."""
    parts = record.breakdown()
    if parts:
        name, nbytes = max(parts.items(), key=lambda kv: kv[1])
        return ("activations" if name == "activations" else "state"), name, nbytes
    floor = _state_floor(record)
    # the need of a refusal adds the state to the compiler's figure (its temporaries when it
    # stopped): the state is weighed against those temporaries
    stopped = record.temp_bytes if record.temp_bytes is not None else record.required_bytes
    if 2 * floor >= (stopped or 0):
        return "state", "parameters and AdamW state (at least, at bfloat16)", floor
    return "activations", "activations and other temporaries (at most: the need less the state's floor)", (
        (record.required_bytes or 0) - floor)


def _fit_fix(record: FitEvent, cause: str) -> str:
    verified = tuple(getattr(record, "verified_fixes", ()) or ())
    if verified:
        fitting = [line for line in verified if line.endswith(", fits")]
        head = f"use {fitting[0].split(':')[0]}" if fitting else "none of the changes compiled fits alone"
        return f"{head} (each compiled by tpu-debug fit --fixes: " + "; ".join(verified) + ")"
    more = (f"more chips with the weights and the batch split over them (a slice larger than "
            f"{record.target}, plan fsdp)")
    if cause == "activations":
        options = (f"a smaller batch than {record.batch}",
                   "activation checkpointing (recompute in backward what the step keeps for it)", more)
    else:
        options = (more, "bfloat16 parameters and optimizer state, if they are float32",
                   "an optimizer with less state than AdamW")
    return ("try " + "; or ".join(options) + " (suggestions, not verified: ask tpu-debug fit again with the "
            "change, e.g. --batch, --target or --search slice)")


@rule("fit_oom", about="a step tpu_debug.fit compiled for a TPU slice needs more HBM per chip than it has",
      view="fit")
def fit_oom(facts: RunFacts) -> Iterable[Finding]:
    for record in facts.query.events("fit"):
        # a plan search's earlier candidates (a smaller slice, a bigger batch) are steps it
        # tried on the way to its answer, not steps the user runs
        if record.fits is not False or record.required_bytes is None or getattr(record, "candidate_of", None):
            continue
        cause, part, part_bytes = _fit_cause(record)
        short = record.required_bytes - record.capacity_bytes
        counts = [Count("needs per chip", record.required_bytes, "B"),
                  Count("usable per chip", record.capacity_bytes, "B"), Count("short per chip", short, "B")]
        counts.append(Count(f"largest part: {part}", part_bytes, "B"))
        facts_text = [f"largest part: {part}, {format_bytes(part_bytes)} per chip"]
        if record.error:
            facts_text.append(f"compiler: {record.error}")
        yield Finding(
            kind="fit_oom",
            severity="error",
            title=(f"{record.model} ({record.job}, batch {record.batch} x seq {record.seq}) does not fit "
                   f"{record.target} under plan {record.plan}: a chip needs {format_bytes(record.required_bytes)} "
                   f"of {format_bytes(record.capacity_bytes)} usable, {format_bytes(short)} short"),
            fix=_fit_fix(record, cause),
            cost_seconds=0.0,
            evidence=Evidence(record.location, tuple(counts), tuple(facts_text)),
            cause=cause,
            subject=(f"{record.model} on {record.target} ({record.plan}, batch {record.batch} x seq "
                     f"{record.seq})"),
        )
