"""Widgets of the TUI: HLO text and diff views, source excerpts, paged tables."""

from __future__ import annotations

from tpu_debug.tui.widgets.fit_table import Col, FitTable
from tpu_debug.tui.widgets.hlo_diff import DiffRow, HloDiffView, diff_rows
from tpu_debug.tui.widgets.hlo_highlight import highlight_line
from tpu_debug.tui.widgets.hlo_view import HloView
from tpu_debug.tui.widgets.paged_table import PagedTable
from tpu_debug.tui.widgets.source_view import SourceExcerpt, SourceView, read_excerpt

__all__ = [
    "Col",
    "DiffRow",
    "FitTable",
    "HloDiffView",
    "HloView",
    "PagedTable",
    "SourceExcerpt",
    "SourceView",
    "diff_rows",
    "highlight_line",
    "read_excerpt",
]
