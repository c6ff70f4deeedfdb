"""Syntax colouring for HLO and StableHLO text (no lexer exists for either).

One line at a time, so a viewer colours only what is on screen.
"""

from __future__ import annotations

import re

from rich.text import Text

__all__ = ["INSTRUCTION_NAME", "highlight_line"]

# applied in order; a later rule wins where two overlap
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(?:HloModule|ENTRY|ROOT|module|func\.func|return|attributes)\b"), "bold magenta"),
    (re.compile(r"(?<=[\s=(])[a-z][\w\-]*(?=\()"), "bold blue"),  # opcode: add(, fusion(
    (re.compile(r"\bstablehlo\.[\w.]+|\bchlo\.[\w.]+|\bmhlo\.[\w.]+"), "bold blue"),
    (
        re.compile(
            r"\b(?:pred|token|s2|s4|s8|s16|s32|s64|u2|u4|u8|u16|u32|u64|f8\w*|f16|bf16|f32|f64|c64|c128)"
            r"\[[\d,]*\](?:\{[\d,:A-Z()]*\})?"
        ),
        "green",
    ),
    (re.compile(r"\btensor<[^>]*>"), "green"),
    (re.compile(r"%[\w.\-]+|@[\w.\-]+"), "cyan"),
    (re.compile(r"\b(?:metadata|backend_config|frontend_attributes)=\{.*?\}(?=,\s|$)"), "dim"),
    (re.compile(r'"(?:[^"\\]|\\.)*"'), "yellow"),
]

INSTRUCTION_NAME = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=")


def highlight_line(line: str) -> Text:
    """``line`` as rich Text with HLO / StableHLO tokens coloured (never read as markup)."""
    text = Text(line, no_wrap=True, end="")
    for pattern, style in _RULES:
        for m in pattern.finditer(line):
            text.stylize(style, m.start(), m.end())
    return text
