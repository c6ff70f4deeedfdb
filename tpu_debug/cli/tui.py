"""Open the terminal UI on a run (the latest by default; a running one is followed live)."""

from __future__ import annotations

import argparse
import os
import sys

import tpu_debug
from tpu_debug.cli.tui_serve import check_options, serve
from tpu_debug.core.errors import CommandError
from tpu_debug.core.options import default_logdir
from tpu_debug.ranks import find_group


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
    parser.add_argument(
        "--serve",
        action="store_true",
        help="serve the terminal UI to a web browser instead of this terminal (each browser tab gets its own UI)",
    )
    parser.add_argument(
        "--host",
        help="with --serve: the address to listen on (default: 127.0.0.1, this machine only; "
        "reach it from elsewhere through an SSH port forward)",
    )
    parser.add_argument("--port", type=int, help="with --serve: the port to listen on (default: 8000)")


def open_tui(session: tpu_debug.Session, *, poll_interval: float = 1.0, **options) -> None:
    """Run the TUI on ``session`` in this terminal (or in the browser that textual-serve connected).

    Raises:
        CommandError: standard input or output is not a terminal.
    """
    # textual-serve starts the UI with its web driver named in TEXTUAL_DRIVER and pipes, not a terminal
    served = bool(os.environ.get("TEXTUAL_DRIVER"))
    if not served and not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CommandError(
            "the terminal UI needs a terminal (standard input/output is redirected); "
            f"print the report instead: tpu-debug report {session.run_dir}",
            exit_code=2,
        )
    from tpu_debug.tui import run_app  # deferred: entry: Textual loads only for the TUI

    run_app(session, poll_interval=poll_interval, **options)


def _serve(args: argparse.Namespace) -> int:
    """``tpu-debug tui --serve``: resolve the run here (its errors are said at once), then serve it."""
    host = args.host if args.host is not None else "127.0.0.1"
    port = args.port if args.port is not None else 8000
    check_options(host, port)
    logdir = args.logdir if args.logdir is not None else default_logdir()
    group = find_group(args.run, logdir)
    if group is not None:
        path = group.path
        group.close()
    else:
        session = tpu_debug.open_run(args.run, logdir=args.logdir)
        path = session.run_dir
        session.close()
    # the path, not the name: "the latest run" stays the run named here while the server runs
    serve([os.path.abspath(path), "--poll", repr(args.poll)], host=host, port=port)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.poll <= 0:
        raise CommandError(
            f"--poll {args.poll}: give a number of seconds above 0, e.g. --poll 0.5", exit_code=2
        )
    if args.serve:
        return _serve(args)
    if args.host is not None or args.port is not None:
        given = "--host" if args.host is not None else "--port"
        raise CommandError(f"{given} is for --serve: add --serve to open the UI in a browser", exit_code=2)

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
