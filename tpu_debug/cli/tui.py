"""Open the terminal UI on a run (the latest by default; a running one is followed live)."""

from __future__ import annotations

import argparse
import sys

import tpu_debug
from tpu_debug_core.errors import CommandError


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", nargs="?", metavar="RUN", help="run directory, run.db, or run name (default: the latest run)"
    )
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument(
        "--poll",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="while the run is still recorded, look for new events this often (default: 1)",
    )


def open_tui(session: tpu_debug.Session, *, poll_interval: float = 1.0, **options) -> None:
    """Run the TUI on ``session`` in this terminal.

    Raises:
        CommandError: standard input or output is not a terminal.
    """
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CommandError(
            "the terminal UI needs a terminal (standard input/output is redirected); "
            f"print the report instead: tpu-debug report {session.run_dir}",
            exit_code=2,
        )
    from tpu_debug.tui import run_app

    run_app(session, poll_interval=poll_interval, **options)


def run(args: argparse.Namespace) -> int:
    if args.poll <= 0:
        raise CommandError(
            f"--poll {args.poll}: give a number of seconds above 0, e.g. --poll 0.5", exit_code=2
        )
    from tpu_debug_core.options import default_logdir
    from tpu_debug.ranks import find_group

    logdir = args.logdir if args.logdir is not None else default_logdir()
    group = find_group(args.run, logdir)
    if group is not None:  # a multi-process run: open its first rank; `r` switches
        ranks = group.rank_dirs()
        if not ranks:
            raise CommandError(f"{group.path}: no rank of this multi-process run recorded anything")
        rank, run = next(iter(ranks.items()))
        session = tpu_debug.open_run(run)
        try:
            open_tui(session, poll_interval=args.poll, group=group, rank=rank)
        finally:
            session.close()
            group.close()
        return 0
    session = tpu_debug.open_run(args.run, logdir=args.logdir)
    try:
        open_tui(session, poll_interval=args.poll)
    finally:
        session.close()
    return 0
