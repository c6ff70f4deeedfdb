"""The advisor: rules over a recorded run, each giving :class:`Finding` records (data, not prose
assembled by a view), ranked by what they cost.

A rule is one function registered with :func:`rule` under its kind (and the
TUI view that shows what its findings are about), in the rule module of its subject:
:mod:`.recompile_rules` (shapes that keep changing, recompiles, dynamo's limit),
:mod:`.transfer_rules` (syncs, uploads, copies to the host, CPU fallbacks),
:mod:`.execution_rules` (graph breaks, tiny eager ops, float64, divergence, sharding
rematerialization), :mod:`.step_rules` (what bounds the steps' time: input, syncs,
compiles, collectives, checkpoints), :mod:`.fit_rules` (fitting a TPU: memory, the target
compiler's refusals and padding, dry runs), :mod:`.collective_rules` (ranks that stopped
calling the same c10d collectives), :mod:`.invalid_value_rules` (argument values a TPU
computes with silently). Rule modules import :mod:`.registry` and :mod:`.prose`, never
this package, so adding a rule to one is one declaration plus its tests. Findings one cause
made are folded into its finding (:mod:`.causes`): the reader sees the cause, and what it led
to under it. A rule reads
the run through :class:`RunFacts` (every event placed in its step, and each
step labelled warm-up or steady state, see :mod:`tpu_debug.tracers.reading.step_phases`) and
yields findings. A finding is only made for what is true of this run and
worth changing: compiles while a program warms up, an upload before the
loop, a graph break in a function called once are not findings. Each rule is
tested in both directions (``tests/tracers/test_advisor.py``) and has a
pitfall example that triggers it (``examples/pitfalls/``), while the clean
examples give no finding at all (``tests/examples/test_advisor_examples.py``).

Example::

    advice = advise(tpu_debug.open_run())
    [(f.kind, f.title) for f in advice.findings]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

# the rule modules register their rules when imported; they import the registry, never this package
from tpu_debug.tracers.advisor import collective_rules as _collective_rules  # noqa: F401
from tpu_debug.tracers.advisor import execution_rules as _execution_rules  # noqa: F401
from tpu_debug.tracers.advisor import fit_rules as _fit_rules  # noqa: F401
from tpu_debug.tracers.advisor import invalid_value_rules as _invalid_value_rules  # noqa: F401
from tpu_debug.tracers.advisor import recompile_rules as _recompile_rules  # noqa: F401
from tpu_debug.tracers.advisor import step_rules as _step_rules  # noqa: F401
from tpu_debug.tracers.advisor import transfer_rules as _transfer_rules  # noqa: F401
from tpu_debug.tracers.advisor.causes import one_per_cause
from tpu_debug.tracers.advisor.execution_rules import FLOAT64_BY_PYTORCH, float64_origins
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import (
    FINDINGS_SCHEMA,
    SEVERITIES,
    Consequence,
    Count,
    Evidence,
    Finding,
    rank,
)
from tpu_debug.tracers.advisor.registry import RULES, Rule, lookup, rule
from tpu_debug.tracers.reading.step_phases import StepSummary
from tpu_debug.tracers.reading.view import RunView

__all__ = [
    "FINDINGS_SCHEMA",
    "FLOAT64_BY_PYTORCH",
    "RULES",
    "SEVERITIES",
    "Advice",
    "Consequence",
    "Count",
    "Evidence",
    "Finding",
    "Rule",
    "RunFacts",
    "advise",
    "float64_origins",
    "lookup",
    "rank",
    "rule",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Advice:
    """What the advisor made of a run: the findings, ranked (see :func:`rank`), the steps
    (warm-up and steady state), and the rules that failed (their text), if any."""

    findings: tuple[Finding, ...]
    steps: StepSummary
    errors: tuple[str, ...] = ()


def advise(query: RunView, *, kinds: Iterable[str] | None = None) -> Advice:
    """Run the rules over a run.

    A rule that raises does not stop the others: its error is kept in
    :attr:`Advice.errors` (the report shows it).

    Args:
        query: the run (a Session from :func:`tpu_debug.open_run`, or a ``RunQuery``).
        kinds: only these rules (default: all).

    Returns:
        The :class:`Advice`.

    Raises:
        ValueError: ``kinds`` names no rule.
    """
    facts = RunFacts(query)
    rules = [lookup(k) for k in kinds] if kinds is not None else list(RULES.values())
    findings: list[Finding] = []
    errors: list[str] = []
    for r in rules:
        try:
            findings.extend(r.check(facts))
        except Exception as exc:  # noqa: BLE001 - one rule's failure must not hide the others' findings
            errors.append(f"advisor rule {r.kind!r} failed: {type(exc).__name__}: {exc}")
    return Advice(tuple(rank(one_per_cause(findings))), facts.summary, tuple(errors))
