"""The ``tpu-debug run`` command line: its arguments, and the script or module it names.

Here, not in ``tpu_debug/cli/run.py``, because the ``tpu-debug`` script reads them before
it imports anything heavy: ``tpu-debug run nosuch.py`` says the file is missing at once,
without importing torch and jax first (see :func:`tpu_debug.cli.main`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from tpu_debug.core.errors import CommandError
from tpu_debug.core.options import add_flags

__all__ = ["early_error", "prepare_parser", "script_of"]


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.usage = "tpu-debug run [options] (script.py | -m module) [args ...]"
    # one flag per trace option (core/options.py), None when not given
    add_flags(parser, "trace")
    add_flags(parser, "run")  # how the command itself behaves
    parser.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="do not print the report when the script ends",
    )
    parser.add_argument(
        "--tui",
        action="store_true",
        help="open the terminal UI on the run when the script ends (instead of printing the report)",
    )
    # -- devices and processes --
    parser.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="simulate N CPU devices (per process), for device meshes on a machine without accelerators "
        "(XLA's --xla_force_host_platform_device_count)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="run the script as N processes (ranks) of one multi-process run on this machine "
        "(jax.distributed); each rank records its own run, under one parent directory",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("script", nargs="?", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def script_of(args: argparse.Namespace) -> tuple[str, list[str], str, str, str]:
    """What ``tpu-debug run`` runs: ``(target, script arguments, argv[0], sys.path[0], run name)``.

    Raises:
        CommandError: no script given, or the script does not exist (exit status 2, as
            ``python nosuch.py`` gives).
    """
    if args.module:
        script_args = ([args.script] if args.script else []) + list(args.args)
        return args.module, script_args, args.module, os.getcwd(), args.name or args.module.rsplit(".", 1)[-1]
    if not args.script:
        raise CommandError("no script given: tpu-debug run [options] script.py [args ...]", exit_code=2)
    path = Path(args.script)
    if not path.exists():
        raise CommandError(
            f"can't open file {str(path.absolute())!r}: no such file. "
            "Pass the path of a Python script: tpu-debug run script.py [args ...]",
            exit_code=2,
        )
    return args.script, list(args.args), args.script, os.path.dirname(os.path.realpath(path)), args.name or path.stem


def early_error(argv: Sequence[str]) -> CommandError | None:
    """The error ``tpu-debug run`` would stop with before running anything (a missing
    script), found without importing torch or jax; None when the arguments look runnable
    (anything argparse itself refuses is left to the full command line, which says it, and
    so is ``-h`` before the script: the full command line prints the help)."""
    parser = argparse.ArgumentParser(prog="tpu-debug run", add_help=False, exit_on_error=False)
    prepare_parser(parser)
    try:
        args, unknown = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit):
        return None
    if {"-h", "--help"} & set(unknown):
        return None
    try:
        script_of(args)
    except CommandError as exc:
        return exc
    return None
