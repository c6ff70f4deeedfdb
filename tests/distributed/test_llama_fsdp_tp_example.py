"""examples/distributed/train_llama_fsdp_tp.py under torchrun: FSDP2 + tensor parallelism of a
small Llama on `tpu` trains as PyTorch's CPU with gloo does.

Four ranks make a 2 x 2 mesh, so both FSDP2 (sharding over "dp", with its all-gathers
and reduce-scatters) and the tensor parallelism (over "tp") run; two ranks (dp=1, tp=2)
run the tensor parallelism, with FSDP2 over a one-rank dimension. The reference is the
same script with ``--device cpu``: the collectives are gloo's on both sides (the `tpu`
backend runs gloo on host copies), but each rank's forward and backward run as XLA CPU
kernels on `tpu` and as PyTorch's CPU kernels in the reference, which sum a matmul's
products in different orders: float32 results a few ulps apart per step. Plain SGD
keeps those differences that small in the weights (an update is lr times the gradient;
Adam's normalized update would turn a rounding difference in a near-zero gradient into
one of order lr).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import warm_python
from dist_helpers import REPO, python_env

EXAMPLE = REPO / "examples" / "distributed" / "train_llama_fsdp_tp.py"
STEPS = 3


def _train(tmp_path, device: str, nproc: int) -> dict:
    out = tmp_path / f"{device}.pt"
    # torchrun's agent forked from a warm interpreter (its workers are its own fresh processes)
    proc = warm_python.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), str(EXAMPLE),
         "--steps", str(STEPS), "--device", device, "--save", str(out)],
        env=python_env(), cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"step {STEPS - 1}: loss" in proc.stdout
    return torch.load(out)


@pytest.mark.parametrize("nproc", [
    pytest.param(2, id="dp1xtp2"),
    # the full 2-D mesh: about 80 s on a loaded 2-core machine, so in the slow tier
    pytest.param(4, id="dp2xtp2", marks=pytest.mark.slow),
])
def test_fsdp_tp_llama_on_tpu_trains_as_cpu_gloo(tmp_path, nproc):
    tpu = _train(tmp_path, "tpu", nproc)
    cpu = _train(tmp_path, "cpu", nproc)
    assert len(tpu["losses"]) == STEPS
    # losses ~5.7: a few float32 ulps (6e-7 each) of difference
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-5)
    assert tpu["params"].keys() == cpu["params"].keys()
    for name, p in tpu["params"].items():
        # weights of order 1 after 3 SGD steps of lr 0.1: each differs by lr x (ulps of a gradient)
        torch.testing.assert_close(p, cpu["params"][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_every_rank_of_the_example_traced_under_torchrun(tmp_path):
    import json

    logdir = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "-m", "tpu_debug", "run",
         "--logdir", str(logdir), str(EXAMPLE), "--steps", "2"],
        env=python_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = subprocess.run([sys.executable, "-m", "tpu_debug", "report", "--json", "--logdir", str(logdir)],
                            env=python_env(), capture_output=True, text=True, timeout=300, check=False)
    data = json.loads(report.stdout)
    assert (data["nproc"], data["launcher"], data["status"], data["missing"]) == (4, "torchrun", "finished", [])
    c10d = data["c10d"]
    assert c10d["desyncs"] == []  # a correct script: every group's ranks made the same calls
    for rank in c10d["per_rank"]:
        by_members = {tuple(g["ranks"]): {o["op"] for o in g["ops"]} for g in rank["groups"]}
        r = rank["rank"]
        dp_group = tuple(sorted({r % 2, r % 2 + 2}))  # the mesh is (dp, tp): dp peers are 2 apart
        tp_group = tuple(sorted({r - r % 2, r - r % 2 + 1}))
        # FSDP2 gathers the parameters and reduce-scatters the gradients over dp; the row-wise
        # projections all-reduce their partial products over tp
        assert {"all_gather_single", "reduce_scatter_single"} <= by_members[dp_group]
        assert "allreduce" in by_members[tp_group]
        assert by_members[(0, 1, 2, 3)] == {"allreduce"}  # the script's loss average
