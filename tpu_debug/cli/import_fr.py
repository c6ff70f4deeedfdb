"""Read a folder of PyTorch Flight Recorder dumps (one per rank) into a multi-process run."""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_debug.core.errors import CommandError
from tpu_debug.core.options import default_logdir


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump_dir", metavar="DIR",
                        help="the folder holding the dumps (TORCH_FR_DUMP_TEMP_FILE's folder: <prefix><rank> files)")
    parser.add_argument("--prefix", help="the dumps' file name before the rank (default: the prefix they share)")
    parser.add_argument("--logdir", help="where runs go (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument("--name", help="run name (default: flight_recorder)")


def run(args: argparse.Namespace) -> int:
    from tpu_debug.importfr import import_dumps  # deferred: entry: it writes runs

    logdir = Path(args.logdir) if args.logdir else default_logdir()
    if not Path(args.dump_dir).is_dir():
        raise CommandError(f"{args.dump_dir}: no such folder (give the folder TORCH_FR_DUMP_TEMP_FILE's dumps are in)")
    group = import_dumps(Path(args.dump_dir), logdir, args.name, args.prefix)
    print(group.path)
    return 0
