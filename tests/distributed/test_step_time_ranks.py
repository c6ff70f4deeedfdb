"""A two-rank job with one slow rank: the fast rank's steps are collective-bound, and the part
holds the time its own clock measured around each all_reduce (see tests/tracers/test_step_time.py
for how the planted programs and the assertions are made)."""

from __future__ import annotations

import json
import statistics
import sys

import warm_python
from dist_helpers import DATA, REPO, python_env
from tpu_debug.tracers.advisor import advise
from tpu_debug.tracers.advisor.registry import RULES
from tpu_debug.tracers.reading.step_time import split_step

from tpu_debug.ranks import open_group

SCRIPT = DATA / "slow_rank.py"
SLOW = 0.2  # slow_rank.py's sleep


def test_the_rank_waiting_for_a_slow_one_is_collective_bound(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    proc = warm_python.run(
        [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--logdir", str(tmp_path / "runs"),
         "--nproc", "2", str(SCRIPT), str(out)],
        env=python_env(), cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    clocks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    (parent,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    group = open_group(parent)
    try:
        sessions = dict(group.sessions())
        fast, slow = sessions[0], sessions[1]
        steps = fast.steps()
        phases = fast.steps.phases()
        parts = [s.collective_seconds for s in steps]
        mine = clocks[0]["clocks"]
        # the collective's time is measured inside the all_reduce the rank's own clock surrounds
        assert len(parts) == len(mine) and all(0 < p <= c for p, c in zip(parts, mine))
        steady = [(p, c) for p, c, phase in zip(parts, mine, phases) if phase == "steady"]
        assert len(steady) >= 3
        assert statistics.median(p / c for p, c in steady) >= 0.9
        # rank 0 waits about as long as rank 1 sleeps: the slow rank's extra work is its wait
        assert statistics.median(p for p, _ in steady) >= 0.8 * SLOW
        v = fast.steps.verdict()
        assert (v.part, v.bound) == ("collective", "collective-bound")
        assert all(not split_step(s).overlapped for s in steps)
        # the straggler rule names the rank it waited for, with about its sleep at each steady step
        # (the rule leaves out the first call at each line, warm-up); it is the answer, so the
        # step_bound rule does not say it a second time
        (straggler,) = [f for f in fast.findings() if f.kind == "collective_straggler"]
        assert "rank 1" in straggler.title and straggler.cost_seconds >= 0.8 * SLOW * len(steady)
        assert not [f for f in fast.findings() if f.kind == "step_bound"]
        # where no straggler is known (a job whose arrivals were not recorded), step_bound names it
        monkeypatch.delitem(RULES, "collective_straggler")
        (finding,) = advise(fast, kinds=["step_bound"]).findings
        assert finding.cause == "collective" and "slower rank" in finding.fix
        assert finding.evidence.location.file.endswith("slow_rank.py")
        # the slow rank's own time is its Python (the sleep): host-bound, which is no finding
        assert slow.steps.verdict().part == "host"
        assert all(s >= SLOW for s in clocks[1]["sleeps"])
        assert not [f for f in slow.findings() if f.kind == "step_bound"]
    finally:
        group.close()
