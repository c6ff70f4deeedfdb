"""Open the terminal UI on a run (not available yet)."""

from __future__ import annotations

import argparse
import sys


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", nargs="?", metavar="RUN", help="run directory or name (default: the latest run)"
    )
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")


def run(args: argparse.Namespace) -> int:
    print(
        "tpu-debug tui: the terminal UI is not available yet in this version; "
        "use 'tpu-debug report' meanwhile",
        file=sys.stderr,
    )
    return 2
