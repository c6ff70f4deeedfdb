"""Syntax colouring for HLO and StableHLO text (no lexer exists for either).

One line at a time, so a viewer colours only what is on screen. Which spans are
keywords, opcodes, shapes, names, attributes and strings is the HLO reader's
(``tpu_debug.core.hlo_text.tokens``); the colours are this module's.
"""

from __future__ import annotations

from rich.text import Text
from tpu_debug.core.hlo_text import tokens

__all__ = ["highlight_line"]

_STYLES = {
    "keyword": "bold magenta",
    "opcode": "bold blue",
    "shape": "green",
    "name": "cyan",
    "attribute": "dim",
    "string": "yellow",
}


def highlight_line(line: str) -> Text:
    """``line`` as rich Text with HLO / StableHLO tokens coloured (never read as markup)."""
    text = Text(line, no_wrap=True, end="")
    for kind, start, end in tokens(line):
        text.stylize(_STYLES[kind], start, end)
    return text
