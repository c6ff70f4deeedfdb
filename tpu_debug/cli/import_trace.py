"""Read a TORCH_TRACE directory (any PyTorch program's structured trace) into runs, one per rank."""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_debug.core.errors import CommandError
from tpu_debug.core.options import default_logdir


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="DIR", help="the directory TORCH_TRACE named")
    parser.add_argument("--logdir", help="where runs go (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument("--name", help="run name (default: torch_trace, with -rankN per rank)")


def run(args: argparse.Namespace) -> int:
    from tpu_debug.importtrace import import_trace  # deferred: entry: it records, with torch and jax

    logdir = Path(args.logdir) if args.logdir else default_logdir()
    try:
        runs = import_trace(Path(args.trace_dir), logdir, args.name)
    except FileNotFoundError as exc:
        raise CommandError(str(exc)) from None
    for run_dir in runs:
        print(run_dir)
    return 0
