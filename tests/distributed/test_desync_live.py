"""The live check of the `tpu` process group: ranks that stop calling the same collectives are
named while they run, with each rank's line and the fix by cause, instead of hanging.

The two-rank and four-rank scripts run under ``torchrun ... -m tpu_debug run`` (each rank
records its run), with the check's timeout set short through the environment; no test
asserts a duration, only which error each rank ended with and what its run holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import DATA, python_env
from tpu_debug.core import desync
from tpu_debug.core.records import CollectiveInfo
from tpu_debug.tracers.events import CollectiveCallEvent, SourceLocation
from tpu_debug.tracers.reading.collective_calls import first_desyncs

SCRIPT = DATA / "desync_live.py"
NAME = SCRIPT.name


def _dims(text: str) -> tuple[int, ...]:
    """A shape as the ranks write it (``"[4, 2]"``) as the record keeps it."""
    return tuple(json.loads(text))


def _line(text: str) -> int:
    (line,) = [i for i, src in enumerate(SCRIPT.read_text().splitlines(), 1) if text in src]
    return line


def _torchrun(base: Path, plant: str, nproc: int, timeout: int, *extra: str, **env: str) -> dict:
    """Run ``plant`` on ``nproc`` ranks; each rank's results, runs and the launcher's output.
    Each rank's Flight Recorder dumps go to ``base / "fr"`` (``fr``) when it writes any."""
    out, runs, fr = base / "out", base / "runs", base / "fr"
    out.mkdir(parents=True)
    fr.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *extra, "-m", "tpu_debug",
         "run", "--no-report", "--logdir", str(runs), str(SCRIPT), plant, str(out)],
        env=python_env(TPU_DEBUG_COLLECTIVE_TIMEOUT=str(timeout), TORCH_FR_DUMP_TEMP_FILE=str(fr / "rank_"), **env),
        cwd=base, capture_output=True, text=True, timeout=300, check=False,
    )
    results = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return {"proc": proc, "results": results, "runs": sorted(p.parent for p in runs.rglob("run.db")), "fr": fr,
            "group": next(runs.glob("*/ranks.json")).parent if list(runs.glob("*/ranks.json")) else None}


def _sessions(runs: list[Path]) -> dict[int | None, object]:
    """Each run by the rank its collective calls name (None: a run with none)."""
    import tpu_debug

    by_rank = {}
    for path in runs:
        session = tpu_debug.open_run(path)
        calls = session.events("collective_call")
        by_rank[calls[0].ranks[calls[0].rank] if calls else None] = session
    return by_rank


@pytest.fixture(scope="module")
def mismatches(tmp_path_factory) -> dict:
    """The plants of ``mismatches`` on two ranks, one fresh group each (see desync_live.py), with
    each rank's Flight Recorder on and its dump written at exit."""
    return _torchrun(tmp_path_factory.mktemp("mismatches"), "mismatches", 2, 5, TORCH_FR_BUFFER_SIZE="500",
                     TPU_DEBUG_FLIGHT_RECORDER_AT_EXIT="1")


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
    # where rank 1 is now, from rank 1 itself: asleep in stuck(), called by caught()
    now = (f"{NAME}:{_line('alive, busy elsewhere')} in stuck <- {NAME}:{_line('fn()')} in caught <- "
           f"{NAME}:{_line('caught(' + chr(34) + 'stuck' + chr(34))} in <module>")
    assert rank0["text"].splitlines()[1:3] == [
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{_line('rank 1 never calls this one')} in stuck",
        (f"  rank 1: did not call collective #2 within 5 s; its last collective of the group was #1 "
         f"allreduce([4]; float32, SUM) at {NAME}:{_line('both ranks call this one')} in stuck; it is still "
         f"running, now at {now}"),
    ]
    assert "Cause: a rank did not arrive: it is still running elsewhere." in rank0["text"]
    assert "raise TPU_DEBUG_COLLECTIVE_TIMEOUT" in rank0["text"]


def test_collective_under_rank_zero_is_named_when_the_other_rank_leaves(mismatches):
    rank0, rank1 = _both(mismatches, "hang")
    assert rank1 is None
    assert rank0["type"] == "CollectiveDesyncError"
    line = _line("only rank 0 gets here")
    assert rank0["text"] == (
        "group 9, collective #3: the ranks differ (missing)\n"
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


def test_an_uneven_last_batch_before_a_metric_is_an_uneven_batch_not_a_branch(mismatches):
    # rank 1's loop ended a batch early: it all-reduces the epoch's metric, past the loop, while
    # rank 0 all-reduces its last batch inside it
    for got in _both(mismatches, "uneven_metric"):
        assert (got["type"], got["seq"], got["reason"], got["cause"]) == ("CollectiveDesyncError", 3, "shapes",
                                                                          "uneven_batch")
        assert got["text"].splitlines()[1:4] == [
            (f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{_line('a batch' + chr(39) + 's gradients')} in "
             "uneven_then_metric"),
            (f"  rank 1: allreduce([2]; float32, SUM) at {NAME}:{_line('the epoch' + chr(39) + 's metric, after')} "
             "in uneven_then_metric"),
            ("Cause: an uneven last batch: the ranks ran the loop a different number of times, or its last step "
             "with other sizes."),
        ]


def test_a_send_and_its_receive_of_other_sizes_are_named_on_both_ranks(mismatches):
    # named before gloo sees them: gloo itself aborts the receiving process on such a pair
    for got in _both(mismatches, "p2p_sizes"):
        assert (got["type"], got["seq"], got["reason"], got["cause"]) == ("CollectiveDesyncError", 1, "shapes",
                                                                          "p2p_sizes")
        assert got["text"].splitlines()[:4] == [
            "group 6, point-to-point #1 from rank 0 to rank 1: the ranks differ (shapes)",
            f"  rank 0: send([4]; float32) to rank 1 at {NAME}:{_line('rank 0 sends 4')} in p2p_sizes",
            f"  rank 1: recv([3]; float32) from rank 0 at {NAME}:{_line('rank 1 receives 3')} in p2p_sizes",
            "Cause: a send and its receive of other sizes or dtypes.",
        ]


def test_receives_that_wait_for_each_other_are_named_on_both_ranks(mismatches):
    line = _line("both ranks receive first")
    for rank, got in enumerate(_both(mismatches, "p2p_order")):
        peer = 1 - rank
        # named as soon as each rank's question to the other says so, not at the timeout
        assert (got["type"], got["reason"], got["cause"], got["ranks"]) == ("CollectiveDesyncError", "missing",
                                                                            "p2p_order", [peer])
        assert "within" not in got["text"]
        lines = got["text"].splitlines()
        assert lines[0] == f"group 7, point-to-point #1 from rank {peer} to rank {rank}: the ranks differ (missing)"
        assert f"  rank {rank}: recv([4]; float32) from rank {peer} at {NAME}:{line} in p2p_order" in lines
        assert lines[3] == "Cause: point-to-point calls that wait for each other: each rank receives before it sends."
        assert "dist.batch_isend_irecv" in lines[4]


def test_a_planted_slow_rank_is_found_as_the_straggler(mismatches):
    from tpu_debug.tracers.advisor import advise

    from tpu_debug.report.ranks import c10d_data

    assert _both(mismatches, "straggler") == [None, None]  # slow, not wrong: nothing raised
    sessions = _sessions(mismatches["runs"])
    (found,) = [f for f in advise(sessions[0]).findings if f.kind == "collective_straggler"]
    assert found.title.startswith("rank 1 entered last at ") and " collectives of group 8: this rank waited " in found.title
    assert (found.evidence.location.file.endswith(NAME), found.evidence.location.line) == (
        True, _line("rank 0 waits here"))
    assert found.fix.startswith("Rank 1 reaches the group's collectives later than the others every time")
    # the ranks report reads the same from both ranks' entry times
    (straggler,) = [st for st in c10d_data(sorted(sessions.items()))["stragglers"] if st["group"] == "8"]
    # the first call at the line is warm-up, left out: 5 of the 6 collectives count
    assert straggler["rank"] == 1 and straggler["of"] == 5 and straggler["last"] >= 4
    assert [f.kind for f in advise(sessions[1]).findings if f.kind == "collective_straggler"] == []


def test_torchfrtrace_names_the_ranks_and_collective_the_report_names(mismatches):
    import logging

    from torch.distributed.flight_recorder import fr_trace

    from tpu_debug.ranks import open_group
    from tpu_debug.report.ranks import c10d_data

    assert sorted(p.name for p in mismatches["fr"].iterdir()) == ["rank_0", "rank_1"]
    # torchfrtrace's own analysis, in this process (it logs what it finds to "Flight Recorder")
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("Flight Recorder").addHandler(handler)
    try:
        fr_trace.main([str(mismatches["fr"])])
    finally:
        logging.getLogger("Flight Recorder").removeHandler(handler)
    out = "\n".join(said)
    blocks = out.split("Collective sequence number: ")
    # PyTorch's own analysis of the dumps: the uneven last batch of group 1 ...
    (first,) = [b for b in blocks if "group info: 1\n" in b]
    assert first.startswith("3 has errors")
    assert "collective: gloo:all_reduce" in first and "expected ranks: {0, 1}" in first
    assert ("Culprit rank 1; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[4]]' does not match "
            "found input sizes: '[[3]]'") in first
    # ... and ours, read from the same ranks' runs: the same group, collective, ranks and sizes
    with open_group(mismatches["group"]) as group:
        ours = {d["group"]: d for d in c10d_data(group.sessions())["desyncs"]}
    assert (ours["1"]["seq"], ours["1"]["reason"]) == (3, "shapes")
    line = _line("the batch" + chr(39) + "s gradients")
    assert ours["1"]["text"].splitlines()[1:3] == [
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{line} in uneven_last_batch",
        f"  rank 1: allreduce([3]; float32, SUM) at {NAME}:{line} in uneven_last_batch",
    ]
    # the rank that did not come to group 3's second collective, named by both
    assert "Not all ranks joining collective, sequence number: 2\ninternal record id: " in out
    assert "group info: 3\ncollective: gloo:all_reduce\nmissing ranks: {1}" in out
    assert (ours["3"]["seq"], ours["3"]["reason"], ours["3"]["cause"]) == (2, "missing", "late")


def test_runs_stay_readable_and_hold_the_findings(mismatches):
    from tpu_debug.tracers.advisor import advise

    assert mismatches["proc"].returncode == 0, mismatches["proc"].stderr[-6000:]
    sessions = _sessions(mismatches["runs"])
    assert sorted(sessions) == [0, 1]
    for rank, session in sessions.items():
        # every collective the rank entered is recorded, the ones it stopped at included
        seqs = {(c.group, c.seq) for c in session.events("collective_call")}
        assert {("1", 3), ("2", 1), ("3", 1 if rank else 2), ("4", 1), ("5", 3), ("9", 2 if rank else 3)} <= seqs
        raised = [r["text"] for r in mismatches["results"][rank].values() if r is not None]
        findings = [f for f in advise(session).findings if f.kind == "collective_desync"]
        assert len(findings) == len(raised) == (8 if rank == 0 else 6)
        for f in findings:
            (text,) = [t for t in raised if f.title.startswith(t.splitlines()[0] + ": ")]
            assert f.severity == "error" and f.evidence.location.file.endswith(NAME)
            assert text.endswith("Fix: " + f.fix)
            assert all(f"  {fact}" in text.splitlines() for fact in f.evidence.facts)


def test_after_the_fact_reader_gives_the_live_text(mismatches):
    sessions = _sessions(mismatches["runs"])
    calls = {rank: [c for c in s.events("collective_call") if c.group == "9"] for rank, s in sessions.items()}
    (found,) = first_desyncs(calls, states={1: "ended"})
    assert found.cause == "rank_zero"
    assert found.describe() == mismatches["results"][0]["hang"]["text"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict:
    # torchrun's agent stops the other ranks of its host 0.1 s after one dies (they end then,
    # named by torchrun); what the check is for is ranks no agent stops, on other hosts, which
    # would otherwise wait in gloo for 30 minutes: rank 0 ignores the agent's SIGTERM, and the
    # longer monitor interval leaves the dead rank a zombie whose signal can be read
    return _torchrun(tmp_path_factory.mktemp("killed"), "kill", 2, 10, "--monitor-interval", "5",
                     TORCH_FR_BUFFER_SIZE="50")


def test_a_killed_rank_is_named_with_its_signal_and_last_collective(killed):
    got = killed["results"][0]["kill"]
    assert 1 not in killed["results"]  # killed before it could write anything
    assert (got["type"], got["seq"], got["reason"], got["cause"], got["ranks"]) == (
        "CollectiveDesyncError", 3, "missing", "died", [1])
    last = _line(chr(35) + " rank 1" + chr(39) + "s last collective")
    # the signal is read from the dead rank's /proc entry while it is a zombie: torchrun's agent
    # reaps it at its next look (5 s here), and a rank 0 slowed by a loaded machine may look later
    # (test_exit_status_of_a_killed_child reads a zombie without racing a reaper)
    how, why = "killed by signal 9 (SIGKILL)", (
        "SIGKILL is what the kernel's out-of-memory killer sends (`dmesg` names the process), and what a "
        "scheduler or a `kill -9` sends")
    if "died (exit status unknown)" in got["text"]:
        how, why = "exit status unknown", "its own output or the launcher's says why (out of memory, a signal, a crash)"
    assert got["text"].splitlines()[1:5] == [
        f"  rank 0: allreduce([4]; float32, SUM) at {NAME}:{_line('waits for the dead rank here')} in killed",
        (f"  rank 1: died ({how}); its last collective of the group was #2 "
         f"allreduce([4]; float32, SUM) at {NAME}:{last} in killed"),
        "Cause: a rank died.",
        (f"Fix: rank 1 died ({how}): {why}. The group cannot go on without "
         "it: restart the job from its last checkpoint (torchrun --max-restarts restarts every rank)."),
    ]
    sessions = _sessions(killed["runs"])
    assert [e.cause for e in sessions[0].events("collective_desync")] == ["died"]


def test_a_killed_ranks_last_collectives_outlive_it(killed):
    import dataclasses

    from tpu_debug.tracers.collective_journal import read_journal
    from tpu_debug.tracers.reading.collective_calls import group_desyncs, read_rank

    from tpu_debug.ranks import open_group

    sessions = dict(open_group(killed["group"]).sessions())
    # written before each call went on: the killed rank's journal holds both its collectives,
    # whatever the run store had committed when the kill came
    assert [(r["kind"], r["seq"]) for r in read_journal(sessions[1].run_dir)] == [
        ("call", 1), ("done", 1), ("call", 2), ("done", 2)]
    records = {rank: read_rank(rank, s) for rank, s in sessions.items()}
    assert [c.seq for c in records[1].calls] == [1, 2] and records[1].state == "died"
    # read after the fact without the live error: the same collective, the same cause
    quiet = {rank: dataclasses.replace(r, desyncs=()) for rank, r in records.items()}
    (found,) = group_desyncs(quiet)
    assert (found.seq, found.reason, found.cause, found.live) == (3, "missing", "died", False)
    # and with it, the live error's own text
    (live,) = group_desyncs(records)
    assert live.live and live.text == killed["results"][0]["kill"]["text"]


def test_the_flight_recorder_dumps_on_the_error(killed):
    from tpu_debug.tracers.recording.flight_recorder_import import read_dump

    # rank 0 raised: its dump names the collective it stopped at, not completed; rank 1 was killed
    assert [p.name for p in killed["fr"].iterdir()] == ["rank_0"]
    dump = read_dump(killed["fr"] / "rank_0", 0)
    assert dump.version == "2.10" and dump.groups["0"] == ("default_pg", (0, 1))
    entries = [(e["profiling_name"], e["collective_seq_id"], e["state"]) for e in dump.entries]
    assert entries == [("gloo:all_reduce", 1, "completed"), ("gloo:all_reduce", 2, "completed"),
                       ("gloo:all_reduce", 3, "scheduled")]
    assert dump.entries[2]["input_sizes"] == [[4]] and dump.entries[2]["input_dtypes"] == ["Float"]
    (user,) = [f for f in dump.entries[2]["frames"] if f["filename"].endswith(NAME) and f["name"] == "killed"]
    assert user["line"] == _line("waits for the dead rank here")


def test_how_a_rank_leaves_says_the_exception_and_its_line():
    # what a leaving rank tells the others: the exception the interpreter kept for the exit
    # handlers (sys.last_value, which tpu-debug run sets as the interpreter does)
    import sys as _sys

    from tpu_debug.runtime.distributed.rank_state import leaving

    def bad_batch() -> None:
        raise ValueError("a bad batch")

    saved = getattr(_sys, "last_value", None)
    try:
        try:
            bad_batch()
        except ValueError as exc:
            _sys.last_value = exc
        got = leaving()
    finally:
        _sys.last_value = saved
    here = Path(__file__).name
    line = bad_batch.__code__.co_firstlineno + 1
    assert (got["state"], got["error"]) == ("raised", "ValueError: a bad batch")
    assert got["stack"][-1].endswith(f"{here}:{line} in {bad_batch.__qualname__}")
    call = desync.RankCall(1, "raised", "allreduce", 2, ("[4]",), "float32", "SUM", None, "train.py", 20, "step",
                           error=got["error"], stack=("train.py:31 in step",))
    at = desync.RankCall(0, "called", "allreduce", 3, ("[4]",), "float32", "SUM", None, "train.py", 20, "step")
    assert desync.cause_of("missing", [at, call]) == "raised"
    assert desync.rank_line(call, 3) == (
        "rank 1: raised ValueError: a bad batch at train.py:31 in step and left the group; its last collective of "
        "the group was #2 allreduce([4]; float32, SUM) at train.py:20 in step")


@pytest.mark.slow
def test_a_rank_that_raised_is_named_with_its_exception_and_line(tmp_path):
    # under torchrun, each rank under tpu-debug run: the cheap tier above checks the words
    ran = _torchrun(tmp_path, "raise", 2, 10, "--monitor-interval", "5")
    got = ran["results"][0]["raise"]
    assert 1 not in ran["results"]
    assert (got["type"], got["seq"], got["reason"], got["cause"], got["ranks"]) == (
        "CollectiveDesyncError", 3, "missing", "raised", [1])
    at = f"{NAME}:{_line('rank 1 raises here')} in raised"
    assert got["text"].splitlines()[2:5] == [
        (f"  rank 1: raised ValueError: a bad batch at {at} and left the group; its last collective of the group "
         f"was #2 allreduce([4]; float32, SUM) at {NAME}:{_line('the last collective rank 1 calls before')} "
         "in raised"),
        "Cause: a rank raised an exception and left the group.",
        (f"Fix: rank 1 raised ValueError: a bad batch at {at} and left, while the other ranks waited for it at "
         "collective #3: fix that error (rank 1's output holds its traceback)."),
    ]


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
    return CollectiveCallEvent(seq, float(seq), None, 1, SourceLocation("train.py", line, "main"), CollectiveInfo(op, "0", (0, 1), rank, seq, tuple(_dims(s) for s in tuple(shapes)), "float32", 16))


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


def test_exit_status_of_a_killed_child():
    """A process of this host that died and was not yet reaped is a zombie whose /proc entry
    holds how it ended; once reaped, nothing is known."""
    import signal
    import subprocess
    import time

    from tpu_debug.runtime.distributed.rank_state import exit_status

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert exit_status(child.pid) is None  # running
        os.kill(child.pid, signal.SIGKILL)
        while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)  # the kernel makes it a zombie as it dies; nothing reaps it here
        assert exit_status(child.pid) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    assert exit_status(child.pid) is None  # reaped: its /proc entry is gone
