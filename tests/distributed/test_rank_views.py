"""The views of collectives and ranks, on runs written with the run store's writer.

A multi-process run of two ranks is written here event by event (no devices
needed): both ranks compile a training step whose gradients are all-reduced;
rank 1 then compiles a step of its own (a different collective), as the
rank-divergence pitfall makes it. The report, the reading verbs, the TUI and
the TensorBoard exporter are checked on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tpu_debug.core.collectives import Collective
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.reading.program_collectives import collective_totals, compare_ranks
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter

from tpu_debug.ranks import find_group, new_group

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))

SCRIPT = "/work/project/train.py"
META = {
    "tpu_debug_version": "0.1.0", "torch_version": "2.13.0", "jax_version": "0.10.2", "jaxlib_version": "0.10.2",
    "python_version": "3.11.7", "platform": "cpu", "device_kind": "cpu", "device_count": 4,
    "argv": ["train.py"], "command": ["python", "train.py"], "start_time": "2026-01-31T12:00:00.000+00:00",
    "options": {"hlo": True}, "cwd": "/work/project",
}


def _collective(opcode: str, shape: str, nbytes: int, group: int, line: int, node: str) -> Collective:
    wire = 2 * (group - 1) * nbytes // group if opcode == "all-reduce" else (group - 1) * nbytes // group
    return Collective(opcode, f"{opcode}.1", shape, nbytes, wire, group, 1, "{{0,1,2,3}}",
                      f"jit(fn)/{node}|aten::mm.default/dot_general", node, "aten::mm.default",
                      False, SCRIPT, line, "step")


def _write_rank(run_dir: Path, rank: int) -> None:
    writer = RunWriter(run_dir / DB_NAME, dict(META, name=f"rank{rank}"))
    writer.put(ev.ProcessEvent(writer.new_id(), 0.0, None, 1, None, rank=rank, world_size=2, devices=4,
                               local_devices=2, coordinator="localhost:1234"))
    loc = ev.SourceLocation(SCRIPT, 30, "<module>")
    grads = _collective("all-reduce", "(f32[64,32], f32[64])", 4 * (64 * 32 + 64), 4, 14, "mm_2")
    writer.put(ev.CollectivesEvent(writer.new_id(), 0.5, "compiled", 1, loc, "g1/inference", None, 4, "",
                                   (grads,), argument_bytes=9000, output_bytes=8000, alias_bytes=0,
                                   temp_bytes=3000, code_bytes=0))
    second = (_collective("all-gather", "f32[64,32]", 8192, 4, 41, "mul_3"),) if rank == 1 else (grads,)
    writer.put(ev.CollectivesEvent(writer.new_id(), 0.9, "compiled", 1, loc, "g2/inference", None, 4, "",
                                   second, argument_bytes=9000, output_bytes=8000, alias_bytes=0,
                                   temp_bytes=3000, code_bytes=0))
    error = "RankDivergenceError: ranks 1 and 0 are about to run different programs together" if rank else None
    writer.close({"status": "failed" if rank else "finished", "exit_status": 1 if rank else 0, "error": error,
                  "end_time": "2026-01-31T12:00:02.000+00:00", "duration": 2.0})


@pytest.fixture
def group_dir(tmp_path):
    group = new_group(tmp_path / "runs", "train", 2, ["tpu-debug", "run", "--nproc", "2", "train.py"])
    for rank in (0, 1):
        run = group.path / f"20260131T120000.00{rank}Z-rank{rank}"
        run.mkdir()
        _write_rank(run, rank)
    group.write(status="failed", exit_status=[0, 1])
    return group.path


def test_the_group_is_found_and_read(group_dir):
    group = find_group(None, group_dir.parent)
    assert group is not None and group.path == group_dir
    assert find_group(group_dir.name, group_dir.parent).path == group_dir
    assert find_group(str(group_dir), "/nowhere").path == group_dir
    assert json.loads((group_dir / "ranks.json").read_text())["exit_status"] == [0, 1]
    with group:
        sessions = group.sessions()
        assert [r for r, _ in sessions] == [0, 1]
        per_rank = [(r, s.events("collectives")) for r, s in sessions]
    diff = compare_ranks(per_rank)
    assert diff is not None and (diff.index, diff.what) == (1, "collectives")
    text = diff.render()
    assert text.startswith("program #2 differs (collectives): rank 0: g2/inference at /work/project/train.py:30")
    assert "rank 1: g2/inference at /work/project/train.py:30 in <module>: all-gather f32[64,32] over 4 devices " \
           "from aten::mm.default at /work/project/train.py:41" in text
    totals = collective_totals(per_rank[0][1])
    assert totals.by_opcode == {"all-reduce": (2, 2 * 2 * 3 * 4 * (64 * 32 + 64) // 4)}
    assert totals.peak_memory == 9000 + 8000 + 3000


def test_report_of_the_group(group_dir, capsys):
    from tpu_debug.cli import main

    assert main(["report", str(group_dir), "--plain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tpu_debug report: train (2 ranks)\n")
    ranks_table = out[out.index("\nRanks\n"):out.index("\nRank agreement\n")]
    rows = {cells[0]: cells[1:] for line in ranks_table.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert rows[""] == ["rank 0", "rank 1"]
    assert rows["status"] == ["finished", "failed (1)"]
    assert rows["multi-device programs"] == ["2", "2"]
    assert rows["largest memory/device"] == ["19.53 KiB", "19.53 KiB"]
    agreement = out[out.index("\nRank agreement\n"):]
    assert "rank 1 stopped: RankDivergenceError: ranks 1 and 0 are about to run different programs" in agreement
    assert "compiled programs: program #2 differs (collectives)" in agreement
    assert "\nCollectives (rank 0)\n" in out
    # the latest recording of the logdir is this group: the default RUN opens it too
    assert main(["report", "--logdir", str(group_dir.parent), "--plain"]) == 0
    assert capsys.readouterr().out.startswith("tpu_debug report: train (2 ranks)\n")


def test_tui_collectives_view_and_rank_switch(group_dir):
    from tpu_debug.tui import TpuDebugApp
    from tpu_debug.tui.screens import CollectivesScreen, RanksScreen
    from tui_helpers import drive, press, screen_text, settle

    import tpu_debug

    group = find_group(str(group_dir), group_dir.parent)
    rank, run = next(iter(group.rank_dirs().items()))
    session = tpu_debug.open_run(run)
    app = TpuDebugApp(session, group=group, rank=rank)

    async def scenario(pilot):
        await press(pilot, "8")
        assert isinstance(app.screen, CollectivesScreen)
        await settle(pilot)
        text = screen_text(app)
        assert "tpu-debug · train · rank 0" in text
        assert "rank 0 of 2 · 2 program(s) over several devices" in text
        # the pane is narrower than the combined shape: the cell wraps whole, nothing is cut
        assert "all-reduce (f32[64,32]," in text and "f32[64])" in text
        await press(pilot, "r")
        assert isinstance(app.screen, RanksScreen)
        await settle(pilot)
        text = screen_text(app)
        assert "program #2 differs (collectives)" in text
        await press(pilot, "down", "enter")
        await settle(pilot)
        assert isinstance(app.screen, CollectivesScreen) and app.rank == 1
        await press(pilot, "down")
        await settle(pilot)
        text = screen_text(app)
        assert "tpu-debug · train · rank 1" in text
        assert "all-gather f32[64,32]" in text

    try:
        drive(app, scenario)
    finally:
        session.close()
        group.close()


def test_tensorboard_marks_collectives_and_counts_their_bytes(tmp_path):
    from tpu_debug.tracers.recording.tensorboard_exporter import TensorBoardExporter

    errors: list = []
    exporter = TensorBoardExporter(tmp_path, record_error=lambda where, msg: errors.append((where, msg)))
    exporter.start()
    grads = _collective("all-reduce", "f32[64,32]", 8192, 4, 14, "mm_2")
    loc = ev.SourceLocation(SCRIPT, 30, "<module>")
    exporter.on_event(ev.CollectivesEvent(1, 0.1, "compiled", 1, loc, "g1/inference", None, 4, "", (grads,)))
    for _ in range(3):
        exporter.on_execute_begin("compiled", "g1/inference", ("g1/inference",))
        exporter.on_execute("compiled", "g1/inference", ("g1/inference",), 1e-4)
    exporter.stop()
    assert errors == []

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tpu_debug.tracers.xplane import profile_files
    from xprof.convert import raw_to_tool_data

    (profile,) = profile_files(tmp_path)
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(profile)], "trace_viewer", {})
    spans = [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"]
    (mark,) = [e for e in spans if e["name"] == "collectives graph g1/inference"]
    assert mark["args"]["sent_bytes"] == str(grads.wire_bytes) and mark["args"]["devices"] == "4"
    runs = [e for e in spans if e["name"] == "graph g1/inference"]
    assert [e["args"]["collective_bytes"] for e in runs] == [str(grads.wire_bytes)] * 3
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("tpu_debug/collective_bytes")] == [(0, 3.0 * grads.wire_bytes)]
