"""Each rank's c10d collectives are recorded in its run, and the ranks' sequences are compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import DATA, REPO, python_env
from tpu_debug.core.records import CollectiveInfo
from tpu_debug.tracers.events import CollectiveCallEvent, SourceLocation
from tpu_debug.tracers.reading.collective_calls import first_desyncs

from tpu_debug.ranks import open_group

SCRIPT = DATA / "collective_desync.py"


def _dims(text: str) -> tuple[int, ...]:
    """A shape as the ranks write it (``"[4, 2]"``) as the record keeps it."""
    return tuple(json.loads(text))


def _call(rank: int, seq: int, op: str = "allreduce", shapes=("[4]",), line: int = 10, dtype: str = "float32",
          **kw) -> CollectiveCallEvent:
    return CollectiveCallEvent(seq, float(seq), None, 1, SourceLocation("train.py", line, "main"), CollectiveInfo(
        op, "0", (0, 1), rank, seq, tuple(_dims(s) for s in shapes), dtype, 16, **kw))


def test_same_sequences_agree():
    calls = {r: [_call(r, 1), _call(r, 2, op="broadcast", peer=0)] for r in (0, 1)}
    assert first_desyncs(calls) == []


def test_a_rank_that_stops_is_named_with_the_others_line():
    calls = {0: [_call(0, 1), _call(0, 2, line=12)], 1: [_call(1, 1)]}
    (desync,) = first_desyncs(calls)
    assert (desync.group, desync.seq, desync.reason) == ("0", 2, "missing")
    assert desync.render() == (
        "group 0, collective #2: the ranks differ (missing)\n"
        "  rank 0: allreduce([4]; float32) at train.py:12 in main\n"
        "  rank 1: no collective #2 (its calls in this group ended before)"
    )


@pytest.mark.parametrize(("change", "reason"), [
    ({"op": "broadcast"}, "op"), ({"shapes": ("[2]",)}, "shapes"), ({"dtype": "bfloat16"}, "dtype"),
])
def test_first_difference_names_its_reason(change, reason):
    rank1 = [_call(1, 1), _call(1, 2, **change), _call(1, 3)]
    (desync,) = first_desyncs({0: [_call(0, 1), _call(0, 2), _call(0, 3)], 1: rank1})
    assert (desync.seq, desync.reason) == (2, reason)


def test_point_to_point_and_uneven_all_to_all_are_no_desync():
    rank0 = [_call(0, 1, op="send", peer=1), _call(0, 1, op="alltoall_base", shapes=("[3]", "[4]"))]
    rank1 = [_call(1, 1, op="recv", peer=0), _call(1, 1, op="alltoall_base", shapes=("[5]", "[4]"))]
    assert first_desyncs({0: rank0, 1: rank1}) == []


def _run_ranks(tmp_path: Path, case: str) -> tuple[dict[int, list[CollectiveCallEvent]], subprocess.CompletedProcess]:
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(tmp_path), "--nproc", "2",
         str(SCRIPT), case],
        env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    (parent,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    group = open_group(parent)
    try:
        return {rank: session.events("collective_call") for rank, session in group.sessions()}, proc
    finally:
        group.close()


def _line(text: str) -> int:
    (line,) = [i for i, src in enumerate(SCRIPT.read_text().splitlines(), 1) if text in src]
    return line


@pytest.mark.slow
def test_planted_hang_is_named_in_the_runs(tmp_path):
    calls, proc = _run_ranks(tmp_path, "hang")
    assert proc.returncode != 0  # rank 0 timed out in its extra all_reduce
    (desync,) = first_desyncs(calls)
    assert (desync.seq, desync.reason) == (3, "missing")
    (rank0, call0), (rank1, call1) = desync.calls
    assert (rank0, call0.op, call0.location.line) == (0, "allreduce", _line("only rank 0 gets here"))
    assert (rank1, call1) == (1, None)


@pytest.mark.slow
def test_planted_size_mismatch_is_named_in_the_runs(tmp_path):
    calls, _ = _run_ranks(tmp_path, "shapes")
    (desync,) = first_desyncs(calls)
    assert (desync.seq, desync.reason) == (3, "shapes")
    assert [c.shapes for _, c in desync.calls] == [((4,), (2,)), ((4,), (3,))]
    assert {c.location.line for _, c in desync.calls} == {_line("all_gather_into_tensor")}
