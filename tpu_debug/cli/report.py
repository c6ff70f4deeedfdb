"""Print the report of a run (the latest by default)."""

from __future__ import annotations

import argparse
import json
import sys

import tpu_debug


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", nargs="?", metavar="RUN", help="run directory, run.db, or run name (default: the latest run)"
    )
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    output.add_argument(
        "--json",
        action="store_true",
        help="the report as JSON (schema tpu_debug.report/1, see docs/report_schema.md)",
    )


def run(args: argparse.Namespace) -> int:
    session = tpu_debug.open_run(args.run, logdir=args.logdir)
    try:
        if args.json:
            from tpu_debug.report import report_data

            json.dump(report_data(session), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            tpu_debug.print_report(session, file=sys.stdout, terminal=False if args.plain else None)
    finally:
        session.close()
    return 0
