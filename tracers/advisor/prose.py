"""How the advisor's rules write what they find: lines, lists, counts, and "every step".

Findings are the only place the advisor's prose is made; the rule modules share these.
Every rule looks at steady state first: a cost paid once while the program warms up is
not worth a finding, a cost paid at every step is. "In every step" means in at least half
of the steady steps and in two of them at least (:func:`every_step`); a run without steps
(no ``optimizer.step()``, no ``tpu_debug.step()`` and no loop found) counts a line that
repeats :data:`REPEATS` times instead.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

from tpu_debug.core.format import format_location
from tpu_debug.tracers.advisor.facts import RunFacts
from tpu_debug.tracers.events import SourceLocation

__all__ = [
    "REPEATS",
    "every_step",
    "index_span",
    "listing",
    "most_common_line",
    "plural",
    "site_text",
    "unstepped",
    "where_text",
]

# a run without steps: a line that does something this many times sits in a loop
REPEATS = 3

def where_text(loc: SourceLocation | None) -> str:
    return format_location(loc.file, loc.line) if loc is not None else "an unknown line"


def site_text(loc: SourceLocation | None) -> str:
    """A line as a stable subject: ``train.py:41 in step``."""
    return format_location(loc.file, loc.line, loc.function) if loc is not None else "-"


def most_common_line(locations: Iterable[SourceLocation | None]) -> SourceLocation | None:
    counts = collections.Counter(loc for loc in locations if loc is not None)
    return counts.most_common(1)[0][0] if counts else None


def index_span(indexes: Sequence[int]) -> tuple[int, int] | None:
    return (min(indexes), max(indexes)) if indexes else None


def listing(values: Sequence[str], limit: int = 6) -> str:
    return ", ".join(values[:limit]) + (", ..." if len(values) > limit else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def every_step(facts: RunFacts, steps: Sequence[int]) -> bool:
    """Steady steps ``steps`` make "every step": half of the steady steps, two at least."""
    return len(steps) >= 2 and 2 * len(steps) >= len(facts.steady)


def unstepped(facts: RunFacts) -> bool:
    return not facts.steps
