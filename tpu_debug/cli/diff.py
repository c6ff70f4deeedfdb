"""Show what changed between two runs: step time, compiles, transfers, divergence, findings."""

from __future__ import annotations

import argparse
import json
import sys

import tpu_debug
from tpu_debug.cli.report import width_argument
from tpu_debug.diff import diff_data, print_diff


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="the run before: a run directory, run.db, or run name")
    parser.add_argument("run_b", metavar="RUN_B", help="the run after")
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument(
        "--width",
        type=width_argument,
        metavar="N",
        help="line width of the text (default: the terminal's; in a file or a pipe $COLUMNS, else 160)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    output.add_argument(
        "--json",
        action="store_true",
        help="the diff as JSON (schema tpu_debug.diff/1, see docs/report_schema.md)",
    )


def run(args: argparse.Namespace) -> int:
    with tpu_debug.open_run(args.run_a, logdir=args.logdir) as a, tpu_debug.open_run(args.run_b, logdir=args.logdir) as b:
        if args.json:
            json.dump(diff_data(a, b), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print_diff(a, b, file=sys.stdout, terminal=False if args.plain else None, width=args.width)
    return 0
