"""Rendering run data as text for the TUI: times, sizes, source lines, sparklines, key diffs.

Everything that comes from a run (op names, paths, signatures, HLO) becomes a
``rich.text.Text`` here, never a markup string: a ``[`` in a tensor repr or a
file name is shown as is.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence

from rich.text import Text
from tpu_debug.core.format import format_bytes, format_location, format_seconds, short_path
from tpu_debug.tracers.events import CompileEvent, KeyDiff, SourceLocation
from tpu_debug.tracers.reading.recompile_analysis import arg_diffs

__all__ = [
    "changed_text",
    "diff_summary",
    "fallback_diffs",
    "format_bytes",
    "format_float",
    "format_seconds",
    "location_text",
    "short_path",
    "sparkline",
]

_BARS = " ▁▂▃▄▅▆▇█"


def format_float(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def location_text(location: SourceLocation | None, cwd: str | None, *, function: bool = True) -> Text:
    if location is None:
        return Text("-", style="dim")
    text = Text(format_location(location.file, location.line, cwd=cwd, full=True))
    if function and location.function:
        text.append(f" {location.function}", style="dim")
    return text


def sparkline(values: Sequence[float]) -> str:
    """One character per value, its height relative to the largest (blank for zero)."""
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(_BARS[0 if v <= 0 else max(1, round(8 * v / top))] for v in values)


def changed_text(before: str, now: str) -> tuple[Text, Text]:
    """``before`` and ``now`` with the characters that differ emphasised (``9`` in ``f32[9,128]``)."""
    left, right = Text(before), Text(now)
    matcher = difflib.SequenceMatcher(None, before, now, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "delete") and i2 > i1:
            left.stylize("bold red", i1, i2)
        if tag in ("replace", "insert") and j2 > j1:
            right.stylize("bold green", j1, j2)
    return left, right


def diff_summary(diffs: Sequence[KeyDiff], limit: int = 2) -> Text:
    """``arg 0: f32[8] -> f32[9]; dtype: ...`` cut after ``limit`` diffs."""
    text = Text()
    for i, d in enumerate(diffs[:limit]):
        if i:
            text.append("; ", style="dim")
        text.append(f"{d.field}: ", style="bold")
        text.append(d.before)
        text.append(" → ", style="dim")
        text.append(d.now)
    if len(diffs) > limit:
        text.append(f" (+{len(diffs) - limit} more)", style="dim")
    return text


def fallback_diffs(
    event: CompileEvent, earlier: Sequence[CompileEvent]
) -> tuple[CompileEvent | None, list[KeyDiff]]:
    """For a run that recorded no key diff: the earlier compile whose inputs differ
    in the fewest places, and those differences (argument by argument)."""
    best: tuple[int, CompileEvent, list[KeyDiff]] | None = None
    for other in earlier:
        if other.id == event.id:
            continue
        diffs = arg_diffs(other.args, event.args)
        if not diffs and other.signature != event.signature:
            diffs.append(KeyDiff("key", other.signature, event.signature, detail="signature"))
        if best is None or len(diffs) < best[0] or (len(diffs) == best[0] and other.id > best[1].id):
            best = (len(diffs), other, diffs)
    if best is None:
        return None, []
    return best[1], best[2]
