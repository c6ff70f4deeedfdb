"""TorchTPU's launchers (runtime/torchtpu/multiprocessing.py, launcher.py, multihost.py): a launch
script written as TorchTPU's examples write one starts the ranks torchrun starts, with the same
launch variables and a working process group; the multi-host wrapper sets the variables
torchrun reads for several nodes, as TorchTPU's own test of it states them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "torchtpu_names" / "scripts"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_DEBUG_", "WORLD_SIZE", "TORCH_TPU_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_launch_script_starts_the_ranks_torchrun_would(tmp_path):
    by_torchrun, by_launcher = tmp_path / "torchrun", tmp_path / "launcher"
    by_torchrun.mkdir()
    by_launcher.mkdir()
    procs = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(SCRIPTS / "rank_worker.py"), str(by_torchrun)], env=_env(), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, str(SCRIPTS / "launch.py"), f"--out={by_launcher}", "--ranks=2"],
                         env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    expected, got = _ranks(by_torchrun), _ranks(by_launcher)
    assert got == expected
    assert [r["RANK"] for r in got] == ["0", "1"] and {r["WORLD_SIZE"] for r in got} == {"2"}
    assert {r["all_reduce"] for r in got} == {3.0}  # 1 + 2 over the two ranks' tpu tensors


def test_handle_main_is_absls_run(monkeypatch):
    from absl import flags
    from torch_tpu._internal.distributed import multiprocessing
    from torch_tpu.shims import g3_multiprocessing

    assert g3_multiprocessing.handle_main is g3_multiprocessing.g3_multiprocessing.handle_main
    assert multiprocessing.handle_main is g3_multiprocessing.handle_main
    if "torchtpu_test_steps" not in flags.FLAGS:
        flags.DEFINE_integer("torchtpu_test_steps", 1, "steps")
    monkeypatch.setattr(sys, "argv", ["launch.py", "--torchtpu_test_steps=3", "extra"])
    seen = []
    try:
        with pytest.raises(SystemExit, match=r"^$") as done:  # absl's run exits with main's return
            multiprocessing.handle_main(lambda argv: seen.append((argv, flags.FLAGS.torchtpu_test_steps)))
    finally:
        flags.FLAGS.unparse_flags()
    assert done.value.code is None and seen == [(["launch.py", "extra"], 3)]
    assert multiprocessing.handle_test_main(lambda a, b=0: a + b, 2, b=3) == 5
    assert multiprocessing.get_context("spawn").get_start_method() == "spawn"


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("TPU_WORKER_HOSTNAMES", "JOB_COMPLETION_INDEX", "TORCH_TPU_SLICEBUILDER_ADDRESSES", "MASTER_ADDR",
                "MASTER_PORT", "NNODES", "NODE_RANK", "TORCH_TPU_BASE_PORT", "TORCH_TPU_DEVICES_PER_HOST"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_the_multi_host_launcher_sets_torchruns_variables(clean_env):
    from torch_tpu._internal.distributed.launchers import multihost_wrapper

    clean_env.setenv("TPU_WORKER_HOSTNAMES", "host1,host2")
    clean_env.setenv("JOB_COMPLETION_INDEX", "1")
    multihost_wrapper.prepare_tpu_environment()
    assert (os.environ["NNODES"], os.environ["NODE_RANK"]) == ("2", "1")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("host1", "29500")
    assert os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",") == [
        f"host{h}:{8070 + i}" for h in (1, 2) for i in range(8)]
    # a rendezvous the job set stays; the ports and devices per host follow TorchTPU's variables
    clean_env.setenv("MASTER_ADDR", "elsewhere")
    clean_env.setenv("TORCH_TPU_BASE_PORT", "9000")
    clean_env.setenv("TORCH_TPU_DEVICES_PER_HOST", "2")
    clean_env.delenv("TORCH_TPU_SLICEBUILDER_ADDRESSES")
    multihost_wrapper.prepare_tpu_environment()
    assert os.environ["MASTER_ADDR"] == "elsewhere"
    assert os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "host1:9000,host1:9001,host2:9000,host2:9001"
    clean_env.delenv("TPU_WORKER_HOSTNAMES")
    with pytest.raises(ValueError, match=r"^No TPU_WORKER_HOSTNAMES found\."):
        multihost_wrapper.prepare_tpu_environment()
    clean_env.setenv("TPU_WORKER_HOSTNAMES", "h1")
    clean_env.delenv("JOB_COMPLETION_INDEX")
    with pytest.raises(ValueError, match=r"^No JOB_COMPLETION_INDEX found in environment\."):
        multihost_wrapper.prepare_tpu_environment()


def test_the_multi_host_launcher_prints_the_environment_for_eval(clean_env, capsys):
    # what `eval $(python3 -m torch_tpu._internal.distributed.launchers.multihost_wrapper)` reads
    # in TorchTPU's multi-host launch script; runpy takes the module's code from the finder, as -m does
    import runpy

    clean_env.setenv("TPU_WORKER_HOSTNAMES", "host1,host2")
    clean_env.setenv("JOB_COMPLETION_INDEX", "0")
    clean_env.setenv("TORCH_TPU_DEVICES_PER_HOST", "1")
    # runpy runs the module afresh, as a new interpreter would: no copy an earlier test imported
    clean_env.delitem(sys.modules, "torch_tpu._internal.distributed.launchers.multihost_wrapper", raising=False)
    with pytest.raises(SystemExit, match="^0$"):
        runpy.run_module("torch_tpu._internal.distributed.launchers.multihost_wrapper", run_name="__main__")
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.split())
    assert lines == {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "host1", "MASTER_PORT": "29500",
                     "TORCH_TPU_SLICEBUILDER_ADDRESSES": "host1:8070,host2:8070"}


def test_tpu_topology_answers_as_torchtpu_on_this_host(monkeypatch):
    # TorchTPU's distributed tutorial prints get_tpu_topology(): (topology, chips) from the PCI
    # scan, (None, 0) where no TPU chip is attached, as on this CPU host
    from torch_tpu._internal.distributed import tpu_topology
    from tpu_debug.runtime.torchtpu import hardware

    assert tpu_topology.get_tpu_topology() == (None, 0)
    with pytest.raises(ValueError, match=r"^expected world_size to be less than or equal to detected TPUs 0, got 2\."):
        tpu_topology.get_tpu_topology(world_size=2)
    # a v5e host with 8 chips, and a v7 host with 8 devices, as TorchTPU's slices name them
    monkeypatch.setattr(hardware, "get_tpu_device_count", lambda: 8)
    monkeypatch.setattr(hardware, "get_tpu_version", lambda: hardware.TpuVersion.V5E)
    assert tpu_topology.get_tpu_topology() == ("2,2,2", 8)
    assert tpu_topology.get_tpu_topology(world_size=4) == ("2,2,1", 4)
    with pytest.raises(RuntimeError, match=r"^No TPU topology found for count: 3\."):
        tpu_topology.get_tpu_topology(world_size=3)
    monkeypatch.setattr(hardware, "get_tpu_version", lambda: hardware.TpuVersion.V7)
    assert tpu_topology.get_tpu_topology() == ("2,2,1,2", 8)
    assert tpu_topology.get_tpu_topology(world_size=2) == ("1,1,1,2", 2)
    # a generation TorchTPU's launcher has no slices for counts as no chip
    monkeypatch.setattr(hardware, "get_tpu_version", lambda: hardware.TpuVersion.V4)
    assert tpu_topology.get_tpu_topology() == (None, 0)
