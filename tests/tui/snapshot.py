"""Snapshot checks for TUI screens: the SVG Textual exports, compared with a stored file.

pytest-textual-snapshot needs syrupy 4.8, which needs pytest < 9 (this project
pins pytest 9), so the check is done here: ``app.export_screenshot()`` at a
fixed terminal size on the deterministic synthetic run, compared byte for byte
with ``tests/tui/snapshots/<name>.svg``. On a mismatch the new SVG is written
beside the old one (``<name>.new.svg``) and the assertion shows the screen's
text, line by line, so the difference reads without opening a browser.

Set ``UPDATE_TUI_SNAPSHOTS=1`` to (re)write the stored files.
"""

from __future__ import annotations

import difflib
import html
import os
import re
from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"

_TEXT = re.compile(r'<text [^>]*?x="([\d.]+)"[^>]*?clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>')
_CHAR_WIDTH = 12.2  # rich's export_svg: 0.61 x font size 20


def svg_text(svg: str) -> str:
    """The characters of an exported screen, one line per terminal row (spaces restored)."""
    rows: dict[int, dict[int, str]] = {}
    for x, line, content in _TEXT.findall(svg):
        col = round(float(x) / _CHAR_WIDTH)
        row = rows.setdefault(int(line), {})
        for i, ch in enumerate(html.unescape(content).replace("\xa0", " ")):
            row[col + i] = ch
    out = []
    for n in range(max(rows, default=-1) + 1):
        row = rows.get(n, {})
        out.append("".join(row.get(i, " ") for i in range(max(row, default=-1) + 1)).rstrip())
    return "\n".join(out)


def check_snapshot(svg: str, name: str) -> None:
    """Compare ``svg`` with the stored snapshot ``name`` (see the module docstring)."""
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get("UPDATE_TUI_SNAPSHOTS") == "1" or not path.exists():
        if not path.exists() and os.environ.get("CI"):
            raise AssertionError(f"snapshot {path} is missing; run the TUI tests with UPDATE_TUI_SNAPSHOTS=1")
        SNAPSHOTS.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8")
    if svg == expected:
        return
    new = path.with_suffix(".new.svg")
    new.write_text(svg, encoding="utf-8")
    diff = "\n".join(
        difflib.unified_diff(
            svg_text(expected).splitlines(), svg_text(svg).splitlines(), "stored", "now", lineterm=""
        )
    )
    raise AssertionError(
        f"screen {name!r} differs from {path.name} (new one written to {new}); "
        f"text diff (empty: only colours or styles changed):\n{diff}"
    )
