"""Where runs live: creating a run directory, listing runs, resolving a RUN argument."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import sqlite3
from pathlib import Path

from tpu_debug.core.errors import RunNotFoundError, TpuDebugError
from tpu_debug.tracers.store import DB_NAME, connect

__all__ = ["new_run_dir", "list_runs", "resolve_run", "run_stamp", "run_identity", "RunIdentity", "DB_NAME"]

_STAMP = re.compile(r"^\d{8}T\d{6}\.\d{3}Z-")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_stamp(now: _dt.datetime | None = None) -> str:
    """The UTC time prefix of a run directory: ``20260131T235959.123Z``."""
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"


def _safe_name(name: str) -> str:
    cleaned = _UNSAFE.sub("_", name).strip("._-")
    return cleaned[:80] or "run"


def new_run_dir(logdir: Path, name: str) -> Path:
    """Create and return ``<logdir>/<UTC time>-<name>/`` (a numeric suffix avoids clashes).

    Raises:
        TpuDebugError: the directory cannot be created.
    """
    stamp = run_stamp()
    base = f"{stamp}-{_safe_name(name)}"
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            path = logdir / (base if i == 1 else f"{base}-{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise TpuDebugError(
            f"cannot create a run directory under {logdir}: {exc.strerror or exc}. "
            "Choose another place with logdir= / --logdir / TPU_DEBUG_LOGDIR."
        ) from None
    raise TpuDebugError(f"{logdir}: too many runs named {base!r}; pass another name")


def list_runs(logdir: Path | str) -> list[Path]:
    """Run directories in ``logdir``, oldest first (``[]`` when there is none).

    A run is any directory holding a ``run.db``, whatever it is called; the order is
    the start time each run recorded (a run that cannot be read sorts by its
    directory's time prefix, when it has one, else first).
    """
    root = Path(logdir)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and (p / DB_NAME).is_file()]
    started = {p: run_identity(p).start_time for p in runs}
    return sorted(started, key=lambda p: (started[p], p.name))


@dataclasses.dataclass(frozen=True, slots=True)
class RunIdentity:
    """What a run recorded about itself: its ``name`` and ``start_time`` (ISO 8601, UTC);
    empty when the run cannot be read (damaged, another schema)."""

    name: str
    start_time: str


def run_identity(run_dir: Path) -> RunIdentity:
    """The name and start time recorded in the run in ``run_dir`` (never raises)."""
    try:
        conn = connect(Path(run_dir) / DB_NAME)
    except TpuDebugError:
        return RunIdentity("", _stamp_time(Path(run_dir).name))
    try:
        rows = conn.execute("SELECT key, value FROM meta WHERE key IN ('name', 'start_time')").fetchall()
        values = {k: json.loads(v) for k, v in rows}
        return RunIdentity(str(values.get("name") or ""), str(values.get("start_time") or ""))
    except (sqlite3.DatabaseError, ValueError):
        return RunIdentity("", _stamp_time(Path(run_dir).name))
    finally:
        conn.close()


def _stamp_time(name: str) -> str:
    """The start time in a directory name ``new_run_dir`` made, in the form runs record it."""
    if not _STAMP.match(name):
        return ""
    stamp = _dt.datetime.strptime(name[:19], "%Y%m%dT%H%M%S.%f").replace(tzinfo=_dt.UTC)
    return stamp.isoformat(timespec="milliseconds")


def _names(recorded: str, text: str) -> bool:
    """Whether a RUN argument names a run recorded as ``recorded`` (as given, or as its
    directory spells it)."""
    return bool(recorded) and (recorded == text or _safe_name(recorded) == _safe_name(text))


def resolve_run(run: str | os.PathLike | None, logdir: Path | str) -> Path:
    """The run.db a RUN argument means.

    RUN is a run directory, a run.db file, the name of a directory in
    ``logdir``, or a run name (the latest run with that name). ``None`` means
    the latest run in ``logdir``.

    Raises:
        RunNotFoundError: nothing matches, with the place looked at and what to do.
    """
    logdir = Path(logdir)
    if run is None:
        runs = list_runs(logdir)
        if not runs:
            raise RunNotFoundError(
                f"no runs in {logdir}: record one with 'tpu-debug run script.py', or point "
                "--logdir / TPU_DEBUG_LOGDIR at the directory holding your runs."
            )
        return runs[-1] / DB_NAME
    path = Path(run)
    if path.is_dir():
        if (path / DB_NAME).is_file():
            return path / DB_NAME
        raise RunNotFoundError(
            f"{path}: not a run directory (no {DB_NAME} inside). List recorded runs with 'tpu-debug runs'."
        )
    if path.is_file():
        return path
    text = str(run)
    if os.sep not in text and "/" not in text:
        exact = logdir / text
        if (exact / DB_NAME).is_file():
            return exact / DB_NAME
        named = [p for p in list_runs(logdir) if _names(run_identity(p).name, text)]
        if named:
            return named[-1] / DB_NAME
    raise RunNotFoundError(
        f"{run}: no such run (not a path, nor a run name in {logdir}). "
        "List recorded runs with 'tpu-debug runs'."
    )
