"""PyTorch's Flight Recorder: dumps of a real gloo job read by ``tpu-debug import-fr``, and the
`tpu` process group's own dumps written on demand (``SIGUSR1``, the named pipe).

The `tpu` group's dumps on an error and at exit, and ``torchfrtrace`` reading them, are
checked with the live check's plants in test_desync_live.py.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

import pytest
from dist_helpers import DATA, REPO, python_env

JOB = DATA / "fr_gloo_job.py"


def _line(text: str) -> int:
    (line,) = [i for i, src in enumerate(JOB.read_text().splitlines(), 1) if text in src]
    return line


def test_a_gloo_jobs_dumps_are_read_into_the_report_and_the_tui(tmp_path):
    from tpu_debug.cli import main as cli
    from tpu_debug.ranks import find_group
    from tpu_debug.report.ranks import c10d_data, print_rank_report

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(JOB)],
        env=python_env(TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(dumps / "rank_"),
                       TORCH_DEVICE_BACKEND_AUTOLOAD="0"),  # PyTorch alone: no tpu device
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert cli(["import-fr", str(dumps), "--logdir", str(tmp_path / "runs")]) == 0
    group = find_group(None, tmp_path / "runs")
    with group:
        assert group.status() == "finished" and sorted(group.rank_dirs()) == [0, 1]
        data = c10d_data(group.sessions())
        # gloo's dumps describe no group: the default group's members are the ranks that dumped
        (seq,) = data["sequence"]
        assert (seq["group"], seq["ranks"], seq["total"], seq["first_difference"]) == ("0", [0, 1], 6, None)
        first = seq["rows"][0]["calls"]
        assert [(c["call"]["op"], c["call"]["shapes"], c["call"]["location"]["line"]) for c in first] == [
            ("allreduce", ["[4]"], _line("the ranks meet here"))] * 2
        assert first[1]["call"]["arrived"] > 0 and first[0]["call"]["arrived"] == 0
        assert data["desyncs"] == []
        (straggler,) = data["stragglers"]
        assert (straggler["group"], straggler["rank"], straggler["of"]) == ("0", 1, 6)
        out = __import__("io").StringIO()
        print_rank_report(group, file=out, terminal=False, width=200)
        assert "straggler: rank 1 entered last at " in out.getvalue()
        # the TUI's ranks view reads the same
        from tpu_debug.tui.screens.ranks import load_ranks

        _, _, c10d = load_ranks(group)
        assert [st["rank"] for st in c10d["stragglers"]] == [1]


def test_a_dump_holding_objects_is_refused(tmp_path):
    from tpu_debug.tracers.flight_recorder import DumpError, read_dump

    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}, "extra": threading.Lock}))
    with pytest.raises(DumpError, match=r"a Flight Recorder dump holds plain data; this file asks for "
                                        r"_thread\.(allocate_lock|lock)"):
        read_dump(path, 0)


def test_the_flight_recorder_dumps_on_sigusr1_and_on_its_pipe(tmp_path, monkeypatch):
    from tpu_debug.runtime.distributed import flight_recorder as fr
    from tpu_debug.tracers.flight_recorder import read_dump

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
