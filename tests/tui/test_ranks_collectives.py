"""The ranks view (``r``) of a multi-process run shows each rank's c10d collectives side by side.

Two ranks are written with the run store's writer (no devices, no processes): both
all-reduce and all-gather, each returning after 2 ms per sequence number, then rank 0
all-reduces once more while rank 1 had stopped (its run ended early, as a killed rank's
does), and never returns from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpu_debug.core.records import CollectiveDone, CollectiveInfo
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tracers.store import DB_NAME
from tui_helpers import drive, press, screen_text, settle, widget_text

from tpu_debug.ranks import new_group

SCRIPT = "/work/project/train.py"
META = {
    "tpu_debug_version": "0.1.0", "torch_version": "2.13.0", "jax_version": "0.10.2", "jaxlib_version": "0.10.2",
    "python_version": "3.11.7", "platform": "cpu", "device_kind": "cpu", "device_count": 1,
    "argv": ["train.py"], "command": ["python", "train.py"], "start_time": "2026-01-31T12:00:00.000+00:00",
    "options": {}, "cwd": "/work/project",
}
CALLS = [("allreduce", ("[4, 2]",), 32, 21), ("all_gather_single", ("[8, 2]", "[4, 2]"), 96, 23),
         ("allreduce", ("[4]",), 16, 27)]


def _dims(text: str) -> tuple[int, ...]:
    """A shape as the ranks write it (``"[4, 2]"``) as the record keeps it."""
    return tuple(json.loads(text))


def _write_rank(run_dir: Path, rank: int) -> None:
    writer = RunWriter(run_dir / DB_NAME, dict(META, name=f"rank{rank}"))
    writer.put(ev.ProcessEvent(writer.new_id(), 0.0, None, 1, None, rank=rank, world_size=2, devices=1,
                               local_devices=1, coordinator="127.0.0.1:29500"))
    for seq, (op, shapes, nbytes, line) in enumerate(CALLS[: 3 - rank], 1):
        writer.put(ev.CollectiveCallEvent(writer.new_id(), 0.1 * seq + 0.01 * rank, None, 1, ev.SourceLocation(SCRIPT, line, "<module>"), CollectiveInfo(op, "0", (0, 1), rank, seq, tuple(_dims(s) for s in shapes), "float32", nbytes, "SUM" if op == "allreduce" else None, None)))
        if seq < 3:
            writer.put(ev.CollectiveDoneEvent(writer.new_id(), 0.1 * seq + 0.01 * rank + 0.002 * seq, None, 1, None, CollectiveDone(op, "0", rank, seq, 0.002 * seq)))
    writer.close({"status": "finished" if rank == 0 else "failed", "exit_status": 0 if rank == 0 else 1,
                  "end_time": "2026-01-31T12:00:01.000+00:00", "duration": 1.0})


def test_ranks_view_shows_collectives_side_by_side(tmp_path):
    from textual.widgets import DataTable, Static
    from tpu_debug.tui import TpuDebugApp
    from tpu_debug.tui.screens import RanksScreen

    import tpu_debug

    group = new_group(tmp_path / "runs", "train", 2, ["torchrun", "train.py"], launcher="torchrun")
    for rank in (0, 1):
        run = group.path / f"20260131T120000.00{rank}Z-rank{rank}"
        run.mkdir()
        _write_rank(run, rank)
    session = tpu_debug.open_run(group.rank_dirs()[0])
    app = TpuDebugApp(session, group=group, rank=0)

    async def scenario(pilot):
        await press(pilot, "r")
        assert isinstance(app.screen, RanksScreen)
        await settle(pilot)
        table = app.screen.query_one("#ranks-c10d", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[:4] for r in rows] == [["0", "0 (0, 1)", "3", "144 B"], ["1", "0 (0, 1)", "2", "128 B"]]
        # in them: 2 ms + 4 ms returned; rank 0's third call never did
        assert [r[5] for r in rows] == ["6.00 ms +1 never returned", "6.00 ms"]
        assert rows[0][6] == "allreduce 2 (48 B), all_gather_single 1 (96 B)"
        sequence = widget_text(app.screen.query_one("#ranks-sequence", Static))
        assert "collective desync: group 0, collective #3: the ranks differ (missing)" in sequence
        # rank 1's run ended (status failed, no exception): the desync says so, in the live check's words
        assert ("  rank 1: ended (its process left the group); its last collective of the group was #2 "
                "all_gather_single([8, 2], [4, 2]; float32) at train.py:23 in <module>") in sequence
        assert "Cause: a collective only rank 0 calls (under `if rank == 0:`)." in sequence
        assert "   1   rank 0: allreduce([4, 2]; float32, SUM) 2.00 ms at train.py:21" in sequence
        # each rank's entry after the first rank's, on the runs' shared clock
        assert "       rank 1: allreduce([4, 2]; float32, SUM) 2.00 ms (entered +10.00 ms) at train.py:21" in sequence
        assert "   3 ≠ rank 0: allreduce([4]; float32, SUM) never returned at train.py:27" in sequence
        assert "rank 1: -" in sequence
        assert "c10d collectives by rank" in screen_text(app)
        # q leaves the TUI from this view too, as from every other
        assert app.return_code is None
        await press(pilot, "q")
        assert app.return_code == 0

    try:
        drive(app, scenario, size=(160, 60))
    finally:
        session.close()
        group.close()


def test_a_run_recorded_before_returns_were_is_not_said_to_have_never_returned(tmp_path):
    # a run of a version that recorded entries only has no collective_dones table: its calls'
    # times are unknown, which is not the same as stuck
    import sqlite3

    from tpu_debug.ranks import open_group
    from tpu_debug.report.ranks import c10d_data, call_text, collective_spans, in_collectives_text

    group = new_group(tmp_path / "runs", "train", 2, ["torchrun", "train.py"], launcher="torchrun")
    for rank in (0, 1):
        run = group.path / f"20260131T120000.00{rank}Z-rank{rank}"
        run.mkdir()
        _write_rank(run, rank)
    old = group.rank_dirs()[1] / DB_NAME
    with sqlite3.connect(old) as db:
        db.execute("DROP TABLE collective_dones")
    sessions = open_group(group.path).sessions()
    data = c10d_data(sessions)
    (g0,), (g1,) = (r["groups"] for r in data["per_rank"])
    assert (g0["not_returned"], g1["not_returned"]) == (1, 0)
    assert g1["seconds"] is None and in_collectives_text(g1) == "-"
    call = data["sequence"][0]["rows"][0]["calls"][1]["call"]
    assert call["timed"] is False and call["seconds"] is None
    assert call_text(call) == "allreduce([4, 2]; float32, SUM) (entered +10.00 ms) at train.py:21"
    assert "never returned" not in call_text(call)
    (span, *_) = collective_spans(sessions).get(1, [None])
    assert span is None or dict(span.args)["returned"].startswith("not recorded")
