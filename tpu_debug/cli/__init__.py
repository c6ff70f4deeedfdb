"""The ``tpu-debug`` command line: one module per subcommand (``prepare_parser`` + ``run``).

``main(argv)`` parses, dispatches and turns a :class:`~tpu_debug.errors.TpuDebugError`
into one line on stderr and an exit code; it never prints a traceback of ours.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tpu_debug._version import __version__
from tpu_debug.cli import diff, report, run, runs, tensorboard, tui
from tpu_debug.errors import CommandError, TpuDebugError

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS = {
    "run": run,
    "report": report,
    "runs": runs,
    "tui": tui,
    "tensorboard": tensorboard,
    "diff": diff,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-debug",
        description="Record and inspect what PyTorch does on a TPU (XLA) device: "
        "per-op HLO, compiles, transfers.",
    )
    parser.add_argument("--version", action="version", version=f"tpu-debug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        doc = (module.__doc__ or "").strip().splitlines()[0]
        command_parser = sub.add_parser(name, help=doc, description=doc)
        module.prepare_parser(command_parser)
        command_parser.set_defaults(entry=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tpu-debug`` command line; returns the exit code.

    Example:
        >>> main(["report", "--logdir", "tpu_debug_runs"])
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.entry(args))
    except TpuDebugError as exc:
        print(f"tpu-debug {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, CommandError) else 1
