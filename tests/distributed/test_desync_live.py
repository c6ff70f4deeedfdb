"""The live check of the `tpu` process group: ranks that stop calling the same collectives are
named while they run, with each rank's line and the fix by cause, instead of hanging.

The two-rank and four-rank scripts run under ``torchrun ... -m tpu_debug run`` (each rank
records its run), with the check's timeout set short through the environment; no test
asserts a duration, only which error each rank ended with and what its run holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import DATA, python_env
from tpu_debug.core import desync
from tpu_debug.tracers.collective_calls import first_desyncs
from tpu_debug.tracers.events import CollectiveCallEvent, SourceLocation

SCRIPT = DATA / "desync_live.py"
NAME = SCRIPT.name


def _line(text: str) -> int:
    (line,) = [i for i, src in enumerate(SCRIPT.read_text().splitlines(), 1) if text in src]
    return line


def _torchrun(base: Path, plant: str, nproc: int, timeout: int, *extra: str) -> dict:
    """Run ``plant`` on ``nproc`` ranks; each rank's results, runs and the launcher's output."""
    out, runs = base / "out", base / "runs"
    out.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *extra, "-m", "tpu_debug",
         "run", "--no-report", "--logdir", str(runs), str(SCRIPT), plant, str(out)],
        env=python_env(TPU_DEBUG_COLLECTIVE_TIMEOUT=str(timeout)), cwd=base, capture_output=True, text=True,
        timeout=300, check=False,
    )
    results = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return {"proc": proc, "results": results, "runs": sorted(p.parent for p in runs.rglob("run.db"))}


def _sessions(runs: list[Path]) -> dict[int | None, object]:
    """Each run by the rank its collective calls name (None: a run with none)."""
    import tpu_debug

    by_rank = {}
    for path in runs:
        session = tpu_debug.open_run(path)
        calls = session.events("collective_call")
        by_rank[calls[0].group_ranks[calls[0].rank] if calls else None] = session
    return by_rank


@pytest.fixture(scope="module")
def mismatches(tmp_path_factory) -> dict:
    """Five plants on two ranks, one fresh group each: shapes, order, stuck, device, hang."""
    return _torchrun(tmp_path_factory.mktemp("mismatches"), "mismatches", 2, 5)


def _both(mismatches: dict, plant: str) -> list[dict]:
    results = mismatches["results"]
    assert sorted(results) == [0, 1], mismatches["proc"].stdout[-3000:] + mismatches["proc"].stderr[-6000:]
    return [results[0][plant], results[1][plant]]


def test_uneven_last_batch_is_named_on_both_ranks_with_both_lines(mismatches):
    line = _line("the batch's gradients")
    expected = (
        "group 1, collective #3: the ranks differ (shapes)\n"
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{line} in uneven_last_batch\n"
        f"  rank 1: allreduce([3]; float32, SUM) at {NAME}:{line} in uneven_last_batch\n"
        "Cause: an uneven last batch: the ranks ran the loop a different number of times, or its last step "
        "with other sizes.\n"
        "Fix: Give every rank the same number of batches, of the same sizes: DistributedSampler(dataset, "
        "drop_last=True) or DataLoader(..., drop_last=True), or pad the last batch; DDP's `with model.join():` "
        "lets ranks with fewer batches finish."
    )
    for rank, got in enumerate(_both(mismatches, "shapes")):
        assert got["type"] == "CollectiveDesyncError"
        assert (got["group"], got["seq"], got["reason"], got["cause"], got["ranks"]) == (
            "1", 3, "shapes", "uneven_batch", [1 - rank])
        assert got["text"] == expected


def test_opposite_order_is_named_on_both_ranks(mismatches):
    first0, first1 = _line("rank 0 reduces first"), _line("rank 1 broadcasts first")
    for got in _both(mismatches, "order"):
        assert (got["type"], got["seq"], got["reason"], got["cause"]) == ("CollectiveDesyncError", 1, "op", "branch")
        lines = got["text"].splitlines()
        assert lines[1:3] == [
            f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{first0} in opposite_order",
            f"  rank 1: broadcast([4]; float32, root 0) at {NAME}:{first1} in opposite_order",
        ]
        assert lines[4].startswith("Fix: Every rank of a group must call the same collectives in the same order")


def test_a_rank_that_does_not_come_is_named_at_the_timeout_with_its_last_collective(mismatches):
    rank0, rank1 = _both(mismatches, "stuck")
    assert rank1 is None  # it slept through, then went on
    assert (rank0["type"], rank0["seq"], rank0["reason"], rank0["cause"], rank0["ranks"]) == (
        "CollectiveTimeoutError", 2, "missing", "late", [1])
    assert rank0["text"].splitlines()[1:3] == [
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{_line('rank 1 never calls this one')} in stuck",
        (f"  rank 1: did not call collective #2 within 5 s; its last collective of the group was #1 "
         f"allreduce([4]; float32, SUM) at {NAME}:{_line('both ranks call this one')} in stuck"),
    ]
    assert "raise TPU_DEBUG_COLLECTIVE_TIMEOUT" in rank0["text"]


def test_collective_under_rank_zero_is_named_when_the_other_rank_leaves(mismatches):
    rank0, rank1 = _both(mismatches, "hang")
    assert rank1 is None
    assert rank0["type"] == "CollectiveDesyncError"
    line = _line("only rank 0 gets here")
    assert rank0["text"] == (
        "group 5, collective #3: the ranks differ (missing)\n"
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{line} in rank_zero_only\n"
        "  rank 1: ended (its process left the group); its last collective of the group was #2 "
        f"barrier(no tensors; -) at {NAME}:{line - 2} in rank_zero_only\n"
        "Cause: a collective only rank 0 calls (under `if rank == 0:`).\n"
        f"Fix: rank 0 alone called collective #3 at {NAME}:{line} in rank_zero_only: a collective under "
        "`if rank == 0:` (a metric, logging, saving) waits for ranks that never call it. Call it on every rank "
        "of the group and use its result on rank 0 only, or do rank 0's work without a collective."
    )


def test_tensors_of_other_devices_on_the_ranks_are_named(mismatches):
    line = _line('rank 0 forgot .to("tpu")')
    for got in _both(mismatches, "device"):
        assert (got["type"], got["seq"], got["reason"], got["cause"]) == ("CollectiveDesyncError", 1, "device", "device")
        assert got["text"].splitlines()[1:] == [
            f"  rank 0: allreduce([4]; float32, SUM) on cpu at {NAME}:{line} in mixed_devices",
            f"  rank 1: allreduce([4]; float32, SUM) at {NAME}:{line} in mixed_devices",
            "Cause: tensors of other devices: the ranks gave one collective tensors on other devices.",
            ('Fix: Give the collective tensors on the tpu device on every rank (rank 0: cpu; rank 1: tpu): move '
             'them with .to("tpu") before the call.'),
        ]


def test_runs_stay_readable_and_hold_the_findings(mismatches):
    from tpu_debug.tracers.advisor import advise

    assert mismatches["proc"].returncode == 0, mismatches["proc"].stderr[-6000:]
    sessions = _sessions(mismatches["runs"])
    assert sorted(sessions) == [0, 1]
    for rank, session in sessions.items():
        # every collective the rank entered is recorded, the ones it stopped at included
        seqs = {(c.group, c.seq) for c in session.events("collective_call")}
        assert {("1", 3), ("2", 1), ("3", 1 if rank else 2), ("4", 1), ("5", 2 if rank else 3)} <= seqs
        raised = [r["text"] for r in mismatches["results"][rank].values() if r is not None]
        findings = [f for f in advise(session).findings if f.kind == "collective_desync"]
        assert len(findings) == len(raised) == (5 if rank == 0 else 3)
        for f in findings:
            (text,) = [t for t in raised if f.title.startswith(t.splitlines()[0] + ": ")]
            assert f.severity == "error" and f.evidence.location.file.endswith(NAME)
            assert text.endswith("Fix: " + f.fix)
            assert all(f"  {fact}" in text.splitlines() for fact in f.evidence.facts)


def test_after_the_fact_reader_gives_the_live_text(mismatches):
    sessions = _sessions(mismatches["runs"])
    calls = {rank: [c for c in s.events("collective_call") if c.group == "5"] for rank, s in sessions.items()}
    (found,) = first_desyncs(calls, states={1: "ended"})
    assert found.cause == "rank_zero"
    assert found.describe() == mismatches["results"][0]["hang"]["text"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict:
    # torchrun's agent stops the other ranks of its host 0.1 s after one dies (they end then,
    # named by torchrun); a longer monitor interval stands for what the check is for: ranks
    # no agent stops, on other hosts, which would otherwise wait in gloo for 30 minutes
    return _torchrun(tmp_path_factory.mktemp("killed"), "kill", 2, 10, "--monitor-interval", "5")


def test_a_killed_rank_is_named_with_its_last_collective(killed):
    got = killed["results"][0]["kill"]
    assert 1 not in killed["results"]  # killed before it could write anything
    assert (got["type"], got["seq"], got["reason"], got["cause"], got["ranks"]) == (
        "CollectiveDesyncError", 3, "missing", "died", [1])
    assert got["text"].splitlines()[1:4] == [
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{_line('waits for the dead rank here')} in killed",
        ("  rank 1: died (its process is gone); its last collective of the group was #2 "
         f"allreduce([4]; float32, SUM) at {NAME}:{_line(chr(35) + ' rank 1' + chr(39) + 's last collective')} in killed"),
        "Cause: a rank died.",
    ]
    sessions = _sessions(killed["runs"])
    assert [e.cause for e in sessions[0].events("collective_desync")] == ["died"]


def test_a_correct_four_rank_script_gets_no_error_and_no_finding(tmp_path):
    from tpu_debug.tracers.advisor import advise

    ran = _torchrun(tmp_path, "ok", 4, 10)
    assert ran["proc"].returncode == 0, ran["proc"].stdout[-3000:] + ran["proc"].stderr[-6000:]
    assert ran["results"] == {r: {"ok": None} for r in range(4)}
    sessions = _sessions(ran["runs"])
    assert sorted(sessions) == [0, 1, 2, 3]
    for session in sessions.values():
        assert session.events("collective_desync") == []
        assert [f.kind for f in advise(session).findings if f.kind == "collective_desync"] == []


# -- the shared words, without processes -------------------------------------------------


def _call(rank: int, seq: int, op: str = "allreduce", shapes=("[4]",), line: int = 10) -> CollectiveCallEvent:
    return CollectiveCallEvent(
        id=seq, ts=float(seq), mode=None, thread=1, location=SourceLocation("train.py", line, "main"), op=op,
        group="0", group_ranks=(0, 1), rank=rank, seq=seq, shapes=tuple(shapes), dtype="float32", nbytes=16,
    )


def test_a_loop_that_runs_once_more_on_one_rank_is_an_uneven_last_batch():
    calls = {0: [_call(0, 1), _call(0, 2), _call(0, 3)], 1: [_call(1, 1), _call(1, 2)]}
    (found,) = first_desyncs(calls)
    assert (found.seq, found.reason, found.cause) == (3, "missing", "uneven_batch")
    assert found.fix.startswith("Give every rank the same number of batches")


def test_sizes_that_differ_at_a_new_line_are_rank_dependent_sizes():
    calls = {0: [_call(0, 1), _call(0, 2, line=20)], 1: [_call(1, 1), _call(1, 2, shapes=("[3]",), line=20)]}
    (found,) = first_desyncs(calls)
    assert (found.reason, found.cause) == ("shapes", "sizes")


def test_a_reduction_or_root_that_differs_is_a_branch():
    a = desync.RankCall(0, op="allreduce", seq=1, shapes=("[4]",), dtype="float32", reduce_op="SUM")
    b = desync.RankCall(1, op="allreduce", seq=1, shapes=("[4]",), dtype="float32", reduce_op="MAX")
    assert desync.differ([a, b]) == "reduce_op"
    r0 = desync.RankCall(0, op="broadcast", seq=1, shapes=("[4]",), dtype="float32", peer=0)
    r1 = desync.RankCall(1, op="broadcast", seq=1, shapes=("[4]",), dtype="float32", peer=1)
    assert desync.differ([r0, r1]) == "root"
    assert desync.cause_of("root", [r0, r1]) == "branch"


def test_point_to_point_calls_are_not_compared():
    calls = {0: [_call(0, 1, op="send")], 1: [_call(1, 1, op="recv", shapes=("[9]",))]}
    assert first_desyncs(calls) == []


# -- faults named in one line, in this process (a group of one rank) ----------------------


@pytest.fixture
def store(tmp_path):
    import torch.distributed as dist

    yield dist.FileStore(str(tmp_path / "store"), 1)
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:Device capability of tpu_dsit unknown")  # torch's, before its error
def test_an_unknown_backend_name_is_named_with_the_fix(store):
    import re

    import torch.distributed as dist
    from tpu_debug.runtime.distributed.errors import LaunchError

    with pytest.raises(LaunchError, match=re.escape(
        "rank 0: init_process_group(backend='tpu_dsit'): torch.distributed has no backend of that name. On the "
        'tpu device give "tpu_dist" or "tpu" (TorchTPU\'s backends), or no backend: init_process_group() picks '
        'tpu_dist; "gloo" is CPU\'s.'
    )):
        dist.init_process_group("tpu_dsit", store=store, rank=0, world_size=1)


def test_a_mesh_bigger_than_the_job_says_what_to_launch(store):
    import re

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from tpu_debug.runtime.distributed.errors import MeshError

    dist.init_process_group(store=store, rank=0, world_size=1)
    with pytest.raises(MeshError, match=re.escape(
        "rank 0: init_device_mesh('tpu', (2, 2)) needs 4 ranks, and the job has 1: start 4 processes (torchrun "
        "--nproc-per-node 4), or give a mesh shape whose sizes multiply to 1"
    )):
        init_device_mesh("tpu", (2, 2))


def test_a_tensor_of_a_device_the_group_cannot_use_is_named(store):
    import re

    import torch
    import torch.distributed as dist
    from tpu_debug.runtime.distributed.errors import CollectiveDeviceError

    dist.init_process_group(store=store, rank=0, world_size=1)
    with pytest.raises(CollectiveDeviceError, match=re.escape(
        'rank 0: allreduce got a tensor on meta: the tpu process group runs collectives on tpu tensors (and CPU '
        'ones); move it with .to("tpu") (a meta tensor has no data: create the module\'s parameters on tpu '
        'first, e.g. model.to_empty(device="tpu"))'
    )):
        dist.all_reduce(torch.ones(3, device="meta"))
