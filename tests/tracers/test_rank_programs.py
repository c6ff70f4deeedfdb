"""Ranks whose compiled programs differ, named with the first difference
(``tracers/reading/rank_programs.py``), on two ranks' runs written event by event: both compile
a training step's forward and backward; rank 1's third batch is smaller, so it alone
compiles the forward again (a recompile, with its shape difference) at step 2.
"""

from __future__ import annotations

from pathlib import Path

from tpu_debug.tracers import events as ev
from tpu_debug.tracers.reading.rank_programs import compiled_programs, first_program_difference
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter

import tpu_debug

SCRIPT = "/work/project/train.py"
META = {
    "tpu_debug_version": "0.1.0", "torch_version": "2.13.0", "jax_version": "0.10.2", "jaxlib_version": "0.10.2",
    "python_version": "3.11.7", "platform": "cpu", "device_kind": "cpu", "device_count": 1,
    "argv": ["train.py"], "command": ["python", "train.py"], "start_time": "2026-01-31T12:00:00.000+00:00",
    "options": {}, "cwd": "/work/project",
}


def _run(path: Path, rank: int, *, recompile: bool) -> tpu_debug.Session:
    path.mkdir()
    writer = RunWriter(path / DB_NAME, dict(META, name=f"rank{rank}"))
    loc = ev.SourceLocation(SCRIPT, 30, "train")
    # no HLO recorded (no program hashes): the graphs' names and input signatures tell them apart
    compiles = [(0.1, "forward", "f32[8,16]"), (0.2, "backward", "f32[8,16]")]
    if recompile:
        compiles.append((2.1, "forward", "f32[7,16]"))
    for ts, name, sig in compiles:
        diffs = (ev.KeyDiff("shape", "f32[8,16]", "f32[7,16]", 0, "x"),) if sig == "f32[7,16]" else ()
        writer.put(ev.CompileEvent(writer.new_id(), ts, "compiled", 1, loc, name, sig, (), 0.5, diffs=diffs))
    for index in range(3):
        writer.put(ev.StepEvent(writer.new_id(), float(index), None, 1, None, index, "optimizer",
                                float(index) + 0.9, 0.9))
    writer.close({"status": "finished", "exit_status": 0, "end_time": "2026-01-31T12:00:03.000+00:00",
                  "duration": 3.0})
    return tpu_debug.open_run(path)


def test_a_rank_that_compiles_another_program_is_named_with_the_first_difference(tmp_path):
    runs = {r: _run(tmp_path / f"rank{r}", r, recompile=r == 1) for r in (0, 1)}
    try:
        programs = {r: compiled_programs(s) for r, s in runs.items()}
        assert [p.step for p in programs[1]] == [0, 0, 2]
        diff = first_program_difference(programs)
        assert diff is not None and diff.index == 3
        assert diff.render() == (
            "the ranks' compiled programs differ at compile #3: rank 0: no such compile (it compiled fewer "
            "programs); rank 1: forward (f32[7,16]) at step 2, a recompile (arg 0 'x': f32[8,16] -> "
            f"f32[7,16]) at {SCRIPT}:30 in train"
        )
        # ranks that compiled the same programs, in the same order, agree
        assert first_program_difference({0: programs[0], 1: programs[1][:2]}) is None
    finally:
        for s in runs.values():
            s.close()
