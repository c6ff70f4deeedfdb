"""The run report: the advisor's findings, the steps, what ran where, and one section per tracer.

:mod:`~tpu_debug.report.core` holds the section registry and the render driver; each
other module declares one section or a small family of them with ``@section`` (importing
this package registers them all). Sizes, times and source lines are written by
:mod:`tpu_debug.core.format`, as everywhere else. What the run should change is the
advisor's (:mod:`tpu_debug.tracers.advisor`): the "Findings" section renders its records
and composes no advice of its own.
"""

from __future__ import annotations

from tpu_debug.core.format import format_bytes, format_location, format_seconds, short_path
from tpu_debug.report import (  # noqa: F401  (each module registers its sections)
    compile_time,
    divergence,
    findings,
    fit,
    invalid_values,
    memory,
    programs,
    recompiles,
    run,
    steps,
    target,
    transfers,
)
from tpu_debug.report.core import (
    PLAIN_WIDTH,
    RANKS_SCHEMA,
    REPORT_SCHEMA,
    SECTIONS,
    Section,
    plain_width,
    print_report,
    report_data,
    section,
)
from tpu_debug.report.findings import advice_of, finding_text
from tpu_debug.report.ranks import print_rank_report, rank_data, rank_figures

__all__ = [
    "PLAIN_WIDTH",
    "RANKS_SCHEMA",
    "REPORT_SCHEMA",
    "SECTIONS",
    "Section",
    "advice_of",
    "finding_text",
    "format_bytes",
    "format_location",
    "format_seconds",
    "plain_width",
    "print_rank_report",
    "print_report",
    "rank_data",
    "rank_figures",
    "report_data",
    "section",
    "short_path",
]
