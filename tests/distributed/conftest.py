"""Distributed tests run their device meshes in processes of their own.

JAX fixes the number of CPU devices when its backend starts (XLA_FLAGS'
``--xla_force_host_platform_device_count``), once per process, and the rest of
the suite runs on one device. So everything that needs a mesh runs in a
subprocess started with the device count it needs: the single-process SPMD
cases once per test session (``spmd``: shared by the xdist workers through a
file lock), the multi-process runs through ``tpu-debug run --nproc``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch.distributed as dist
from dist_helpers import DATA, run_python
from filelock import FileLock


def _spmd_results(out: Path) -> dict:
    results = out / "results.json"
    proc = run_python([str(DATA / "spmd_cases.py"), str(results), str(out / "runs")], devices=8)
    if proc.returncode != 0 or not results.exists():
        raise RuntimeError(f"spmd_cases.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return json.loads(results.read_text())


@pytest.fixture(scope="session")
def spmd(tmp_path_factory, worker_id):
    """The results of tests/distributed/data/spmd_cases.py (8 simulated devices), run once."""
    if worker_id == "master":
        return _spmd_results(tmp_path_factory.mktemp("spmd"))
    shared = tmp_path_factory.getbasetemp().parent / "spmd"
    with FileLock(str(shared) + ".lock"):
        results = shared / "results.json"
        if results.is_file():
            return json.loads(results.read_text())
        shared.mkdir(exist_ok=True)
        return _spmd_results(shared)


@pytest.fixture
def one_rank(tmp_path):
    """A `tpu` process group of one rank in this process, by explicit backend name ``tpu``."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("tpu", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
