"""The advisor's rule registry: one :class:`Rule` per kind of finding, filled by :func:`rule`.

Rules live in their own modules (:mod:`.rules` for the step-loop rules,
:mod:`.fit` for memory, TPU target and dry-run fit) and register themselves
when imported; the advisor package imports them once. This module imports
no rule, so a rule module imports it without a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.advisor.findings import Finding

__all__ = ["RULES", "Rule", "lookup", "rule"]


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A registered rule: its kind (the findings' ``kind``), what it looks for, and the function."""

    kind: str
    about: str
    check: Callable[[RunFacts], Iterable[Finding]]
    view: str | None = None  # the TUI view (its mode name) that shows what the findings are about


RULES: dict[str, Rule] = {}


def rule(kind: str, *, about: str, view: str | None = None) -> Callable:
    """Register ``fn(facts) -> Iterable[Finding]`` as the rule for findings of ``kind``, whose
    findings the TUI view ``view`` (``"recompiles"``, ``"ops"``, ...) shows the subject of.

    Raises:
        ValueError: a rule of this kind is already registered.

    Example:
        >>> @rule("my_kind", about="what it looks for", view="ops")
        ... def my_kind(facts: RunFacts) -> Iterable[Finding]:
        ...     yield from ()
    """

    def register(fn: Callable[[RunFacts], Iterable[Finding]]) -> Callable[[RunFacts], Iterable[Finding]]:
        known = RULES.get(kind)
        if known is not None:
            raise ValueError(
                f"advisor rule {kind!r} is registered twice: {known.check.__module__}.{known.check.__qualname__} "
                f"and {fn.__module__}.{fn.__qualname__}"
            )
        RULES[kind] = Rule(kind, about, fn, view)
        return fn

    return register


def lookup(kind: str) -> Rule:
    """The rule of ``kind``.

    Raises:
        ValueError: no rule has that kind.
    """
    try:
        return RULES[kind]
    except KeyError:
        raise ValueError(f"no advisor rule {kind!r}; rules: {', '.join(sorted(RULES))}") from None
