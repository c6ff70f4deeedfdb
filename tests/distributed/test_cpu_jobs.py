"""A CPU job runs the same with the `tpu` device registered as without it.

Registering the device renames PyTorch's PrivateUse1 backend, which makes it PyTorch's
accelerator; ``runtime/accelerator.py`` keeps the accelerator CPU until the script uses
the device. The same FSDP2 script (gloo, ``fully_shard`` without a mesh, which builds its
mesh on the accelerator) runs under torchrun with the device registered (``import torch``
loads it) and without (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), both at once, and gives the
same numbers bit for bit: both are PyTorch's CPU kernels and gloo, in the same order.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dist_helpers import DATA, REPO, python_env

SCRIPT = DATA / "cpu_fsdp2.py"


def _launch(out, *args: str, **env: str) -> subprocess.Popen:
    out.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), str(out), *args],
        env=python_env(**env), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_a_cpu_fsdp2_job_runs_as_without_the_tpu_device(tmp_path):
    runs = {"with": _launch(tmp_path / "with", "--tpu-tensor"),
            "without": _launch(tmp_path / "without", TORCH_DEVICE_BACKEND_AUTOLOAD="0")}
    results = {}
    for name, proc in runs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}:\n{output[-6000:]}"
        results[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in range(2):
        mine, ref = results["with"][rank], results["without"][rank]
        assert (mine["accelerator"], mine["mesh"]) == (ref["accelerator"], ref["mesh"]) == ("cpu", "cpu")
        assert mine["losses"] == ref["losses"] and mine["params"] == ref["params"]
        # a tpu tensor given to the gloo group: one line naming the fix, not c10d's own words
        assert mine["tpu_tensor"] == {"type": "CollectiveDeviceError", "text": (
            f"rank {rank}: allreduce got a tpu tensor on a process group of backend 'gloo', which has none for the "
            "tpu device (gloo runs CPU tensors): make the group for tpu tensors with init_process_group() or "
            'init_process_group("tpu_dist") (gloo runs underneath, on host copies), or move the tensors to the CPU '
            "(.cpu()) for this gloo group")}
