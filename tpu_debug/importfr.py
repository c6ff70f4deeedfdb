"""Read a folder of PyTorch Flight Recorder dumps (one per rank) into a multi-process run.

The dumps of any PyTorch job (NCCL's, gloo's process groups, or the `tpu` process
group's) become one run per rank under one parent directory, the layout ``tpu-debug run
--nproc`` and torchrun workers under ``tpu-debug run`` make: ``tpu-debug report``,
``tui``, ``tensorboard`` show the ranks' collectives side by side, where they first
differ with each rank's line, each rank's arrival at each collective and the rank that
comes last most often. ``tracers/recording/flight_recorder_import.py`` reads the dumps.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from tpu_debug.ranks import RankGroup, new_group
from tpu_debug.runs import new_run_dir
from tpu_debug.tracers.events import ProcessEvent
from tpu_debug.tracers.recording.flight_recorder_import import (
    Dump,
    DumpError,
    dump_events,
    find_dumps,
    read_dump,
)
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter

__all__ = ["import_dumps"]

#: what a run made from a dump records as its host: the dumps' times are wall clocks, so
#: the ranks' entries share one clock wherever they ran
_HOST = "flight-recorder"


def _members(dumps: list[Dump]) -> dict[str, tuple[int, ...]]:
    """Each group's global ranks, from the dumps' ``pg_config``; for a group a dump does not
    describe (gloo's dumps describe none): every rank for the default group ``"0"``, else the
    ranks with entries of it."""
    members: dict[str, tuple[int, ...]] = {}
    for d in dumps:
        for name, (_, ranks) in d.groups.items():
            members.setdefault(name, ranks)
    seen: dict[str, set[int]] = {}
    for d in dumps:
        for e in d.entries:
            seen.setdefault(str((e.get("process_group") or ("?",))[0]), set()).add(d.rank)
    everyone = tuple(sorted(d.rank for d in dumps))
    for name, ranks in seen.items():
        members.setdefault(name, everyone if name == "0" else tuple(sorted(ranks)))
    return members


def import_dumps(folder: Path, logdir: Path, name: str | None = None, prefix: str | None = None) -> RankGroup:
    """Write one run per rank's dump in ``folder`` under a new multi-process run in ``logdir``.

    Raises:
        DumpError: ``folder`` holds no dump, or a file that is none.
    """
    found = find_dumps(Path(folder), prefix)
    if not found:
        raise DumpError(f"{folder} holds no Flight Recorder dump (files named <prefix><rank>, as "
                        "TORCH_FR_DUMP_TEMP_FILE names them)")
    dumps = [read_dump(path, rank) for path, rank in found]
    members = _members(dumps)
    times = [int(e["time_created_ns"]) for d in dumps for e in d.entries if e.get("time_created_ns")]
    t0 = min(times) if times else 0
    start = _dt.datetime.fromtimestamp(t0 / 1e9, _dt.UTC).isoformat(timespec="milliseconds")
    run_name = name or "flight_recorder"
    nproc = max(len(r) for r in members.values()) if members else len(dumps)
    group = new_group(Path(logdir), run_name, nproc, ["flight-recorder", str(folder)], launcher="flight-recorder")
    for d in dumps:
        meta = {"name": f"{run_name}-rank{d.rank}", "status": "running", "imported_from": str(d.path),
                "argv": [], "command": [], "start_time": start, "hostname": _HOST, "clock_origin": t0 / 1e9,
                "rank": d.rank}
        writer = RunWriter(new_run_dir(group.path, f"rank{d.rank}") / DB_NAME, meta)
        writer.put(ProcessEvent(writer.new_id(), 0.0, None, 0, None, rank=d.rank, world_size=nproc, devices=nproc,
                                local_devices=1))
        calls, dones = dump_events(d, members, t0, writer.new_id)
        for event in sorted([*calls, *dones], key=lambda ev: ev.ts):
            writer.put(event)
        writer.close({"status": "finished", "exit_status": 0})
    group.write(status="finished")
    return group
