"""A run's identity (name, start time, rank, group) comes from what it recorded, not from
its directory's name: a renamed or copied run directory lists, resolves and groups the same."""

from __future__ import annotations

import json
import shutil

import pytest
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.core.errors import RunDamagedError, RunNotFoundError

from tpu_debug.ranks import GroupInfo, RankGroup, find_group, list_groups, new_group, open_group
from tpu_debug.runs import RunIdentity, list_runs, resolve_run, run_identity


def _run(run_dir, name: str, start: str, rank: int | None = None) -> None:
    run_dir.mkdir(parents=True)
    writer = RunWriter(run_dir / DB_NAME, {"name": name, "start_time": start})
    if rank is not None:
        writer.put(ev.ProcessEvent(writer.new_id(), 0.0, None, 1, None, rank=rank, world_size=2, devices=2,
                                   local_devices=1, coordinator="localhost:1"))
    writer.close({"status": "finished"})


def test_runs_list_in_the_order_they_started_whatever_their_directories_are_called(tmp_path):
    # directory names that sort the other way round from the start times
    _run(tmp_path / "zz-first", "train", "2026-01-31T10:00:00.000+00:00")
    _run(tmp_path / "aa-second", "eval", "2026-01-31T11:00:00.000+00:00")
    _run(tmp_path / "20260131T090000.000Z-third", "train", "2026-01-31T12:00:00.000+00:00")
    (tmp_path / "not-a-run").mkdir()
    assert [p.name for p in list_runs(tmp_path)] == ["zz-first", "aa-second", "20260131T090000.000Z-third"]
    assert resolve_run(None, tmp_path) == tmp_path / "20260131T090000.000Z-third" / DB_NAME
    assert run_identity(tmp_path / "aa-second") == RunIdentity("eval", "2026-01-31T11:00:00.000+00:00")


def test_a_renamed_run_resolves_by_the_name_it_recorded(tmp_path):
    _run(tmp_path / "20260131T100000.000Z-train", "train", "2026-01-31T10:00:00.000+00:00")
    _run(tmp_path / "20260131T110000.000Z-train", "train", "2026-01-31T11:00:00.000+00:00")
    (tmp_path / "20260131T110000.000Z-train").rename(tmp_path / "my-best-run")
    assert resolve_run("train", tmp_path) == tmp_path / "my-best-run" / DB_NAME  # the latest named train
    assert resolve_run("my-best-run", tmp_path) == tmp_path / "my-best-run" / DB_NAME  # its directory
    with pytest.raises(RunNotFoundError, match=r"^eval: no such run \(not a path, nor a run name in "):
        resolve_run("eval", tmp_path)


def test_a_copied_run_lists_beside_its_original(tmp_path):
    _run(tmp_path / "20260131T100000.000Z-train", "train", "2026-01-31T10:00:00.000+00:00")
    _run(tmp_path / "20260131T110000.000Z-eval", "eval", "2026-01-31T11:00:00.000+00:00")
    shutil.copytree(tmp_path / "20260131T100000.000Z-train", tmp_path / "backup")
    # same start time: the directory name breaks the tie
    assert [p.name for p in list_runs(tmp_path)] == [
        "20260131T100000.000Z-train", "backup", "20260131T110000.000Z-eval"
    ]
    assert run_identity(tmp_path / "backup").name == "train"


def test_an_unreadable_run_sorts_by_its_directorys_time(tmp_path):
    _run(tmp_path / "a", "train", "2026-01-31T10:00:00.000+00:00")
    _run(tmp_path / "b", "train", "2026-01-31T12:00:00.000+00:00")
    damaged = tmp_path / "20260131T110000.000Z-crashed"
    damaged.mkdir()
    (damaged / DB_NAME).write_bytes(b"not a database")
    assert [p.name for p in list_runs(tmp_path)] == ["a", "20260131T110000.000Z-crashed", "b"]
    assert run_identity(damaged) == RunIdentity("", "2026-01-31T11:00:00.000+00:00")


def _group(path, name: str, start: str) -> None:
    path.mkdir(parents=True)
    (path / "ranks.json").write_text(json.dumps({"name": name, "nproc": 2, "start_time": start,
                                                 "status": "finished"}))


def test_a_renamed_group_with_renamed_rank_runs_keeps_its_ranks(tmp_path):
    group = tmp_path / "20260131T120000.000Z-train"
    _group(group, "train", "2026-01-31T12:00:00.000+00:00")
    _run(group / "20260131T120000.001Z-rank0", "rank0", "2026-01-31T12:00:00.001+00:00", rank=0)
    _run(group / "20260131T120000.002Z-rank1", "rank1", "2026-01-31T12:00:00.002+00:00", rank=1)
    (group / "20260131T120000.001Z-rank0").rename(group / "second")
    (group / "20260131T120000.002Z-rank1").rename(group / "first")
    group = group.rename(tmp_path / "experiment")
    _run(tmp_path / "older-single-run", "solo", "2026-01-31T11:00:00.000+00:00")

    assert list_groups(tmp_path) == [group]
    assert {r: p.name for r, p in open_group(group).rank_dirs().items()} == {0: "second", 1: "first"}
    assert find_group(None, tmp_path).path == group  # the latest recording is the group
    assert find_group("train", tmp_path).path == group  # the name it recorded
    with open_group(group) as g:
        assert [(rank, s.metadata().name) for rank, s in g.sessions()] == [(0, "rank0"), (1, "rank1")]


def test_a_run_after_the_group_is_the_latest(tmp_path):
    _group(tmp_path / "g", "train", "2026-01-31T12:00:00.000+00:00")
    _run(tmp_path / "later", "solo", "2026-01-31T13:00:00.000+00:00")
    assert find_group(None, tmp_path) is None


def test_a_run_in_a_group_without_a_recorded_rank_is_no_rank(tmp_path):
    group = tmp_path / "g"
    _group(group, "train", "2026-01-31T12:00:00.000+00:00")
    _run(group / "20260131T120000.001Z-rank0", "rank0", "2026-01-31T12:00:00.001+00:00")
    _run(group / "r1", "rank1", "2026-01-31T12:00:00.002+00:00", rank=1)
    assert list(open_group(group).rank_dirs()) == [1]


def test_the_group_file_reads_back_as_its_record(tmp_path):
    group = new_group(tmp_path, "train", 2, ["tpu-debug", "run", "--nproc", "2", "train.py"])
    group.write(status="failed", exit_status=[0, 1])
    info = group.info
    assert isinstance(info, GroupInfo)
    assert (info.name, info.nproc, info.command, info.status, info.exit_status, info.error) == (
        "train", 2, ("tpu-debug", "run", "--nproc", "2", "train.py"), "failed", (0, 1), None
    )
    on_disk = json.loads((group.path / "ranks.json").read_text())
    assert (on_disk["status"], on_disk["exit_status"], on_disk["nproc"]) == ("failed", [0, 1], 2)


def test_a_group_file_without_its_fields_is_damaged(tmp_path):
    (tmp_path / "ranks.json").write_text(json.dumps({"name": "train"}))
    with pytest.raises(RunDamagedError, match=r"ranks\.json cannot be read \(.*'nproc'.*\); the rank runs inside"):
        _ = RankGroup(tmp_path).info
