"""One finding per cause: findings that one cause made are folded into the finding of the cause.

The rules look at one kind of event each, so one cause can reach several of them: a Python value
a compiled function reads makes it recompile and then hit dynamo's recompile limit; a ``print``
inside a compiled function splits its graph and reads the tensor back; a boolean mask reads its
count back and gives the ops after it a new shape each time. A reader needs the cause first and
what it led to under it, so each :class:`Relation` names a kind of finding that is a consequence
of another kind when the two are about the same thing, and :func:`one_per_cause` folds each such
finding into its cause's as a :class:`~.findings.Consequence` (its severity, cost and steps go
to the cause's finding). A size that changes is already one finding when the rule makes it (see
``recompile_rules``: its consequences are built there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tpu_debug.tracers.advisor.findings import SEVERITIES, Consequence, Finding

__all__ = ["RELATIONS", "Relation", "fold", "one_per_cause"]


def _same_line(a: Finding, b: Finding) -> bool:
    la, lb = a.evidence.location, b.evidence.location
    return la is not None and lb is not None and (la.file, la.line) == (lb.file, lb.line)


def _overlap(a: Finding, b: Finding) -> bool:
    """Seen in common steps (or one of them is not tied to steps)."""
    if a.steps is None or b.steps is None:
        return True
    return a.steps[0] <= b.steps[1] and b.steps[0] <= a.steps[1]


@dataclasses.dataclass(frozen=True, slots=True)
class Relation:
    """A finding of kind ``effect`` is a consequence of one of kind ``cause`` when ``same``
    says they are about the same thing (``why``: what makes it so, for a reader)."""

    cause: str
    effect: str
    same: Callable[[Finding, Finding], bool]
    why: str


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "recompile", "recompile_limit",
        lambda cause, effect: bool(set(cause.targets) & set(effect.targets)),
        "the function recompiled for that cause until dynamo stopped compiling it",
    ),
    Relation(
        "dynamic_shape", "recompile_limit",
        lambda cause, effect: bool(set(cause.targets) & set(effect.targets)),
        "the function recompiled for each new size until dynamo stopped compiling it",
    ),
    Relation(
        "graph_break", "implicit_sync",
        lambda cause, effect: cause.cause == "graph_break" and _same_line(cause, effect) and _overlap(cause, effect),
        "the read that splits the compiled function's graph is the read that waits for the device",
    ),
    Relation(
        "implicit_sync", "dynamic_shape",
        lambda cause, effect: cause.cause == "shape" and _same_line(cause, effect) and _overlap(cause, effect),
        "the size read back is the size the ops after it are compiled for",
    ),
)


def fold(cause: Finding, effects: Sequence[Finding]) -> Finding:
    """``cause`` holding each of ``effects`` as a consequence: the worst severity of them all,
    their costs added, the steps of every one."""
    consequences = list(cause.consequences)
    for e in effects:
        consequences.append(Consequence(e.kind, e.title, e.evidence.location, e.cost_seconds, e.targets))
        consequences.extend(e.consequences)
    spans = [f.steps for f in (cause, *effects) if f.steps is not None]
    severity = min((f.severity for f in (cause, *effects)), key=SEVERITIES.index)
    return dataclasses.replace(
        cause,
        severity=severity,
        cost_seconds=cause.cost_seconds + sum(e.cost_seconds for e in effects),
        steps=(min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None,
        consequences=tuple(consequences),
        estimated=cause.estimated or any(e.estimated for e in effects),
    )


def one_per_cause(findings: Sequence[Finding], relations: Sequence[Relation] = RELATIONS) -> list[Finding]:
    """``findings`` with each consequence folded into its cause's finding (the costliest cause
    when several would take it; a cause that is itself a consequence is folded with what it
    took); a finding that is the consequence of none stays as it is.

    Example::

        [f.kind for f in one_per_cause(findings)]   # ['recompile'], was ['recompile', 'recompile_limit']
    """
    out = list(findings)
    while True:
        pair = next(
            ((i, j) for i, effect in enumerate(out) for j in _causes_of(out, i, effect, relations)[:1]),
            None,
        )
        if pair is None:
            return out
        i, j = pair
        folded = fold(out[j], [out[i]])
        out = [folded if k == j else f for k, f in enumerate(out) if k != i]


def _causes_of(out: Sequence[Finding], i: int, effect: Finding, relations: Sequence[Relation]) -> list[int]:
    """The findings ``effect`` (at ``i``) is a consequence of, costliest first."""
    found = [
        j for j, cause in enumerate(out)
        if j != i and any(r.cause == cause.kind and r.effect == effect.kind and r.same(cause, effect) for r in relations)
    ]
    return sorted(found, key=lambda j: -out[j].cost_seconds)
