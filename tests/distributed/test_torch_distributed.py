"""torch.distributed on the `tpu` device: the c10d backends ``tpu``/``tpu_dist``, DDP, FSDP2, DTensor.

The reference is PyTorch itself: ``data/torch_dist_cases.py`` runs the same two-rank
script on `tpu` with ``init_process_group()`` (no backend: ``tpu_dist``) and on CPU with
``init_process_group("gloo")``, and every result is compared.

Collectives are compared exactly: their inputs are small integers (exact in every dtype
and every reduction order), and the ``tpu`` backend runs gloo's own collective on host
copies, so the two runs reduce the same numbers in the same order. Training is compared
within float32 rounding: the collectives are still gloo's on both sides, but each rank's
forward and backward run as XLA CPU kernels on `tpu` and as PyTorch's CPU kernels in the
reference, which sum the products of a matmul in different orders (a few ulps per step).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import (
    DATA,
    REPO,
    assert_exactly_gloos,
    assert_trained_as_gloo,
    python_env,
    ranks_on_both_devices,
)
from tpu_debug.runtime.distributed import c10d

CASES = DATA / "torch_dist_cases.py"
EXAMPLE = REPO / "examples" / "distributed" / "ddp_train.py"
COLLECTIVES = [
    *(f"all_reduce.{op}.{dtype}" for dtype in ("torch.float32", "torch.bfloat16")
      for op in ("sum", "product", "min", "max")),
    *(f"all_reduce.{op}.{dtype}" for dtype in ("torch.int64", "torch.int32")
      for op in ("sum", "product", "min", "max", "band", "bor", "bxor")),
    "all_reduce.avg.float32", "all_reduce.view", "async.wait",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
    "all_to_all_single", "all_to_all_single.uneven", "send_recv", "ring.isend_irecv", "ring.batch_isend_irecv",
    "reduce", "gather", "scatter", "all_to_all",
    "new_group.pair", "new_group.alone",
    "functional.all_reduce", "functional.all_gather_tensor", "functional.reduce_scatter_tensor",
    "dtensor.local", "dtensor.full", "dtensor.sum",
]
TRAINING = ["ddp", "ddp_compiled", "fsdp", "tp"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """Each device's results, per rank: the `tpu` run and the gloo reference run side by side
    (and, under ``fr_dumps``, the gloo run's Flight Recorder dumps)."""
    base = tmp_path_factory.mktemp("torch_dist")
    (base / "fr").mkdir()
    # the gloo run keeps PyTorch's Flight Recorder, whose dumps tpu-debug import-fr reads
    fr = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(base / "fr" / "rank_")}
    ranks = ranks_on_both_devices([sys.executable, str(CASES)], base, env={"cpu": fr})
    return {**ranks, "fr_dumps": base / "fr"}


def test_init_process_group_with_no_backend_takes_tpu_dist(ranks):
    # PyTorch names the default group's backend "undefined" when none was given; it then
    # looked up the accelerator's default, tpu_dist, and the collectives above ran through it
    assert [r["backend"] for r in ranks["tpu"]] == ["undefined", "undefined"]
    assert [r["backend"] for r in ranks["cpu"]] == ["gloo", "gloo"]


@pytest.mark.parametrize("case", COLLECTIVES)
def test_collective_equals_gloo(ranks, case):
    assert_exactly_gloos(ranks, case)


@pytest.mark.parametrize("what", TRAINING)
def test_training_equals_gloo(ranks, what):
    assert_trained_as_gloo(ranks, what)


def test_a_pipeline_schedule_trains_as_on_gloo(ranks):
    # each rank holds its own stage, so only each rank's against its gloo twin; the tolerance
    # is float32 rounding, as for the other training (XLA's CPU matmuls sum in another order)
    for rank in range(2):
        mine, ref = ranks["tpu"][rank], ranks["cpu"][rank]
        torch.testing.assert_close(mine["pipeline.losses"], ref["pipeline.losses"], rtol=1e-5, atol=1e-6)
        for got, want in zip(mine["pipeline.params"], ref["pipeline.params"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(ranks["cpu"][1]["pipeline.losses"]) == 2 and len(ranks["cpu"][0]["pipeline.losses"]) == 0


def test_a_gloo_jobs_flight_recorder_dumps_are_read_into_a_run(ranks, tmp_path):
    # the reference run's dumps: PyTorch's own gloo groups, read as tpu_debug reads its ranks
    from tpu_debug.cli import main as cli
    from tpu_debug.ranks import find_group
    from tpu_debug.report.ranks import c10d_data

    dumps = ranks["fr_dumps"]
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0", "rank_1"]
    assert cli(["import-fr", str(dumps), "--logdir", str(tmp_path / "runs")]) == 0
    with find_group(None, tmp_path / "runs") as group:
        assert sorted(group.rank_dirs()) == [0, 1]
        data = c10d_data(group.sessions())
    # gloo's dumps name no group members: the default group's are the ranks that dumped
    (world,) = [s for s in data["sequence"] if s["group"] == "0"]
    assert world["ranks"] == [0, 1] and world["first_difference"] is None and data["desyncs"] == []
    first = [c["call"] for c in world["rows"][0]["calls"]]
    lines = [i for i, src in enumerate(CASES.read_text().splitlines(), 1) if "dist.all_reduce(t, op=" in src]
    assert [(c["op"], c["location"]["file"], c["location"]["line"] in lines) for c in first] == [
        ("allreduce", str(CASES), True)] * 2


def test_backends_registered_with_the_device():
    assert dist.Backend.default_device_backend_map["tpu"] == c10d.DEFAULT_BACKEND == "tpu_dist"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    for name in ("tpu", "tpu_dist"):
        assert name in dist.Backend.backend_list
        assert "tpu" in dist.Backend.backend_capability[name]


@pytest.mark.quick
def test_one_rank_group(one_rank):
    assert dist.get_backend() == "tpu"
    assert isinstance(one_rank, c10d.TpuProcessGroup)
    t = torch.arange(4.0, device="tpu")
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert work.wait() is True
    assert t.device.type == "tpu"
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert work.get_future().value()[0] is t


@pytest.mark.quick
def test_collective_calls_are_recorded_at_the_users_line(one_rank, tmp_path):
    import tpu_debug

    with tpu_debug.trace(logdir=tmp_path, hlo=False) as session:
        t = torch.ones(3, device="tpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out = torch.empty(3, device="tpu")
        dist.all_gather_into_tensor(out, t)
        dist.broadcast(t, src=0)
    calls = session.events("collective_call")
    assert [(c.op, c.seq, c.shapes, c.dtype, c.reduce_op, c.peer) for c in calls] == [
        ("allreduce", 1, ((3,),), "float32", "MAX", None),
        ("all_gather_single", 2, ((3,), (3,)), "float32", None, None),
        ("broadcast", 3, ((3,),), "float32", None, 0),
    ]
    here = Path(__file__).read_text().splitlines()
    assert [here[c.location.line - 1].strip().split("(")[0] for c in calls] == [
        "dist.all_reduce", "dist.all_gather_into_tensor", "dist.broadcast"]
    assert {(c.ranks, c.rank, c.nbytes > 0) for c in calls} == {((0,), 0, True)}
    # the engine's host copies are the collective's, not transfers of the user's
    assert [e.op for e in session.events("transfer") if e.direction == "d2h"] == []


def test_premultiplied_sum(one_rank):
    t = torch.arange(4.0, device="tpu")
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    assert t.cpu().tolist() == [0.0, 0.5, 1.0, 1.5]
    out = torch.empty(4, device="tpu")
    source = torch.arange(4.0, device="tpu")
    dist.reduce_scatter_tensor(out, source, op=dist._make_nccl_premul_sum(2.0))
    assert out.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert source.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # the input is left as it was


def test_average_of_integers_is_refused(one_rank):
    t = torch.arange(4, device="tpu")
    with pytest.raises(TypeError, match=re.escape(
        "ReduceOp.AVG on a torch.int64 tensor: the tpu backend averages floating point tensors only; "
        "reduce with ReduceOp.SUM and divide"
    )):
        dist.all_reduce(t, op=dist.ReduceOp.AVG)


def test_stream_and_event_names_fsdp2_asks_for():
    tpu = torch.tpu
    stream = tpu.Stream(priority=-1)
    with tpu.stream(stream):
        assert tpu.current_stream() is stream
    assert tpu.current_stream() is tpu.default_stream()
    start, end = tpu.Event(enable_timing=True), tpu.Event(enable_timing=True)
    start.record()
    stream.wait_event(stream.record_event())
    stream.wait_stream(tpu.current_stream())
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert stream.query() and end.query()


def test_storage_resize_frees_and_reallocates():
    t = torch.arange(6.0, device="tpu")
    storage = t.untyped_storage()
    storage.resize_(0)
    assert storage.nbytes() == 0
    storage.resize_(6 * 4)
    t.copy_(torch.ones(6))
    assert t.cpu().tolist() == [1.0] * 6
    storage.resize_(3 * 4)
    assert storage.nbytes() == 12


def _losses(output: str) -> list[float]:
    return [float(m) for m in re.findall(r"mean loss ([0-9.]+)", output)]


def _example(*launcher: str, device: str = "tpu", cwd: Path = REPO) -> str:
    proc = subprocess.run([*launcher, str(EXAMPLE), "--steps", "3", "--device", device], env=python_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_ddp_example_under_torchrun_equals_cpu():
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    tpu = _losses(_example(*torchrun))
    cpu = _losses(_example(*torchrun, device="cpu"))
    assert len(tpu) == 3
    assert tpu == pytest.approx(cpu, rel=1e-5)


@pytest.mark.slow
def test_ddp_example_under_tpu_debug_run_nproc(tmp_path):
    out = _example(sys.executable, "-m", "tpu_debug", "run", "--logdir", str(tmp_path / "runs"),
                   "--nproc", "2", cwd=tmp_path)
    assert len(_losses(out)) == 3
    assert "exit statuses [0, 0]" in out
