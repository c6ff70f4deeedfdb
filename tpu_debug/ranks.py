"""The runs of a multi-process run: one run directory per rank under a parent directory.

``tpu-debug run --nproc N`` makes ``<logdir>/<UTC time>-<name>/`` holding
``ranks.json`` (the command, the number of ranks, each rank's exit status) and
one ordinary run per rank, ``<UTC time>-rank<r>/``, which each rank's own
``tpu-debug run`` writes. :class:`RankGroup` opens them together; the report and
the TUI read each rank through its own :class:`~tpu_debug.session.Session`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from tpu_debug.core.errors import RunDamagedError, RunNotFoundError, TpuDebugError
from tpu_debug.core.rank_env import RankEnv, torchrun_env
from tpu_debug.runs import DB_NAME, list_runs, new_run_dir, run_identity
from tpu_debug.session import Session
from tpu_debug.tracers.collective_journal import read_journal

__all__ = [
    "GROUP_FILE", "GroupInfo", "RankGroup", "new_group", "is_group", "find_group", "open_group", "list_groups",
    "torchrun_group", "torchrun_key",
]

GROUP_FILE = "ranks.json"
# in a logdir: one symbolic link per torchrun launch, named by the launch's key, to its group
_TORCHRUN_LINKS = ".torchrun"


@dataclasses.dataclass(frozen=True, slots=True)
class GroupInfo:
    """What ``ranks.json`` says about a multi-process run: its ``name``, ``nproc`` ranks
    started by ``command`` at ``start_time`` (ISO 8601, UTC); ``status`` ``"running"``,
    ``"finished"`` or ``"failed"``; each rank's ``exit_status`` in rank order once they
    ended, and the ``error`` that stopped the launch, if one did."""

    name: str
    nproc: int
    command: tuple[str, ...]
    start_time: str
    status: str
    exit_status: tuple[int, ...] | None = None
    error: str | None = None
    # who started the ranks: "tpu-debug" (``--nproc``, which writes the exit statuses) or
    # "torchrun" (whose ranks each record their own end: the status is read from their runs)
    launcher: str = "tpu-debug"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupInfo:
        """The record from the file's JSON object (keys it does not know are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["command"] = tuple(values.get("command") or ())
        if values.get("exit_status") is not None:
            values["exit_status"] = tuple(values["exit_status"])
        return cls(**values)


def is_group(path: Path | str) -> bool:
    """Whether ``path`` is the parent directory of a multi-process run."""
    return (Path(path) / GROUP_FILE).is_file()


class RankGroup:
    """The per-rank runs of one multi-process run.

    Example::

        group = tpu_debug.ranks.open_group("tpu_debug_runs/20260131T235959.123Z-train")
        [(rank, s.metadata().status) for rank, s in group.sessions()]
        # [(0, 'finished'), (1, 'finished')]
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._sessions: dict[int, Session] = {}

    @property
    def info(self) -> GroupInfo:
        """What ``ranks.json`` holds (read again at every call: the launcher updates it).

        Raises:
            RunDamagedError: the file cannot be read, or lacks a field.
        """
        try:
            return GroupInfo.from_json(json.loads((self.path / GROUP_FILE).read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise RunDamagedError(
                f"{self.path / GROUP_FILE} cannot be read ({exc}); the rank runs inside are intact: "
                f"open one with tpu-debug report {self.path}/<run of a rank>"
            ) from None

    @property
    def name(self) -> str:
        return self.info.name or self.path.name

    def status(self) -> str:
        """``"running"``, ``"finished"`` or ``"failed"``: what ``ranks.json`` says, or for a
        torchrun launch (which no tpu_debug process outlives), what the ranks' runs say:
        failed when one failed or was killed (its process ended without closing its run),
        finished when all ``nproc`` finished, else running."""
        info = self.info
        if info.launcher != "torchrun":
            return info.status
        states = [s.metadata().status for _, s in self.sessions()]
        if any(state in ("failed", "killed") for state in states):
            return "failed"
        if len(states) == info.nproc and all(state == "finished" for state in states):
            return "finished"
        return "running"

    def rank_dirs(self) -> dict[int, Path]:
        """Each rank's run directory (the ranks that started recording), by the rank each
        run recorded; a run that recorded none (or cannot be read) is no rank's."""
        out: dict[int, Path] = {}
        for run in list_runs(self.path):
            rank = _recorded_rank(run)
            if rank is not None:
                out.setdefault(rank, run)
        return dict(sorted(out.items()))

    def sessions(self) -> list[tuple[int, Session]]:
        """(rank, session) of every rank that recorded, in rank order (opened once, kept)."""
        for rank, run in self.rank_dirs().items():
            if rank not in self._sessions:
                self._sessions[rank] = Session(run / DB_NAME)
        return sorted(self._sessions.items())

    def write(self, **values: Any) -> None:
        """Update ``ranks.json`` (written whole, through a temporary file)."""
        if (self.path / GROUP_FILE).is_file():
            info = dataclasses.replace(self.info, **values)
        else:
            info = GroupInfo(**values)
        tmp = self.path / (GROUP_FILE + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(info), indent=1))
        os.replace(tmp, self.path / GROUP_FILE)

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RankGroup({str(self.path)!r})"


def _recorded_rank(run: Path) -> int | None:
    """The rank a run recorded; a rank killed before the store committed its identity
    (the writer commits every quarter of a second) is named by its collective journal,
    which it wrote before entering each collective."""
    try:
        with Session(run / DB_NAME) as session:
            process = session.process()
    except TpuDebugError:
        process = None
    if process is not None:
        return process.rank
    for record in read_journal(run):
        ranks, rank = record.get("ranks"), record.get("rank")
        if record.get("kind") == "call" and isinstance(ranks, list) and isinstance(rank, int) and 0 <= rank < len(ranks):
            return int(ranks[rank])
    return None


def new_group(logdir: Path, name: str, nproc: int, command: list[str], *, launcher: str = "tpu-debug") -> RankGroup:
    """Create the parent directory of a multi-process run (``ranks.json`` says "running")."""
    group = RankGroup(new_run_dir(logdir, name))
    group.write(
        name=name,
        nproc=nproc,
        command=tuple(command),
        start_time=_dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
        status="running",
        launcher=launcher,
    )
    return group


def torchrun_key(env: RankEnv | None) -> str | None:
    """What every rank of one torchrun launch on this host shares, as a short hex key;
    None when this process is no torchrun worker (``env``: :func:`torchrun_env`'s).

    torchrun gives its workers no launch id of their own: ``TORCHELASTIC_RUN_ID`` is
    ``"none"`` unless ``--rdzv-id`` or ``--standalone`` is given, and the master port is
    29500 by default, so two launches one after the other can agree on both. The
    elastic agent that started the workers (their parent process, on this host) and the
    restart count tell launches and restarts apart.
    """
    if env is None or not env.torchrun:
        return None
    parts = (
        str(env.run_id), env.master_addr or "", "" if env.master_port is None else str(env.master_port),
        str(env.restart_count or 0), socket.gethostname(), str(os.getppid()),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def torchrun_group(logdir: Path, name: str, command: list[str]) -> tuple[RankGroup, int] | None:
    """The multi-process run this torchrun worker records its run in, and its rank; None
    when this process is no torchrun worker.

    The ranks agree on one parent directory without talking: the first to arrive makes
    the directory and its ``ranks.json``, then publishes it with a symbolic link named by
    :func:`torchrun_key` (``os.symlink`` is atomic and fails when the link exists); a
    rank that loses the race removes its own directory and joins the winner's. Workers
    on other hosts have another agent, so each host of a multi-node launch makes its
    own group (holding that host's ranks).

    Raises:
        ConfigError: a rank variable holds a value it does not accept.
        TpuDebugError: the directory cannot be created.
    """
    env = torchrun_env()
    key = torchrun_key(env)
    if env is None or key is None:
        return None
    rank, world = env.rank, env.world_size
    links = Path(logdir) / _TORCHRUN_LINKS
    link = links / key
    try:
        links.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            group = new_group(Path(logdir), name, world, command, launcher="torchrun")
            try:
                # relative to the link's directory: the logdir can move with its runs
                os.symlink(os.path.join(os.pardir, group.path.name), link)
                _prune_links(links)
                return group, rank
            except FileExistsError:  # another rank published its directory first
                shutil.rmtree(group.path)
        return RankGroup(Path(logdir) / Path(os.readlink(link)).name), rank
    except OSError as exc:
        raise TpuDebugError(
            f"cannot create the torchrun run's directory under {logdir}: {exc.strerror or exc}. "
            "Choose another place with --logdir / TPU_DEBUG_LOGDIR."
        ) from None


def _prune_links(links: Path) -> None:
    """Remove the links of launches whose directory was deleted (a link is published only
    once its directory is complete, so a dangling one is no launch's any more)."""
    for link in links.iterdir():
        if link.is_symlink() and not link.exists():
            try:
                link.unlink()
            except FileNotFoundError:  # another launch pruned it first
                pass


def open_group(path: Path | str) -> RankGroup:
    """The multi-process run in directory ``path``.

    Raises:
        RunNotFoundError: ``path`` holds no multi-process run.
    """
    if not is_group(path):
        raise RunNotFoundError(f"{path}: not a multi-process run (no {GROUP_FILE} inside)")
    return RankGroup(Path(path))


def find_group(run: str | os.PathLike | None, logdir: Path | str) -> RankGroup | None:
    """The multi-process run a RUN argument means, or None when it means a single run.

    RUN is a multi-process run's directory or its name in ``logdir``; None means the
    latest recording in ``logdir`` when that is a multi-process run.
    """
    root = Path(logdir)
    if run is not None:
        path = Path(run)
        if is_group(path):
            return RankGroup(path)
        text = str(run)
        if os.sep in text or "/" in text:
            return None
        exact = root / text
        if is_group(exact):
            return RankGroup(exact)
        named = [g for g in list_groups(root) if getattr(_group_info(g), "name", None) == text]
        return RankGroup(named[-1]) if named else None
    groups = list_groups(root)
    if not groups:
        return None
    runs = list_runs(root)
    latest_group = groups[-1]
    if runs and run_identity(runs[-1]).start_time > _group_start(latest_group):
        return None
    return RankGroup(latest_group)


def _group_info(path: Path) -> GroupInfo | None:
    """What ``ranks.json`` says (None when it cannot be read)."""
    try:
        return RankGroup(path).info
    except RunDamagedError:
        return None


def _group_start(path: Path) -> str:
    """When a multi-process run started ("" when its ``ranks.json`` cannot be read)."""
    info = _group_info(path)
    return info.start_time if info is not None else ""


def list_groups(logdir: Path | str) -> list[Path]:
    """The multi-process runs in ``logdir`` (directories holding ``ranks.json``, whatever
    they are called), oldest first."""
    root = Path(logdir)
    if not root.is_dir():
        return []
    started = {p: _group_start(p) for p in root.iterdir() if p.is_dir() and is_group(p)}
    return sorted(started, key=lambda p: (started[p], p.name))
