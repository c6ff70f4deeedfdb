"""The rule for argument values a TPU computes with silently: an index out of range, which XLA
clamps into range (the program goes on with another row), a probability distribution that is
not one, which XLA samples from. PyTorch on CPU raises for both, so a program that trains on
CPU stops there, and the same program on a TPU trains on garbage.

Every occurrence is an error, in any step: no warm-up excuses a wrong row. One finding per
(line, op, argument) of the forward; the backward of an op (``scatter_add`` for ``gather``)
meets the same index again and is folded into its forward's finding, unless no forward
finding has its value and bounds (an op only a backward runs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpu_debug.core.format import format_location
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Count, Evidence, Finding
from tpu_debug.tracers.advisor.registry import rule

__all__ = ["DATA_CHECKS_SWITCH"]

# the switch that makes every mode raise PyTorch's error at the op (core/options.py's
# data_checks; TorchTPU's own variable sets it too)
DATA_CHECKS_SWITCH = "TPU_DEBUG_DATA_CHECKS=1 (or TorchTPU's TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS=1)"
# ops that write at the index rather than read there
_WRITERS = ("scatter", "index_put", "index_add", "index_copy", "index_fill", "put", "masked_scatter")


def _number(value: float | None) -> str:
    if value is None:
        return "-inf"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _where(loc: Any) -> str:
    return format_location(loc.file, loc.line) if loc is not None else "an unknown line"


def _what(e: Any) -> str:
    """The offence in a few words: ``gather index 7 out of range [0, 5)``."""
    if e.silent == "sampled":
        return f"{e.op} {e.argument} is not a probability distribution ({e.message})"
    if e.op.startswith("masked_scatter"):
        return f"{e.op} {e.argument} selects {_number(e.value)} elements, more than its source holds"
    high = _number(e.high) if e.high is not None else "inf"
    return f"{e.op} {e.argument} {_number(e.value)} out of range [{_number(e.low)}, {high})"


def _silently(e: Any) -> str:
    """What a TPU does instead of raising."""
    if e.silent == "sampled":
        return "a TPU samples from it anyway"
    if e.op.startswith("masked_scatter"):
        return "a TPU reads past the source's end"
    verb = "writes" if any(w in e.op for w in _WRITERS) else "reads"
    return f"a TPU clamps it and {verb} another row"


def _fix(e: Any) -> str:
    if e.silent == "sampled":
        cure = ("look at where the probabilities come from (a softmax of non-finite logits, a mask that zeroes "
                "a whole row, a temperature of 0); check them with torch.isfinite and their row sums before "
                "sampling")
    else:
        cure = ("look at where the index comes from (a label or token id beyond the table's size, an "
                "off-by-one, a vocabulary or class count that does not match the data); if out-of-range values "
                "are expected, clamp or mask them explicitly (index.clamp(0, n - 1), or torch.where on a "
                "validity mask)")
    return f"{cure}; run with {DATA_CHECKS_SWITCH} to raise PyTorch's error at the line in every mode"


def _matches(backward: Any, forward: Any) -> bool:
    """A backward op meeting the same offending value as a forward op (compiled mode: at its line)."""
    b, f = backward.event, forward.event
    same = (b.argument, b.value, b.low, b.high) == (f.argument, f.value, f.low, f.high)
    return same and (b.mode != "compiled" or b.location == f.location)


@rule("invalid_value", about="an op given argument values PyTorch refuses and a TPU computes with silently "
      "(an index out of range, which XLA clamps)", view="ops")
def invalid_value(facts: RunFacts) -> Iterable[Finding]:
    places = facts.query.invalid_values()
    forward = [p for p in places if p.event.phase != "backward"]
    folded: dict[int, list[Any]] = {}
    alone = []
    for p in places:
        if p.event.phase != "backward":
            continue
        host = next((f for f in forward if _matches(p, f)), None)
        if host is None:
            alone.append(p)
        else:
            folded.setdefault(host.event.id, []).append(p)
    for p in forward + alone:
        yield _finding(facts, p, folded.get(p.event.id, ()))


def _finding(facts: RunFacts, place: Any, backward: Iterable[Any]) -> Finding:
    e = place.event
    where = _where(e.location)
    title = f"{_what(e)} at {where}: {_silently(e)}; CPU PyTorch raises"
    if e.phase == "backward":
        title += f" (in the backward{f' of {e.autograd_node}' if e.autograd_node else ''})"
    notes = [f"PyTorch on CPU: {e.error}: {e.message}", f"{e.mode} mode, {e.count} time(s)"]
    notes.append(f"raised at the op in this run ({e.error})" if e.raised else
                 "not raised in this run: the program went on with XLA's result")
    for b in backward:
        node = f" ({b.event.autograd_node})" if b.event.autograd_node else ""
        notes.append(f"its backward{node} met it again: {b.event.op} at {_where(b.event.location)}, "
                     f"{b.event.count} time(s)")
    first, last = facts.step_of(e.ts), facts.step_of(place.last_ts)
    steps = (first, last if last is not None else first) if first is not None else None
    return Finding(
        kind="invalid_value",
        severity="error",
        title=title,
        fix=_fix(e),
        cost_seconds=0.0,
        evidence=Evidence(e.location, (Count("occurrences", e.count),), tuple(notes)),
        steps=steps,
        cause=e.silent,
        subject=f"{e.op} {e.argument} at {format_location(e.location.file, e.location.line, e.location.function)}"
        if e.location is not None else f"{e.op} {e.argument}",
        targets=(e.op,),
    )
