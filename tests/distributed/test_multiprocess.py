"""Multi-process runs: `tpu-debug run --nproc 2 --devices 2`, two ranks of two CPU devices each.

Each rank is a process of its own (jax.distributed on localhost, collectives over
gloo) that records its own run under one parent directory; the parent's report
puts the ranks side by side.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from dist_helpers import DATA, REPO
from torch import nn

from tpu_debug.cli import main
from tpu_debug.ranks import find_group, is_group

PITFALL = REPO / "examples" / "pitfalls" / "rank_divergence.py"


def _shown(path: Path) -> str:
    """How the ranks show ``path``: relative to their working directory (this one) when under it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def _line(path: Path, text: str) -> int:
    (line,) = [i for i, src in enumerate(path.read_text().splitlines(), 1) if text in src]
    return line


class _Launch:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _nproc(tmp_path: Path, capsys, script: Path, *args: str) -> _Launch:
    """``tpu-debug run --nproc 2 --devices 2 script args``, the launcher in this process (the ranks
    are processes of their own; they are told everything through the environment)."""
    capsys.readouterr()
    code = main(["run", "--logdir", str(tmp_path / "runs"), "--nproc", "2", "--devices", "2", str(script), *args])
    out = capsys.readouterr()
    return _Launch(code, out.out, out.err)


def _cpu_training(data: dict) -> tuple[list[float], dict]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model.load_state_dict({k: torch.tensor(v) for k, v in data["initial"].items()})
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, y in data["batches"]:
        loss = F.cross_entropy(model(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def test_data_parallel_over_two_processes(tmp_path, capsys):
    out = tmp_path / "result.json"
    proc = _nproc(tmp_path, capsys, DATA / "dp_mlp.py", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    losses, weights = _cpu_training(data)
    # the batch is split over 4 devices in 2 processes: sums in another order, float32 ULPs apart
    torch.testing.assert_close(torch.tensor(data["losses"]), torch.tensor(losses))
    for name, value in weights.items():
        torch.testing.assert_close(torch.tensor(data["weights"][name]), value)

    group = find_group(None, tmp_path / "runs")
    assert group is not None and is_group(group.path)
    assert group.info.exit_status == (0, 0) and group.info.status == "finished"
    sessions = group.sessions()
    assert [r for r, _ in sessions] == [0, 1]
    for rank, session in sessions:
        m = session.metadata()
        assert m.status == "finished" and m.device_count == 4
        (program,) = [e for e in session.events("collectives") if e.name.endswith("/train_step")][:1]
        assert {c.group_size for c in program.collectives} == {4}  # every device of both processes
    group.close()
    # the launcher's report: the ranks side by side, and that they agreed
    assert "[rank 0]" in proc.stderr and "[rank 1]" in proc.stderr
    report = proc.stderr[proc.stderr.index("tpu_debug report: dp_mlp (2 ranks)"):]
    assert "rank 0" in report and "rank 1" in report
    assert "every rank compiled the same 2 multi-device program(s)" in report
    # and the same from the reading verb, given the parent directory
    capsys.readouterr()
    assert main(["report", str(group.path), "--plain"]) == 0
    assert "tpu_debug report: dp_mlp (2 ranks)" in capsys.readouterr().out


def test_a_rank_dependent_branch_stops_both_ranks_before_they_hang(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_RANK_TIMEOUT", "60")
    proc = _nproc(tmp_path, capsys, PITFALL)
    assert proc.returncode == 1, proc.stderr[-3000:]
    branch = _line(PITFALL, "model[0].weight.pow(2)")
    for rank in (0, 1):
        assert f"[rank {rank}] RankDivergenceError: ranks {rank} and " \
               f"{1 - rank} are about to run different programs together at multi-process call #1" in proc.stderr
    assert f"rank 1 runs aten.pow.Tensor_Scalar at {_shown(PITFALL)}:{branch}" in proc.stderr
    # each rank shows the script's frame and the message, not the runtime's frames between them
    assert "tpu_debug/runtime" not in proc.stderr and "/runtime/" not in proc.stderr
    group = find_group(None, tmp_path / "runs")
    assert group.info.exit_status == (1, 1)
    for _, session in group.sessions():
        assert session.metadata().status == "failed"
        assert session.metadata().error.startswith("RankDivergenceError: ")
    group.close()
    report = proc.stderr[proc.stderr.index("Rank agreement"):]
    assert report.startswith("Rank agreement\nrank 0 stopped: RankDivergenceError")
    assert "compiled programs: program #1 differs (program)" in report


def test_a_rank_that_stops_early_is_named_by_the_rank_waiting_for_it(tmp_path, capsys, monkeypatch):
    script = DATA / "early_exit.py"
    monkeypatch.setenv("TPU_DEBUG_RANK_TIMEOUT", "5")
    proc = _nproc(tmp_path, capsys, script)
    assert proc.returncode == 1, proc.stderr[-3000:]
    call = _line(script, "step(dist.mark_sharding(")
    assert ("[rank 0] RankTimeoutError: rank 1 did not reach "
            "multi-process program call #2 within 5 s.") in proc.stderr
    assert "rank 1: its last multi-process program call was #1: g1/train_step of step " in proc.stderr
    assert f"called at {_shown(script)}:{call}" in proc.stderr
    group = find_group(None, tmp_path / "runs")
    assert group.info.exit_status == (1, 0)
    group.close()


def test_an_eager_op_only_one_rank_runs_stops_both_ranks(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_RANK_TIMEOUT", "60")
    script = DATA / "eager_divergence.py"
    proc = _nproc(tmp_path, capsys, script)
    assert proc.returncode == 1, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] RankDivergenceError: ranks {rank} and " \
               f"{1 - rank} are about to run different programs together at multi-process call #2" in proc.stderr
    # each side names its op and the line calling it: the first op both ran (#1) agreed
    assert f"rank 1: eager op aten::add_.Tensor, called at {_shown(script)}:{_line(script, 'w.add_(1)')}" \
        in proc.stderr
    assert f"rank 0: eager op aten::sub_.Tensor, called at {_shown(script)}:{_line(script, 'w.sub_(1)')}" \
        in proc.stderr
    assert "Fix: make every rank run the same ops on tensors that span processes" in proc.stderr
