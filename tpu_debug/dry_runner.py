"""``tpu_debug.dry_run``: run PyTorch code with tensors that hold no data, for a TPU target.

The runtime's dry mode (``runtime/dry_mode.py``) gives every `tpu` tensor a shape
and a dtype and no data, and sends every program to the target's compiler
instead of running it; the memory tracer (``tracers/reading/memory_view.py``) follows the
live bytes. What comes back says whether the code fits one device of the
target, with the peak, its holders and the compiler's refusals, on a machine
that could not hold the model; the TPU target tracer (``tracers/reading/target_findings.py``)
turns each program's target compile into the record a ``--target`` run keeps
(memory, cost, roofline, padding), from the dry run's own compile.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from tpu_debug.core.format import format_bytes
from tpu_debug.runtime import probes
from tpu_debug.runtime.dry_mode import TARGET_LEVEL, DryRunValueError, ProgramCompile, dry_mode, target_future
from tpu_debug.runtime.target import LibtpuMissingError, Target, parse_target
from tpu_debug.tracers.events import (
    MemoryFindingEvent,
    MemorySummaryEvent,
    SourceLocation,
    TargetCompileEvent,
)
from tpu_debug.tracers.recording.memory_tracker import MemoryTracer
from tpu_debug.tracers.reading.memory_view import describe_fix, describe_holder, need_text
from tpu_debug.tracers.recording.target_tracer import DEFAULT_WAIT, TargetTracer
from tpu_debug.tracers.reading.transfer_causes import CAUSE_TEXT
from tpu_debug.tracers.recording.transfer_sites import classify

__all__ = ["DryRunResult", "DryRunValueError", "dry_run", "value_reader"]


@dataclasses.dataclass(frozen=True, slots=True)
class DryRunResult:
    """What a dry run found.

    Attributes:
        target: the TPU target.
        memory: the memory summary (peak, holders, the largest program's
            temporaries, the need against one device's HBM).
        findings: the does-not-fit findings, with estimated fixes.
        programs: every program sent to the target's compiler, with its result.
        stopped: the value read that stopped the run early, if one did.
        outputs: what ``fn`` returned (tensors that hold no data), None if it stopped.
        notes: what the dry run could not do (libtpu missing, say).
        seconds: the dry run, wall clock (the target compiles included).
        compiles: each distinct program's target compile as a ``--target`` run records
            it (memory, the compiler's cost, the roofline estimate, padding), at the dry
            run's effort level (``optimization_level``); empty without libtpu.
    """

    target: Target
    memory: MemorySummaryEvent
    findings: tuple[MemoryFindingEvent, ...]
    programs: tuple[ProgramCompile, ...]
    stopped: DryRunValueError | None
    outputs: Any
    notes: tuple[str, ...]
    seconds: float
    compiles: tuple[TargetCompileEvent, ...] = ()

    @property
    def fits(self) -> bool | None:
        """True if the estimate fits one device and no program ran out of HBM; None when
        nothing was measured."""
        return self.memory.fits

    @property
    def ooms(self) -> list[ProgramCompile]:
        """Programs the target's compiler refused for want of HBM."""
        return [p for p in self.programs if p.result is not None and p.result.fits is False]

    @property
    def refused(self) -> list[ProgramCompile]:
        """Programs the target's compiler refused for another reason, or that failed to compile."""
        return [p for p in self.programs if p.error is not None or (p.result is not None and p.result.fits is None)]

    def render(self, cwd: str | None = None) -> str:
        """The answer in a few lines."""
        m = self.memory
        verdict = {True: "fits", False: "does NOT fit", None: "unknown"}[m.fits]
        lines = [
            f"dry run for {self.target.name}: {verdict}: needs ~{format_bytes(m.required_bytes)} of "
            f"{format_bytes(m.capacity_bytes)} per chip ({need_text(m)}, in step {m.peak_step})",
            f"{len(self.programs)} program(s) compiled for {self.target.name} in {self.seconds:.1f} s; "
            f"{len(self.ooms)} out of HBM, {len(self.refused)} refused",
        ]
        if self.stopped is not None:
            lines.append(f"stopped early: {self.stopped.what}" + (f" at {self.stopped.where}" if self.stopped.where else ""))
        for h in m.holders[:5]:
            lines.append(f"  {describe_holder(h, cwd)}")
        for f in self.findings[:1]:
            for fix in f.fixes:
                lines.append(f"  fix: {describe_fix(fix)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


class _Kept:
    """Where ``dry_run()``'s target tracer puts its events: kept here, no run is recorded."""

    def __init__(self) -> None:
        self.events: list = []
        self._ids = itertools.count(1)

    def new_id(self) -> int:
        return next(self._ids)

    def put(self, event: Any) -> None:
        self.events.append(event)


def _target_tracer(target: Target) -> Any:
    """A target tracer recording the dry run's own compiles (None without libtpu: the dry run
    says so in its notes)."""
    try:
        return TargetTracer(_Kept(), target, hlo=False, reuse=target_future, optimization_level=TARGET_LEVEL)
    except LibtpuMissingError:
        return None


def _where(location: SourceLocation | None) -> str | None:
    if location is None:
        return None
    file = location.file
    try:
        rel = os.path.relpath(file)
        if not rel.startswith(".."):
            file = rel
    except ValueError:  # another drive
        pass
    return f"{file}:{location.line}"


def value_reader() -> tuple[Callable[[str], tuple[str, str | None]], dict[str, Any]]:
    """``(describe, seen)``: the dry mode's ``describe`` (what a value read is and its line,
    from the stack at the read) and where it keeps the last read's ``SourceLocation``."""
    seen: dict[str, Any] = {}

    def describe(op: str) -> tuple[str, str | None]:
        cause, _implicit, location = classify(op, 2)
        seen["location"] = location
        if cause.startswith("fallback:"):
            what = f"aten::{cause.removeprefix('fallback:')} has no tpu lowering and would run on CPU"
        else:
            what = CAUSE_TEXT.get(cause, cause)
        return what, _where(location)

    return describe, seen


def dry_run(fn: Callable[..., Any], *inputs: Any, target: str | Target = "v5e", compile_timeout: float | None = None,
            **kwargs: Any) -> DryRunResult:
    """Run ``fn(*inputs, **kwargs)`` with tensors that hold no data; compile every program for ``target``.

    Inside, every `tpu` tensor is a shape and a dtype: ops compute output shapes
    from their lowerings, nothing executes, host data is never copied to the
    device, and each program goes to the TPU compiler for ``target``. Build the
    model inside ``fn`` under ``torch.device("tpu")`` so its parameters hold no data
    either (a model built on the host keeps its host copy). A value read
    (``.item()``, ``print(t)``, ``if t:``) stops the run there; what ran before it is
    still measured.

    Args:
        fn: the code to dry-run (a training step, a forward, a whole ``main``).
        *inputs: its positional arguments (tensors may hold data or not).
        target: the TPU target (``"v5e"``, ``"v6e"``, ``"v5e-8"``, ...); the need is
            compared with one device of it.
        compile_timeout: seconds to wait for each target compile (None: no limit).
        **kwargs: ``fn``'s keyword arguments.

    Returns:
        A :class:`DryRunResult`: ``fits``, the memory summary (peak, holders,
        temporaries, the need per chip), findings with estimated fixes, each
        program's target compile (``programs``; ``compiles``: as recorded, with the
        roofline estimate), the stop if there was one.

    Raises:
        TargetSpecError: ``target`` names no known TPU.
        DryRunError: a dry run is active already.
        Exception: whatever ``fn`` raises other than a value read.

    Example::

        def step():
            with torch.device("tpu"):
                model = TinyLlama(cfg).to(torch.bfloat16)
            model(torch.zeros(8, 2048, dtype=torch.long, device="tpu")).float().mean().backward()
        result = tpu_debug.dry_run(step, target="v6e")
        result.fits, result.memory.required_bytes
    """
    tgt = parse_target(target)
    started = time.perf_counter()
    describe, seen = value_reader()
    tracer = MemoryTracer(target=tgt, dry_run=True)
    tracer.start()
    probes.subscribe(tracer)
    compiles = _target_tracer(tgt)
    if compiles is not None:
        probes.subscribe(compiles)
    stopped: DryRunValueError | None = None
    outputs = None
    collected = False
    try:
        with dry_mode(tgt, describe=describe) as mode:
            try:
                outputs = fn(*inputs, **kwargs)
            except DryRunValueError as exc:
                stopped = exc
            programs = mode.collect(compile_timeout)
            collected = True
        tracer.add_target_programs(programs)
        if stopped is not None:
            tracer.stop_at(stopped.what, seen.get("location"))
        summary = tracer.close()
    finally:
        probes.unsubscribe(tracer)
        tracer.close()
        if compiles is not None:
            probes.unsubscribe(compiles)
            # once collected, the compiles are done and this records them; when fn raised, the
            # error is not held up by compiles nobody will read
            wait = (compile_timeout if compile_timeout is not None else DEFAULT_WAIT) if collected else 0.0
            compiles.close(wait=wait)
    kept = compiles.writer.events if compiles is not None else []
    return DryRunResult(tgt, summary, tuple(tracer.findings), tuple(programs), stopped, outputs,
                        tuple(mode.notes), time.perf_counter() - started,
                        tuple(e for e in kept if isinstance(e, TargetCompileEvent)))
