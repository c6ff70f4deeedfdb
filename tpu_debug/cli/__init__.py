"""The ``tpu-debug`` command line (the console script, and ``-m tpu_debug``): one
module per subcommand (``prepare_parser`` + ``run``).

``main(argv)`` parses, dispatches and turns a :class:`~tpu_debug.core.errors.TpuDebugError`
into one line on stderr and an exit code; it never prints a traceback of ours. Output
whose reader went away (``tpu-debug report --json | head``) ends quietly with status 0,
as a Unix tool's does.

Neither ``import tpu_debug`` nor this package imports torch (~1.0 s) or jax (~0.45 s), so
the reading verbs (``tui``, ``report``, ``runs``, ``tensorboard``, ``diff``), ``--help``
and ``--version`` start without them. ``run`` with a missing script says so before torch
is imported, and the reading verbs ignore the recording options' ``TPU_DEBUG_*`` variables
(:func:`tpu_debug.core.options.ignore_recording_options`), since they record nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tpu_debug.core.version import __version__
from tpu_debug.cli import diff, fit, import_fr, import_trace, report, run, runs, tensorboard, tui
from tpu_debug.core.errors import CommandError, TpuDebugError
from tpu_debug.core.options import ignore_recording_options
from tpu_debug.core.run_args import early_error

__all__ = ["main", "build_parser", "COMMANDS", "READING_VERBS"]

COMMANDS = {
    "run": run,
    "report": report,
    "runs": runs,
    "tui": tui,
    "tensorboard": tensorboard,
    "diff": diff,
    "import-trace": import_trace,
    "import-fr": import_fr,
    "fit": fit,
}
READING_VERBS = frozenset({"tui", "report", "runs", "tensorboard", "diff"})


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

    Example::

        main(["report", "--logdir", "tpu_debug_runs"])
        # 0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    verb = _verb(args)
    if verb == "run" and "torch" not in sys.modules:
        # a missing script is said at once, before torch and jax are imported (seconds)
        error = early_error(args[args.index("run") + 1:])
        if error is not None:
            print(f"tpu-debug run: {error}", file=sys.stderr)
            return error.exit_code
    try:
        if verb not in READING_VERBS:
            return _dispatch(args)
        # they record nothing: a bad recording variable (TPU_DEBUG_HLO=junk) must not stop them
        with ignore_recording_options():
            return _dispatch(args)
    except BrokenPipeError:
        _discard_stdout()
        return 0


def _verb(argv: Sequence[str]) -> str | None:
    # the top-level parser has options (--help, --version) but none that takes a value
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _dispatch(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    finally:
        sys.stdout.flush()  # --help and --version print, then exit: a closed pipe shows here
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(args.entry(args))
        sys.stdout.flush()  # a closed pipe shows here rather than when the interpreter exits
        return code
    except TpuDebugError as exc:
        print(f"tpu-debug {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, CommandError) else 1


def _discard_stdout() -> None:
    """Point stdout at the null device: its reader is gone, and what is still buffered
    would raise again when the interpreter flushes it on exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (stdout replaced): nothing is flushed to it
        pass
