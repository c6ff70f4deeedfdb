"""A CPU job runs the same with the `tpu` device registered as without it.

Registering the device renames PyTorch's PrivateUse1 backend, which makes it PyTorch's
accelerator; ``runtime/accelerator.py`` keeps the accelerator CPU until the script uses
the device. The FSDP2 script (gloo, ``fully_shard`` without a mesh, which builds its mesh
on the accelerator) runs under torchrun with the device registered (``import torch``
loads it). The default tier compares it with the same training in this process, without
processes or collectives: FSDP2 averages the ranks' gradients, which is the gradient of
the mean of the ranks' losses. The slow tier also runs it without the device
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) and compares bit for bit: both are PyTorch's CPU
kernels and gloo, in the same order.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from dist_helpers import DATA, REPO, python_env

SCRIPT = DATA / "cpu_fsdp2.py"


def _launch(out, *args: str, **env: str) -> subprocess.Popen:
    out.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), str(out), *args],
        env=python_env(**env), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _results(procs: dict[str, subprocess.Popen], base) -> dict[str, list[dict]]:
    results = {}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}:\n{output[-6000:]}"
        results[name] = [json.loads((base / name / f"rank{r}.json").read_text()) for r in range(2)]
    return results


def _in_one_process() -> list[dict]:
    """The script's training without processes: the mean of both ranks' losses, each rank's
    batch as the script draws it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(6, 8, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    losses: list[list[float]] = [[], []]
    for _ in range(2):
        per_rank = [model(x).square().mean() for x in xs]
        (sum(per_rank) / 2).backward()
        opt.step()
        opt.zero_grad()
        for r, loss in enumerate(per_rank):
            losses[r].append(loss.item())
    return [{"losses": losses[r], "params": [p.tolist() for p in model.parameters()]} for r in range(2)]


def test_a_cpu_fsdp2_job_keeps_the_cpu_accelerator_and_trains_as_plain_pytorch(tmp_path):
    (ranks,) = _results({"with": _launch(tmp_path / "with", "--tpu-tensor")}, tmp_path).values()
    reference = _in_one_process()
    for rank, mine in enumerate(ranks):
        assert (mine["accelerator"], mine["mesh"]) == ("cpu", "cpu")
        # float32 rounding: gloo sums the two ranks' gradients and divides, autograd halves each
        torch.testing.assert_close(torch.tensor(mine["losses"]), torch.tensor(reference[rank]["losses"]),
                                   rtol=1e-5, atol=1e-7)
        for got, want in zip(mine["params"], reference[rank]["params"], strict=True):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-7)
        # a tpu tensor given to the gloo group: one line naming the fix, not c10d's own words
        assert mine["tpu_tensor"] == {"type": "CollectiveDeviceError", "text": (
            f"rank {rank}: allreduce got a tpu tensor on a process group of backend 'gloo', which has none for the "
            "tpu device (gloo runs CPU tensors): make the group for tpu tensors with init_process_group() or "
            'init_process_group("tpu_dist") (gloo runs underneath, on host copies), or move the tensors to the CPU '
            "(.cpu()) for this gloo group")}


@pytest.mark.slow
def test_a_cpu_fsdp2_job_runs_as_without_the_tpu_device(tmp_path):
    results = _results({"with": _launch(tmp_path / "with"),
                        "without": _launch(tmp_path / "without", TORCH_DEVICE_BACKEND_AUTOLOAD="0")}, tmp_path)
    for mine, ref in zip(results["with"], results["without"], strict=True):
        assert (mine["accelerator"], mine["mesh"]) == (ref["accelerator"], ref["mesh"]) == ("cpu", "cpu")
        assert mine["losses"] == ref["losses"] and mine["params"] == ref["params"]
