"""The TPU target's compiles read back: what they show the user should change, and the steps' estimates.

:func:`findings` reads a run's :class:`~tpu_debug.tracers.events.TargetCompileEvent`
records (written by ``tracers/recording/target_tracer.py``) into :class:`TargetFinding`
records: an HBM out-of-memory at compile time, and padding that wastes a fifth of an
array or more. They are the evidence the advisor's ``hbm_oom`` and ``tpu_padding`` rules
(``tracers/advisor/fit_rules.py``) make findings of, like every other finding.
:func:`step_summary` sums up the estimated step times and MFU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_debug.core.format import format_bytes, format_location
from tpu_debug.runtime.target.error_codes import by_code
from tpu_debug.tracers.events import PaddedBuffer, SourceLocation, TargetCompileEvent, TargetStepEvent

__all__ = [
    "MIN_WASTED_BYTES",
    "PADDING_WASTE",
    "TARGET_MODE",
    "TargetFinding",
    "code_text",
    "findings",
    "step_summary",
]

#: an array whose tiles pad this fraction of its bytes or more is a finding
PADDING_WASTE = 0.20
#: ... when the padding is at least one float32 (8, 128) tile: less is noise next to any program
MIN_WASTED_BYTES = 4096
#: the programs-table mode of TPU HLO (local programs are "eager" or "compiled")
TARGET_MODE = "target"


@dataclasses.dataclass(frozen=True, slots=True)
class TargetFinding:
    """Something the target compiles show that the user should change.

    ``kind`` is ``"hbm_oom"`` (a program does not fit one device's HBM at compile
    time; the run went on locally), ``"compile_error"`` (the compiler refused it for
    another reason XLA has a code for: the evidence's ``code``) or ``"padding"`` (TPU tiles pad an array by
    ``PADDING_WASTE`` of its bytes or more). ``evidence`` holds the figures, by
    name (bytes, flops, the arrays and programs); ``programs`` the programs and
    ``locations`` their user lines; ``fix`` what to do; ``cost`` what it costs
    (bytes over the limit, or bytes wasted per execution).
    """

    kind: str
    target: str
    subject: str
    evidence: tuple[tuple[str, Any], ...]
    programs: tuple[str, ...]
    locations: tuple[SourceLocation | None, ...]
    fix: str
    cost: float

    def figure(self, name: str, default: Any = None) -> Any:
        """One named figure of the evidence."""
        return next((v for k, v in self.evidence if k == name), default)

    def render(self) -> str:
        where = ", ".join(_where(loc) for loc in self.locations[:3] if loc is not None) or "-"
        code = self.figure("code_text")
        if self.kind == "hbm_oom":
            required, available = self.figure("required_bytes"), self.figure("available_bytes")
            need = f"needs {format_bytes(required)} of {format_bytes(available)}" if required is not None else "does not fit"
            what = self.figure("what")
            return (
                f"{self.subject} at {where} {need} of HBM on {self.target}"
                f"{f' ({what})' if what else ''} at compile time; the run went on locally"
                f"{f'. {code}' if code else ''}. Fix: {self.fix}"
            )
        if self.kind == "compile_error":
            at = _where(self.locations[0]) if self.locations and self.locations[0] is not None else "-"
            said = _words(self.figure("message") or "", self.figure("code") or "")
            return (f"the TPU compiler refused {self.subject} at {at} on {self.target}: {code}"
                    f"{f'. The compiler said: {said}' if said else ''}. Fix: {self.fix}")
        ops = ", ".join(self.programs[:3]) + (", ..." if len(self.programs) > 3 else "")
        text = (
            f"{self.subject}, laid out {self.figure('layout')}, is {self.figure('waste', 0.0):.0%} padding "
            f"({format_bytes(self.figure('wasted_bytes'))} of {format_bytes(self.figure('padded_bytes'))}) in "
            f"{self.figure('arrays')} array(s) of {ops} at {where}"
        )
        flops = self.figure("flops_wasted", 0.0)
        if flops:
            text += f"; {flops:.3g} FLOP of matrix products on padding per run of those programs"
        return f"{text}. Fix: {self.fix}"


def code_text(event: TargetCompileEvent) -> str | None:
    """``XLA error E1001 CompileTimeScopedVmemOom: <what it means> (<its page>)``, for a refusal
    XLA has a code for; None otherwise."""
    code = by_code(event.error_code) if event.error_code else None
    if code is None:
        return None
    how = "" if event.error_code_printed else " (recognised from the compiler's message, which this libtpu prints without its code)"
    at = f", at {event.error_instruction}" if event.error_instruction else ""
    if event.error_source_file and event.error_source_line:
        kernel = f" {event.error_source_function}" if event.error_source_function else ""
        at += f", in kernel{kernel} at {format_location(event.error_source_file, event.error_source_line)}"
    return f"XLA error {code.code} {code.name}{how}{at}: {code.meaning} ({code.url})"


def _refusal_location(e: TargetCompileEvent) -> SourceLocation | None:
    """The PyTorch line that made the instruction a refusal points at, else the compile's line."""
    if e.error_file and e.error_line:
        return SourceLocation(e.error_file, e.error_line, e.error_function or "")
    return e.location


def _words(message: str, code: str) -> str:
    """The compiler's own words of a refusal, after its status and code
    ("cannot statically prove that index in dimension 0 is a multiple of 8")."""
    name = code.split(":", 1)[-1].strip()
    if name and f"{name}:" in message:
        return message.split(f"{name}:", 1)[1].strip()
    return message.split(": ", 1)[-1].strip()


def _kernel_location(e: TargetCompileEvent) -> SourceLocation | None:
    """The line of the Pallas kernel whose operation Mosaic refused, when the refusal names one."""
    if e.error_source_file and e.error_source_line:
        return SourceLocation(e.error_source_file, e.error_source_line, e.error_source_function or "")
    return None


def _where(loc: SourceLocation | None) -> str:
    return "-" if loc is None else format_location(loc.file, loc.line)

def _larger_text(event: TargetCompileEvent) -> str:
    """``v6e: 31.25 GiB usable (spec 32.00 GiB), v5p: ...`` (names alone in runs recorded without
    the figures)."""
    if len(event.larger_hbm_bytes) != len(event.larger_targets):
        return ", ".join(event.larger_targets)
    figures = zip(event.larger_targets, event.larger_hbm_bytes, event.larger_spec_bytes)
    return ", ".join(
        f"{name}: {format_bytes(usable)} usable (spec {format_bytes(spec)})" if usable != spec else f"{name}: {format_bytes(spec)}"
        for name, usable, spec in figures
    )


def _oom_fix(event: TargetCompileEvent) -> str:
    larger = _larger_text(event)
    bigger = f"compile for a target with more HBM per chip ({larger}), or " if larger else ""
    return (
        f"{bigger}shard the program over more chips (a bigger {event.target.split('-')[0]}-N slice), or "
        "hold less at once: a smaller batch, bfloat16 activations, activation checkpointing"
    )


def _padding_fix(buffer: PaddedBuffer) -> str:
    parts = []
    for d, m in zip(buffer.pad_dims, buffer.pad_multiples):
        size = buffer.shape[d] if d < len(buffer.shape) else "?"
        hint = ", the batch" if d == 0 and m < 128 else ""
        parts.append(f"pad dimension {d} (size {size}{hint}) to a multiple of {m}")
    return "; ".join(parts) if parts else "choose sizes that are multiples of the tile"


def findings(events: Iterable[TargetCompileEvent]) -> list[TargetFinding]:
    """The findings of a run's target compiles: HBM out-of-memory first, then padding,
    worst first. A program that fits and pads little gives none.

    Args:
        events: the run's :class:`TargetCompileEvent` (``session.events("target_compile")``).

    Returns:
        One finding per program refused for HBM, and one per padded array shape
        (the same shape and layout in several programs is one finding).

    Example::

        for f in findings(session.events("target_compile")):
            print(f.render())
    """
    ooms: list[TargetFinding] = []
    padded: dict[tuple, list[tuple[TargetCompileEvent, PaddedBuffer]]] = {}
    for e in events:
        if e.status == "hbm_oom":
            ooms.append(TargetFinding(
                "hbm_oom", e.target, e.identity or e.name,
                (("required_bytes", e.required_bytes), ("available_bytes", e.available_bytes),
                 ("what", e.error_what), ("message", e.error_message), ("signature", e.signature),
                 ("code", e.error_code), ("code_text", code_text(e))),
                (e.signature,), (e.location,), _oom_fix(e),
                float((e.required_bytes or 0) - (e.available_bytes or 0)),
            ))
            continue
        code = by_code(e.error_code) if e.status == "compile_error" and e.error_code else None
        if code is not None:
            ooms.append(TargetFinding(
                "compile_error", e.target, e.identity or e.name,
                (("code", e.error_code), ("code_text", code_text(e)), ("message", e.error_message),
                 ("instruction", e.error_instruction), ("op", e.error_op), ("signature", e.signature)),
                (e.signature,), (_refusal_location(e), _kernel_location(e)), code.fix, 0.0,
            ))
            continue
        for b in e.worst:
            if b.waste >= PADDING_WASTE and b.wasted_bytes >= MIN_WASTED_BYTES:
                padded.setdefault((b.dtype, b.shape, b.layout), []).append((e, b))
    out = sorted(ooms, key=lambda f: -f.cost)
    pads = []
    for (dtype, shape, layout), items in padded.items():
        b = items[0][1]
        programs: list[str] = []
        locations: list[SourceLocation | None] = []
        for e, buf in items:
            label = buf.op if buf.op and buf.op != e.name else e.name
            if label not in programs:
                programs.append(label)
            loc = SourceLocation(buf.file, buf.line, buf.function or "") if buf.file and buf.line else e.location
            if loc not in locations:
                locations.append(loc)
        flops = sum(buf.flops_wasted for _, buf in items)
        subject = f"{dtype}[{','.join(map(str, shape))}]"
        pads.append(TargetFinding(
            "padding", items[0][0].target, subject,
            (("layout", layout), ("waste", b.waste), ("padded_bytes", b.padded_bytes),
             ("wasted_bytes", b.wasted_bytes), ("flops_wasted", flops), ("arrays", len(items))),
            tuple(programs), tuple(locations), _padding_fix(b), float(b.wasted_bytes * len(items)),
        ))
    pads.sort(key=lambda f: (-f.cost, f.subject))
    return out + pads


def step_summary(steps: Sequence[TargetStepEvent]) -> dict[str, Any] | None:
    """Median estimated step time and MFU over the finished steps (the whole run, or the
    unfinished tail, when there are none)."""
    done = [s for s in steps if not s.unfinished] or list(steps)
    if not done:
        return None
    seconds = sorted(s.estimated_seconds for s in done)
    mfus = sorted(s.mfu for s in done if s.mfu is not None)
    return {
        "steps": len(done),
        "whole_run": any(s.whole_run for s in done),
        "median_seconds": seconds[len(seconds) // 2],
        "min_seconds": seconds[0],
        "max_seconds": seconds[-1],
        "median_mfu": mfus[len(mfus) // 2] if mfus else None,
        "executions": done[len(done) // 2].executions,
        "estimated": done[len(done) // 2].estimated,
        "peak_memory_bytes": max((s.peak_memory_bytes or 0) for s in done) or None,
    }

