"""``torchrun ... tpu-debug run``: every rank records its run under one parent directory,
and the group's report shows the ranks' c10d collectives side by side.

The script (``data/ranks_script.py``) runs on two ranks under torchrun, each rank a
``python -m tpu_debug run`` of it, as ``torchrun --nproc-per-node 2 -m tpu_debug run``
starts them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import warm_python
from dist_helpers import DATA, REPO, python_env

from tpu_debug.core.rank_env import torchrun_env
from tpu_debug.ranks import list_groups, open_group, torchrun_key

SCRIPT = DATA / "ranks_script.py"
TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0"}


def _line(text: str) -> int:
    (line,) = [i for i, src in enumerate(SCRIPT.read_text().splitlines(), 1) if src.startswith(text)]
    return line


def _torchrun(logdir: Path, mode: str) -> subprocess.CompletedProcess:
    # torchrun's agent forked from a warm interpreter (its workers are its own fresh processes)
    return warm_python.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "tpu_debug", "run",
         "--logdir", str(logdir), str(SCRIPT), mode],
        env=python_env(), cwd=logdir.parent, timeout=300,
    )


def _undocumented(data: dict) -> set[str]:
    """The keys docs/report_schema.md does not name (the check tests/cli/test_report_json.py makes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_json_checks", REPO / "tests" / "cli" / "test_report_json.py")
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    return checks._undocumented(data, checks._documented())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return warm_python.run([sys.executable, "-m", "tpu_debug", *args], env=python_env(), cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def same(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("torchrun_same") / "runs"
    proc = _torchrun(logdir, "same")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return logdir


def test_torchrun_ranks_record_one_group(same):
    (path,) = list_groups(same)
    info = json.loads((path / "ranks.json").read_text())
    assert (info["nproc"], info["launcher"], info["status"]) == (2, "torchrun", "running")
    with open_group(path) as group:
        assert list(group.rank_dirs()) == [0, 1]
        assert [s.metadata().name for _, s in group.sessions()] == ["rank0", "rank1"]
        # no launcher outlives torchrun's workers: the group's status is read from the ranks' runs
        assert group.status() == "finished"
    listing = _cli("runs", "--logdir", str(same))
    assert f"{path.name}  finished  2 ranks" in listing.stdout


def test_report_json_shows_each_ranks_collectives(same):
    proc = _cli("report", "--json", "--logdir", str(same))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["schema"], data["nproc"], data["status"], data["missing"]) == ("tpu_debug.ranks/1", 2, "finished", [])
    c10d = data["c10d"]
    assert c10d["desyncs"] == []
    for rank in c10d["per_rank"]:
        (g,) = rank["groups"]
        assert (g["group"], g["ranks"], g["count"]) == ("0", [0, 1], 4)
        # 4x2 float32 all-reduced (32 B), gathered into 8x2 (64 + 32 B), 4 float32 (16 B)
        assert g["bytes"] == 32 + 96 + 16
        assert [(o["op"], o["count"], o["bytes"]) for o in g["ops"]] == [
            ("allreduce", 2, 48), ("all_gather_single", 1, 96), ("barrier", 1, 0)]
        assert g["waited"] >= 0
        # every collective returned: its time is the sum of the four calls' own (no rounding
        # but float addition's, so the sums agree to a few ulps)
        assert g["not_returned"] == 0
        assert g["seconds"] == pytest.approx(sum(o["seconds"] for o in g["ops"]), rel=1e-12)
    walls = {r["rank"]: r["figures"]["duration"] for r in data["ranks"]}
    (seq,) = c10d["sequence"]
    assert (seq["total"], seq["first_difference"]) == (4, None)
    assert not _undocumented(data)
    lines = [_line("dist.all_reduce(x)"), _line("dist.all_gather_into_tensor"), _line("dist.all_reduce(y)"),
             _line("dist.barrier()")]
    for row, line in zip(seq["rows"], lines, strict=True):
        assert [c["rank"] for c in row["calls"]] == [0, 1]
        assert {c["call"]["location"]["line"] for c in row["calls"]} == {line}
        for c in row["calls"]:
            # a call is timed inside the rank's run (perf_counter from entry to return), so
            # it is positive and no longer than the run's wall time
            assert 0 < c["call"]["seconds"] <= walls[c["rank"]]
    per_rank = {r["rank"]: r["groups"][0] for r in c10d["per_rank"]}
    for rank, row_calls in ((r, [c["call"] for row in seq["rows"] for c in row["calls"] if c["rank"] == r])
                            for r in (0, 1)):
        assert per_rank[rank]["seconds"] == pytest.approx(sum(c["seconds"] for c in row_calls), rel=1e-12)


def test_text_report_lists_collectives_in_order(same):
    proc = _cli("report", "--logdir", str(same), "--width", "200")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "c10d collectives by rank" in out and "c10d collectives in order, group 0" in out
    # each call with its own time (format_seconds: a number and a unit)
    # with the reduction, and when the rank entered after the first one, by how much
    assert re.search(rf"allreduce\(\[4, 2\]; float32, SUM\) [\d.]+ [mµn]?s (\(entered \+[\d.]+ [mµn]?s\) )?"
                     rf"at ranks_script.py:{_line('dist.all_reduce(x)')}", out), out
    assert "in them" in out and "never returned" not in out
    assert "allreduce 2 (48 B), all_gather_single 1 (96 B), barrier 1" in out
    assert "collective desync" not in out


def test_tensorboard_shows_each_rank_as_a_process_row(same):
    from tpu_debug.tracers.xplane import profile_files
    from xprof.convert import raw_to_tool_data

    proc = _cli("tensorboard", "--print", "--logdir", str(same))
    assert proc.returncode == 0, proc.stderr
    (path,) = list_groups(same)
    assert proc.stdout.split("--logdir ")[1].split()[0] == str((path / "tensorboard").resolve())
    (profile,) = profile_files(path / "tensorboard")
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(profile)], "trace_viewer", {})
    events = json.loads(data)["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(rows.values()) == ["/device:CUSTOM:rank 0", "/device:CUSTOM:rank 1"]
    for pid, name in rows.items():
        spans = sorted((e for e in events if e.get("ph") == "X" and e["pid"] == pid), key=lambda e: e["ts"])
        assert [(e["name"], e["args"]["seq"]) for e in spans] == [
            ("allreduce", "1"), ("all_gather_single", "2"), ("allreduce", "3"), ("barrier", "4")], name
        assert spans[0]["args"]["line"].startswith(f"{SCRIPT}:{_line('dist.all_reduce(x)')}")
        assert all(e["dur"] > 0 for e in spans)
        assert {e["args"]["returned"] for e in spans} == {"yes"}


def test_a_killed_rank_is_still_reported(tmp_path):
    logdir = tmp_path / "runs"
    proc = _torchrun(logdir, "kill")
    assert proc.returncode != 0
    assert "SIGKILL" in proc.stderr
    data = json.loads(_cli("report", "--json", "--logdir", str(logdir)).stdout)
    assert data["status"] == "failed"
    # rank 0 raises CollectiveDesyncError naming the dead rank at its third collective;
    # torchrun's agent, which saw rank 1 die, may stop rank 0 while its run closes
    status0, status1 = [r["figures"]["status"] for r in data["ranks"]]
    assert status0 in ("failed", "terminated") and status1 == "killed"
    c10d = data["c10d"]
    assert [r["calls"] for r in c10d["per_rank"]] == [3, 2]
    (desync,) = c10d["desyncs"]
    assert (desync["group"], desync["seq"], desync["reason"]) == ("0", 3, "missing")
    (rank0, rank1) = desync["calls"]
    assert rank0["call"]["op"] == "allreduce" and rank0["call"]["location"]["line"] == _line("dist.all_reduce(y)")
    assert rank1 == {"rank": 1, "call": None}
    # rank 0 raised in its third collective: it entered it and never returned
    assert rank0["call"]["seconds"] is None
    assert c10d["per_rank"][0]["groups"][0]["not_returned"] == 1
    assert desync["text"].startswith("group 0, collective #3: the ranks differ (missing)")
    # the words of the live check: rank 1 died, with the collective it last called
    assert "\n  rank 1: died (" in desync["text"] and "Cause: a rank died." in desync["text"]
    assert desync["cause"] == "died"
    text = _cli("report", "--logdir", str(logdir), "--width", "200").stdout
    assert "collective desync: group 0, collective #3" in text and "  rank 1: died (" in text


def test_torchrun_key_tells_launches_apart(monkeypatch):
    def key_of(**env: str) -> str | None:
        return torchrun_key(torchrun_env(env))

    assert key_of() is None
    assert key_of(RANK="0", WORLD_SIZE="2") is None  # another launcher's ranks: torchrun's id is unset
    key = key_of(**TORCHRUN_ENV)
    assert key == key_of(**dict(TORCHRUN_ENV, RANK="1"))  # every rank of the launch agrees
    assert key != key_of(**dict(TORCHRUN_ENV, TORCHELASTIC_RESTART_COUNT="1"))
    assert key != key_of(**dict(TORCHRUN_ENV, MASTER_PORT="29501"))


def test_ranks_arriving_together_share_one_directory(tmp_path):
    # four processes started at once, children of this one, as torchrun's workers are the agent's
    procs = [
        subprocess.Popen([sys.executable, str(DATA / "join_group.py"), str(tmp_path)],
                         env=python_env(**dict(TORCHRUN_ENV, RANK=str(r), WORLD_SIZE="4")), stdout=subprocess.PIPE,
                         text=True)
        for r in range(4)
    ]
    got = sorted(tuple(p.communicate(timeout=120)[0].split()) for p in procs)
    assert [r for r, _ in got] == ["0", "1", "2", "3"]
    assert len({path for _, path in got}) == 1
    assert list_groups(tmp_path) == [Path(got[0][1])]
    assert json.loads((Path(got[0][1]) / "ranks.json").read_text())["nproc"] == 4
    # the launch's link is kept while its directory is; one whose directory was deleted goes
    (link,) = (tmp_path / ".torchrun").iterdir()
    os.symlink("../20260101T000000.000Z-gone", tmp_path / ".torchrun" / "0123456789abcdef")
    proc = subprocess.run([sys.executable, str(DATA / "join_group.py"), str(tmp_path)],
                          env=python_env(**dict(TORCHRUN_ENV, MASTER_PORT="29501")), capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.split()[1] != got[0][1]
    names = {p.name for p in (tmp_path / ".torchrun").iterdir()}
    assert len(names) == 2 and link.name in names and "0123456789abcdef" not in names
