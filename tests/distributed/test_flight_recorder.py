"""PyTorch's Flight Recorder: dumps read by ``tpu-debug import-fr`` (written here as gloo
writes them, with a planted slow rank), and the `tpu` process group's own dumps written on
demand (``SIGUSR1``, the named pipe).

A real gloo job's dumps are imported in test_torch_distributed.py (its gloo reference run
keeps the Flight Recorder); the `tpu` group's dumps on an error and at exit, and
``torchfrtrace`` reading them, are checked with the live check's plants in
test_desync_live.py.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import threading

import pytest


def _gloo_entry(record: int, seq: int, created_ns: int, line: int) -> dict:
    """An entry as PyTorch's gloo group writes it (torch 2.13): scheduled and retired, no times
    but its creation, frames innermost first from the c10d function down to the script."""
    return {
        "record_id": record, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": "gloo:all_reduce", "time_created_ns": created_ns,
        "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
        "state": "scheduled", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": True, "timeout_ms": 1800000, "is_p2p": False, "thread_id": "1", "thread_name": "python",
        "frames": [{"name": "all_reduce", "filename": "/usr/lib/python3/site-packages/torch/distributed/c10d.py",
                    "line": 3245}, {"name": "<module>", "filename": "/work/job/train.py", "line": line}],
    }


def test_dumps_are_read_into_a_run_with_each_ranks_arrival_and_the_straggler(tmp_path):
    from tpu_debug.cli import main as cli
    from tpu_debug.ranks import find_group
    from tpu_debug.report.ranks import c10d_data, print_rank_report

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    t0 = 1_800_000_000_000_000_000
    for rank in (0, 1):
        # rank 1 reaches each of 5 all-reduces 50 ms after rank 0; gloo's dumps describe no group
        late = 50_000_000 * rank
        entries = [_gloo_entry(i, i + 1, t0 + i * 100_000_000 + late, 12) for i in range(5)]
        (dumps / f"rank_{rank}").write_bytes(pickle.dumps({
            "version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}, "pg_status": {},
            "comm_lib_version": "", "entries": entries}))
    assert cli(["import-fr", str(dumps), "--logdir", str(tmp_path / "runs")]) == 0
    with find_group(None, tmp_path / "runs") as group:
        assert group.status() == "finished" and sorted(group.rank_dirs()) == [0, 1]
        data = c10d_data(group.sessions())
        (seq,) = data["sequence"]
        assert (seq["group"], seq["ranks"], seq["total"], seq["first_difference"]) == ("0", [0, 1], 5, None)
        calls = [c["call"] for c in seq["rows"][0]["calls"]]
        assert [(c["op"], c["shapes"], c["dtype"], c["location"]["file"], c["location"]["line"]) for c in calls] == [
            ("allreduce", ["[4]"], "float32", "/work/job/train.py", 12)] * 2
        # entry times are the dumps' own, put on one clock by adding each run's origin (wall-clock
        # seconds, ~1.8e9, where a float64 is spaced 2.4e-7 s apart): equal to that spacing
        assert [c["arrived"] for c in calls] == [0.0, pytest.approx(0.05, abs=1e-6)]
        # no completion times in gloo's dumps: the calls are untimed, not "never returned"
        assert [c["timed"] for c in calls] == [False, False]
        (straggler,) = data["stragglers"]
        # the first all-reduce at the line is warm-up, left out: rank 1 last at the other 4
        assert (straggler["group"], straggler["rank"], straggler["last"], straggler["of"]) == ("0", 1, 4, 4)
        assert straggler["late"] == pytest.approx(0.05, abs=1e-6)
        out = io.StringIO()
        print_rank_report(group, file=out, terminal=False, width=200)
        assert "straggler: rank 1 entered last at 4 of 4 collectives of group 0, 50.00 ms after" in out.getvalue()
        # the TUI's ranks view reads the same
        from tpu_debug.tui.screens.ranks import load_ranks

        _, _, c10d = load_ranks(group)
        assert [st["rank"] for st in c10d["stragglers"]] == [1]


def test_a_dump_holding_objects_is_refused(tmp_path):
    from tpu_debug.tracers.recording.flight_recorder_import import DumpError, read_dump

    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}, "extra": threading.Lock}))
    with pytest.raises(DumpError, match=r"a Flight Recorder dump holds plain data; this file asks for "
                                        r"_thread\.(allocate_lock|lock)"):
        read_dump(path, 0)


def test_the_flight_recorder_dumps_on_sigusr1_and_on_its_pipe(tmp_path, monkeypatch):
    from tpu_debug.runtime.distributed import flight_recorder as fr
    from tpu_debug.tracers.recording.flight_recorder_import import read_dump

    monkeypatch.setattr(fr, "_configured", False)
    monkeypatch.setattr(fr, "recorder", None)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        recorder = fr.configure(3, {"TORCH_FR_BUFFER_SIZE": "2", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "d" / "r_"),
                                    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_")})
        for seq in (1, 2, 3):  # a ring of 2: the oldest goes
            entry = recorder.record(("0", "default_pg", (0, 3)), "all_reduce", (seq, 0, False), ([[4]], [[4]]),
                                    (["Float"], ["Float"]), 1000)
            recorder.completed(entry)
        os.kill(os.getpid(), signal.SIGUSR1)
        dump = read_dump(tmp_path / "d" / "r_3", 3)
        assert [e["collective_seq_id"] for e in dump.entries] == [2, 3]
        assert dump.groups == {"0": ("default_pg", (0, 3))}
        (tmp_path / "d" / "r_3").unlink()
        with open(tmp_path / "pipe_3.pipe", "wb") as pipe:  # what `echo 1 > pipe` does
            pipe.write(b"1")
        for _ in range(1200):  # the pipe's thread writes it: wait for the file (a minute at most)
            if len(recorder.dumped) == 2:
                break
            threading.Event().wait(0.05)
        assert recorder.dumped == [tmp_path / "d" / "r_3"] * 2
        assert [e["state"] for e in read_dump(tmp_path / "d" / "r_3", 3).entries] == ["completed"] * 2
    finally:
        signal.signal(signal.SIGUSR1, previous)
