"""Start TensorBoard on a run's profile and scalars (localhost only)."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import tpu_debug
from tpu_debug.cli.report import _logdir
from tpu_debug.core.children import ends_with_parent
from tpu_debug.core.errors import CommandError
from tpu_debug.ranks import find_group
from tpu_debug.report.ranks import collective_spans
from tpu_debug.tracers.xplane import TENSORBOARD_DIR, profile_files, write_rank_spans

HOST = "127.0.0.1"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", nargs="?", metavar="RUN", help="run directory or name (default: the latest run)"
    )
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")
    parser.add_argument(
        "--port", type=int, help="port to serve on (default: TensorBoard's, 6006 or the next free one)"
    )
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the TensorBoard command instead of running it",
    )


def tensorboard_command(logdir: Path, *, port: int | None = None) -> list[str]:
    """The command that serves ``logdir`` with TensorBoard on localhost."""
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir.resolve()), "--host", HOST]
    if port is not None:
        command += ["--port", str(port)]
    return command


def group_profile(group) -> Path:
    """Write the ranks' c10d collectives side by side as a profile in the group's directory
    (one process row per rank); returns the TensorBoard logdir holding it."""
    logdir = group.path / TENSORBOARD_DIR
    write_rank_spans(logdir / "plugins" / "profile" / "ranks" / "c10d.xplane.pb",
                     collective_spans(group.sessions()))
    return logdir


def run(args: argparse.Namespace) -> int:
    group = find_group(args.run, _logdir(args.logdir))
    if group is not None:  # a multi-process run: its ranks' collectives, one row per rank
        with group:
            logdir = group_profile(group)
        print(f"tpu-debug tensorboard: {group.path.name}: each rank's c10d collectives, one row per rank",
              file=sys.stderr)
        return _serve(args, logdir)
    with tpu_debug.open_run(args.run, logdir=args.logdir) as session:
        run_dir = session.run_dir
    logdir = run_dir / TENSORBOARD_DIR
    if not logdir.is_dir():
        raise CommandError(
            f"{run_dir.name} has no TensorBoard data: it was recorded without it. Record the run with "
            "'tpu-debug run --tensorboard script.py', trace(tensorboard=True) or TPU_DEBUG_TENSORBOARD=1."
        )
    return _serve(args, logdir)


def _serve(args: argparse.Namespace, logdir: Path) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise CommandError(f"--port {args.port}: not a TCP port; pass a number from 1 to 65535", exit_code=2)
    command = tensorboard_command(logdir, port=args.port)
    if args.print_only:
        print(shlex.join(command))
        return 0
    if importlib.util.find_spec("tensorboard") is None:
        raise CommandError(
            "TensorBoard is not installed in this Python: pip install tensorboard tensorboard-plugin-profile"
        )
    if (
        importlib.util.find_spec("xprof") is None
        and importlib.util.find_spec("tensorboard_plugin_profile") is None
    ):
        print(
            "tpu-debug tensorboard: the profile plugin is not installed, so only the scalars will show; "
            "pip install tensorboard-plugin-profile",
            file=sys.stderr,
        )
    if not profile_files(logdir):
        print(f"tpu-debug tensorboard: {logdir} holds no profile (only scalars)", file=sys.stderr)
    print(
        f"tpu-debug tensorboard: serving {logdir} on {HOST}; the timeline is in the PROFILE tab, tool Trace Viewer",
        file=sys.stderr,
    )
    # ended with this process however it ends (SIGTERM, SIGHUP, SIGKILL), not left serving the port
    process = subprocess.Popen(command, preexec_fn=ends_with_parent())  # noqa: PLW1509 - prctl only
    try:
        return process.wait()
    except KeyboardInterrupt:
        # a Ctrl-C at the terminal reached TensorBoard too; a SIGINT sent to us alone did not
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait()
        return 0
