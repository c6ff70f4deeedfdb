"""Print the report of a run (the latest by default)."""

from __future__ import annotations

import argparse
import json
import sys

import tpu_debug
from tpu_debug.core.options import default_logdir
from tpu_debug.ranks import find_group
from tpu_debug.report import print_rank_report, rank_data, report_data
from tpu_debug.tracers.reading.compile_profile import write_compile_profile


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="run directory, run.db, or run name (default: the latest run); the directory of a "
        "multi-process run reports its ranks side by side",
    )
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument(
        "--width",
        type=width_argument,
        metavar="N",
        help="line width of the text (default: the terminal's; in a file or a pipe $COLUMNS, else 160; "
        "there, table cells wrap rather than lose text)",
    )
    parser.add_argument(
        "--compile-profile",
        metavar="PATH",
        help="also write the run's compile time by source line as a pprof profile (gzipped protobuf) to PATH, "
        "for pprof -top PATH or pprof -http=: PATH; its samples add up to compiles.lines of the JSON",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    output.add_argument(
        "--json",
        action="store_true",
        help="the report as JSON (schema tpu_debug.report/1; a multi-process run: tpu_debug.ranks/1; "
        "see docs/report_schema.md)",
    )


def width_argument(text: str) -> int:
    try:
        width = int(text)
    except ValueError:
        width = 0
    if width < 20:
        raise argparse.ArgumentTypeError(f"{text!r} is no line width (a whole number, 20 or more)")
    return width


def run(args: argparse.Namespace) -> int:
    terminal = False if args.plain else None
    group = find_group(args.run, _logdir(args.logdir))
    if group is not None:  # a multi-process run: its ranks side by side
        with group:
            if args.json:
                _dump(rank_data(group))
            else:
                print_rank_report(group, file=sys.stdout, terminal=terminal, width=args.width)
        return 0
    session = tpu_debug.open_run(args.run, logdir=args.logdir)
    try:
        if args.compile_profile:
            written = write_compile_profile(session, args.compile_profile)
            print(f"compile profile written to {written}", file=sys.stderr)
        if args.json:
            _dump(report_data(session))
        else:
            tpu_debug.print_report(session, file=sys.stdout, terminal=terminal, width=args.width)
    finally:
        session.close()
    return 0


def _dump(data: dict) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _logdir(logdir: str | None):
    return logdir if logdir is not None else default_logdir()
