"""List the recorded runs, oldest first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

import tpu_debug
from tpu_debug.core.errors import RunDamagedError, SchemaVersionError, TpuDebugError
from tpu_debug.core.format import format_seconds
from tpu_debug.core.options import default_logdir
from tpu_debug.ranks import RankGroup, list_groups
from tpu_debug.report.core import make_console

_UNBOUNDED = 1_000_000  # the width of plain text: lines as long as what they hold


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--logdir", help="where runs are (default: $TPU_DEBUG_LOGDIR or ./tpu_debug_runs)")


def run(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir) if args.logdir else default_logdir()

    paths = tpu_debug.list_runs(logdir)
    groups = list_groups(logdir)
    if not paths and not groups:
        print(f"no runs in {logdir}: record one with 'tpu-debug run script.py'", file=sys.stderr)
        return 0
    for path in groups:  # a multi-process run: one run per rank inside
        with RankGroup(path) as group:
            info, status = group.info, group.status()
        print(f"{path.name}  {status}  {info.nproc} ranks "
              f"(tpu-debug report {path.name})")
    if not paths:
        return 0
    terminal = sys.stdout.isatty()
    # a file or a pipe gets one whole line per run, however long its command (grep finds it whole)
    console = make_console(sys.stdout, terminal, None if terminal else _UNBOUNDED)
    table = Table(box=None, pad_edge=False, header_style="bold" if terminal else "")
    for title in ("run", "status", "duration", "platform", "op calls", "events", "command"):
        table.add_column(title, no_wrap=True)
    for path in paths:
        try:
            with tpu_debug.open_run(path) as session:
                m = session.metadata()
                calls = sum(o.count for o in session.ops())
                events = sum(session.counts().values())
            table.add_row(
                Text(path.name),
                Text(m.status),
                format_seconds(m.duration),
                Text(f"{m.platform} x{m.device_count}"),
                str(calls),
                str(events),
                Text(" ".join(m.argv)),
            )
        except TpuDebugError as exc:
            # the full one-line reason is what 'tpu-debug report <run>' prints
            if isinstance(exc, RunDamagedError):
                kind = "damaged"
            elif isinstance(exc, SchemaVersionError):
                kind = "other schema"
            else:
                kind = "unreadable"
            table.add_row(
                Text(path.name),
                Text("unreadable"),
                "-",
                "-",
                "-",
                "-",
                Text(f"({kind}: see tpu-debug report {path.name})"),
            )
    console.print(table)
    return 0
