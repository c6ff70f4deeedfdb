"""Print the report of a run (the latest by default)."""

from __future__ import annotations

import argparse
import json
import sys

import tpu_debug


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="run directory, run.db, or run name (default: the latest run); the directory of a "
        "multi-process run reports its ranks side by side",
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
    from tpu_debug.ranks import find_group
    from tpu_debug.report import print_rank_report

    group = find_group(args.run, _logdir(args.logdir))
    if group is not None:  # a multi-process run: its ranks side by side
        with group:
            print_rank_report(group, file=sys.stdout, terminal=False if args.plain else None)
        return 0
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


def _logdir(logdir: str | None):
    from tpu_debug.config import TraceConfig

    return logdir if logdir is not None else TraceConfig.from_env().logdir
