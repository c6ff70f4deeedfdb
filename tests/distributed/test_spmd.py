"""Data and tensor parallelism on a 2x4 mesh of simulated CPU devices, in one process.

tests/distributed/data/spmd_cases.py does the work in a process with 8 devices
(see conftest.py); these tests check what it measured and the runs it traced.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tpu_debug.tracers.reading.program_collectives import program_collectives

import tpu_debug

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "models" / "tiny_llama.py"
CASES = Path(__file__).resolve().parent / "data" / "spmd_cases.py"


def _line(path: Path, text: str) -> int:
    """The line of ``path`` holding ``text`` (the tests name lines by their code, not by number)."""
    (line,) = [i for i, src in enumerate(path.read_text().splitlines(), 1) if text in src]
    return line


def _ok(spmd, case: str) -> None:
    failures = spmd.get("failures") or {}
    if case in failures:
        pytest.fail(f"spmd_cases.py {case} raised:\n{failures[case]}")


def _close(actual, expected) -> None:
    # The sharded program sums the same products as the CPU in another order (per shard,
    # then across devices), so results differ by a few float32 ULPs of the values summed:
    # torch.testing's float32 tolerances (rtol 1.3e-6, atol 1e-5) hold them.
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected))


@pytest.mark.parametrize("variant", ["single", "dp", "tp", "dp_tp"])
def test_training_matches_cpu_and_one_device(spmd, variant):
    _ok(spmd, "llama")
    assert spmd["devices"] == 8
    got = spmd[variant]
    _close(got["losses"], spmd["cpu"]["losses"])
    _close(got["losses"], spmd["single"]["losses"])
    for name, value in spmd["cpu"]["weights"].items():
        _close(got["weights"][name], value)
        _close(got["weights"][name], spmd["single"]["weights"][name])


def test_plan_lays_out_weights_megatron_style(spmd):
    _ok(spmd, "llama")
    specs = spmd["dp_tp"]["specs"]
    column, row = ["tp", None], [None, "tp"]
    for name in ("attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"):
        assert specs[f"blocks.0.{name}.weight"] == column, name
    for name in ("attn.o", "mlp.down"):
        assert specs[f"blocks.0.{name}.weight"] == row, name
    assert specs["embed.weight"] == ["tp", None]  # row-wise: the vocabulary is split
    assert specs["lm_head.weight"] == column
    assert specs["norm.weight"] == [None]  # distribute_module: replicated
    assert spmd["dp"]["specs"]["blocks.0.attn.q.weight"] == [None, None]


def _programs(run: str) -> list:
    with tpu_debug.open_run(run) as session:
        return [e for e in program_collectives(session) if e.mode == "compiled"]


def test_data_parallel_reduces_every_gradient_over_the_data_dimension(spmd):
    _ok(spmd, "llama")
    (program,) = _programs(spmd["dp"]["run"])
    assert program.devices == 8
    backward = _line(CASES, "loss.backward()  # the compiled step's backward")
    grads = [c for c in program.collectives if c.opcode == "all-reduce" and c.line == backward]
    # dp=2: each group is the 2 replicas of one tensor-parallel position, 4 such groups
    assert {(c.group_size, c.groups) for c in grads} == {(2, 4)}
    params = sum(math.prod(torch.tensor(v).shape) for v in spmd["cpu"]["weights"].values())
    assert sum(c.nbytes for c in grads) == 4 * params  # every float32 gradient, once
    # a ring all-reduce over 2 devices sends each device's buffer once
    assert sum(c.wire_bytes for c in grads) == 4 * params
    assert {c.file for c in grads} == {str(CASES)}


def test_tensor_parallel_collectives_name_the_layer_and_line(spmd):
    _ok(spmd, "llama")
    (program,) = _programs(spmd["dp_tp"]["run"])
    by_line = {(c.opcode, c.group_size, c.line) for c in program.collectives if c.file == str(LLAMA)}
    # the row-wise attention output and MLP down projection sum partial products over tp=4
    assert ("all-reduce", 4, _line(LLAMA, "return self.o(")) in by_line
    assert ("all-reduce", 4, _line(LLAMA, "return self.down(")) in by_line
    rowwise = [c for c in program.collectives if c.line == _line(LLAMA, "return self.down(")]
    assert rowwise[0].op == "aten::mm.default" and rowwise[0].node.startswith("mm")


def test_tensor_parallel_needs_less_memory_per_device(spmd):
    _ok(spmd, "llama")
    (dp,) = _programs(spmd["dp"]["run"])
    (tp,) = _programs(spmd["tp"]["run"])
    # the weights are the bulk of the inputs; split four ways their share shrinks four times
    assert tp.argument_bytes < dp.argument_bytes / 2
    assert tp.memory_bytes < dp.memory_bytes


def test_report_shows_collectives(spmd):
    _ok(spmd, "llama")
    with tpu_debug.open_run(spmd["dp_tp"]["run"]) as session:
        text = session.summary(width=160)
    section = text[text.index("\nCollectives\n"):]
    assert "1 program(s) over 8 devices on this run's devices" in section
    assert "all-reduce" in section and "all-gather" in section
    assert f"tiny_llama.py:{_line(LLAMA, 'return self.o(')}" in section or "spmd_cases.py:" in section


def test_eager_ops_on_sharded_tensors_match_cpu(spmd):
    _ok(spmd, "eager_and_placement")
    e = spmd["eager"]
    _close(*e["eager_sum"])
    _close(*e["eager_mul_row_sums"])
    assert e["spec"] == ["dp", "tp"]
    assert e["local_shape"] == [4, 3]  # 8x12 over dp=2 x tp=4


def test_a_tensor_left_on_one_device_moves_to_the_mesh_once(spmd):
    _ok(spmd, "eager_and_placement")
    e = spmd["eager"]
    assert e["replicated_after_call"] is True
    _close(*e["matmul"])
    with tpu_debug.open_run(e["run"]) as session:
        eager = [x for x in program_collectives(session) if x.mode == "eager"]
        compiles = session.compiles(mode="compiled")
    assert eager == []  # nothing sharded ran eagerly inside this run
    # the batch laid out another way is a new program, and the recompile says why
    assert [d.render() for c in compiles for d in c.diffs] == [
        "arg 0 'a' sharding: P(dp, tp) on dp=2,tp=4 -> replicated on dp=2,tp=4"
    ]


def test_annotations_that_do_not_fit_are_refused_with_the_fix(spmd):
    _ok(spmd, "eager_and_placement")
    errors = spmd["eager"]["errors"]
    assert errors["length"] == ["ShardingError", (
        "partition spec ('dp',) has 1 entries for a 2-d tensor of shape [8, 4]: give one per tensor "
        "dimension (None for a dimension not split)")]
    assert errors["divide"] == ["ShardingError", (
        "tensor dimension 0 of size 6 does not split evenly over tp (4 devices); use a size that is a "
        "multiple of 4, or split another dimension")]
    assert errors["name"] == ["MeshError", "the mesh has no dimension 'batch'; its dimensions are dp, tp"]
    assert errors["twice"] == ["ShardingError", "partition spec ('tp', 'tp') uses mesh dimension 'tp' twice"]
    assert errors["view"][0] == "ShardingError" and "a view of a larger storage" in errors["view"][1]
    assert errors["mesh"] == ["MeshError", (
        "a 4x4 mesh needs 16 devices; the run has 8 device(s): on CPU, simulate more with "
        "'tpu-debug run --devices N' or XLA_FLAGS=--xla_force_host_platform_device_count=N set before jax starts")]


def test_the_same_program_for_a_tpu_target(spmd):
    pytest.importorskip("libtpu")
    _ok(spmd, "target")
    assert spmd["target_unfinished"] == 0
    with tpu_debug.open_run(spmd["target_run"]) as session:
        events = [e for e in session.events("collectives") if e.mode == "compiled"]
    local = [e for e in events if not e.target]
    tpu = [e for e in events if e.target == "v5e-8"]  # the target's name, as every record gives it
    assert local and len(tpu) == 1, [(e.target, e.error) for e in events]
    (tpu,) = tpu
    assert tpu.error is None and tpu.devices == 8
    # the gradients (weight 256x128 and bias 256, float32) are summed over the 8 data-parallel devices
    # on the TPU as on this run's devices
    grads = 4 * (256 * 128 + 256)
    for e in (local[0], tpu):
        reduced = [c for c in e.collectives if c.opcode == "all-reduce" and c.group_size == 8]
        assert sum(c.nbytes for c in reduced) >= grads, (e.target, [c.describe() for c in e.collectives])
    assert tpu.memory_bytes is not None and tpu.code_bytes > 0
