"""A traced dry run records each program's TPU target compile, as a ``--target`` run does.

The reference is XLA's TPU compiler itself: the equivalent JAX program, compiled in the
test for one device of the same deviceless topology at the dry run's effort level (O0),
gives the flops, the argument, output and temporary bytes; the time is the roofline
worked out here from that compile's cost analysis and the generation's published peaks.
Which generations a refused program would fit is the compiler's accept or refuse of the
same program on one device of each.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import pytest
import torch

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.runtime.dry_mode import DryMode
from tpu_debug.runtime.target import GENERATIONS, executor, parse_target
from tpu_debug.runtime.target._libtpu import _find_libtpu, topology
from tpu_debug.tracers.reading.target_findings import findings

pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)
_JAX = {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16}
# per chip, from https://cloud.google.com/tpu/docs/v5e and /v6e: bf16 peak FLOP/s, HBM bytes/s
_PEAKS = {"v5e": (197e12, 819e9), "v6e": (918e12, 1640e9)}
# a float32 product lowers at HIGHEST (torch's float32 default), six bf16 passes on the MXU
_PASSES = {torch.float32: 6, torch.bfloat16: 1}
M, K, N = 1024, 1000, 100  # the 100-wide result pads to 128 lanes
GiB = 1024**3


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    """One target cache for the module: never the user's, and filled by these tests only."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path_factory.mktemp("target-cache")))
    yield
    mp.undo()


def _reference(spec: str, fn, shapes: list[tuple[int, ...]], dtype: torch.dtype):
    """(memory_analysis, cost_analysis) of ``fn`` compiled straight through JAX at O0."""
    sharding = jax.sharding.SingleDeviceSharding(topology(parse_target(spec))[0])
    args = [jax.ShapeDtypeStruct(s, _JAX[dtype], sharding=sharding) for s in shapes]
    before = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", "O0")
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    finally:
        jax.config.update("jax_optimization_level", before)
    cost = compiled.cost_analysis()
    return compiled.memory_analysis(), cost[0] if isinstance(cost, (list, tuple)) else cost


def _opmath(fn):
    """``fn`` as PyTorch's kernels compute it: a bfloat16 input in float32, the result rounded back."""
    return lambda x: fn(x.astype(jnp.float32)).astype(x.dtype)


def _dot(dtype: torch.dtype):
    precision = jax.lax.Precision.HIGHEST if dtype == torch.float32 else None
    return lambda a, b: jnp.dot(a, b, precision=precision)


def test_each_dry_run_marks_its_programs_apart_from_every_ended_ones():
    # a compiled graph outlives a trace (dynamo keeps it for its code): the programs a dry run
    # made for one target must not be taken as another's. An ended dry run's memory is
    # reused at once, so anything derived from its address would repeat
    keys = [DryMode().key for _ in range(5)]
    assert len(set(keys)) == len(keys), keys


@pytest.mark.parametrize("spec", ["v5e", "v6e"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dry_runs_programs_have_the_figures_of_the_same_jax_programs(spec, dtype, tmp_path, monkeypatch,
                                                                       capsys):
    started = []
    compile_lowered = executor.compile_lowered_for_target

    def counted(*args, **kwargs):
        started.append(args[0])
        return compile_lowered(*args, **kwargs)

    monkeypatch.setattr(executor, "compile_lowered_for_target", counted)
    graph = tpu_debug.compile(lambda x, y: torch.tanh(x @ y) * 2)
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target=spec) as session:
        a = torch.empty(M, K, dtype=dtype, device="tpu")
        b = torch.empty(K, N, dtype=dtype, device="tpu")
        torch.tanh(a @ b)
        graph(a, b)
    # the graph's name numbers it among the process's graphs
    events = session.events("target_compile")
    compiles = {("graph" if e.name.endswith("/inference") else e.name): e for e in events}
    assert set(compiles) == {"mm", "tanh", "graph"}, sorted(compiles)
    # each program went to the TPU compiler once: the dry run's compile is the one recorded
    (dry,) = session.events("dry_run")
    assert len(started) == dry.programs == len(compiles)
    dot = _dot(dtype)
    references = {
        "mm": (dot, [(M, K), (K, N)]),
        "tanh": (_opmath(jnp.tanh), [(M, N)]),
        "graph": (lambda x, y: _opmath(lambda v: v * 2)(_opmath(jnp.tanh)(dot(x, y))), [(M, K), (K, N)]),
    }
    peak, bandwidth = _PEAKS[spec]
    for name, (fn, shapes) in references.items():
        event = compiles[name]
        memory, cost = _reference(spec, fn, shapes, dtype)
        assert event.ok and event.optimization_level == "O0" and event.target == spec
        # the compiler's own figures for the same program: equal, well within 2 %
        assert event.flops == pytest.approx(cost.get("flops", 0.0), rel=0.02)
        assert event.argument_bytes == pytest.approx(memory.argument_size_in_bytes, rel=0.02)
        assert event.output_bytes == pytest.approx(memory.output_size_in_bytes, rel=0.02)
        assert event.temp_bytes == pytest.approx(memory.temp_size_in_bytes, rel=0.02, abs=0)
        dot_flops = 2 * M * N * K if name != "tanh" else 0
        compute = (cost.get("flops", 0.0) + (_PASSES[dtype] - 1) * dot_flops) / peak
        memory_bound = cost["bytes accessed"] / bandwidth
        assert event.estimated_seconds == pytest.approx(max(compute, memory_bound), rel=0.02)
    # the product's padded result: 100 lanes of 128 in the compiler's layout, not the logical bytes
    assert compiles["mm"].output_bytes > M * N * torch.empty((), dtype=dtype).element_size()
    # the report's TPU target section, as text and as JSON
    capsys.readouterr()
    assert main(["report", str(session.run_dir)]) == 0
    text = capsys.readouterr().out
    section = text[text.index(f"TPU target ({spec})"):]
    assert f"{compiles['graph'].name}(" in section and "compiled at XLA's O0" in section
    assert main(["report", "--json", str(session.run_dir)]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert target["target"] == spec
    assert {p["name"]: p["flops"] for p in target["programs"]} == {e.name: e.flops for e in compiles.values()}


def _stated_hbm(generation: str) -> int:
    """The HBM one device offers, as the compiler's refusal of a far too big program states it."""
    sharding = jax.sharding.SingleDeviceSharding(topology(parse_target(generation))[0])
    x = jax.ShapeDtypeStruct((200_000, 200_000), jnp.float32, sharding=sharding)  # 149 GiB
    stated = r"exceeds available HBM \(([\d.]+)G\)"  # XLA's G is GiB, to 0.01
    with pytest.raises(jax.errors.JaxRuntimeError, match=stated) as refused:
        jax.jit(lambda a: a + 1).lower(x).compile()
    return int(float(re.search(stated, str(refused.value)).group(1)) * GiB)


def _accepts(generation: str, fn, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    sharding = jax.sharding.SingleDeviceSharding(topology(parse_target(generation))[0])
    try:
        jax.jit(fn).lower(jax.ShapeDtypeStruct(shape, _JAX[dtype], sharding=sharding)).compile()
    except jax.errors.JaxRuntimeError as exc:
        assert "RESOURCE_EXHAUSTED" in str(exc) and "HBM" in str(exc), exc
        return False
    return True


# a product whose input and output each take half the need: over one v5e device (15.75 GiB)
# and under one v6e (31.25); over one v6e and under one v5p (95.74)
@pytest.mark.parametrize("spec, need_gib", [("v5e", 20), ("v6e", 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_program_refused_for_hbm_names_the_generations_whose_compiler_accepts_it(spec, need_gib, dtype,
                                                                                    tmp_path):
    n = need_gib * GiB // 2 // torch.empty((), dtype=dtype).element_size()
    with tpu_debug.trace(logdir=tmp_path / "runs", dry_run=True, target=spec) as session:
        x = torch.empty(n, dtype=dtype, device="tpu")
        x * 2
    del x  # a traceback kept by a later check would hold the frame, and the tensor, alive into the next test
    (refused,) = [e for e in session.events("target_compile") if e.status == "hbm_oom"]
    accepted = {g for g in GENERATIONS if _accepts(g, _opmath(lambda v: v * 2), (n,), dtype)}
    assert set(refused.larger_targets) == accepted and spec not in accepted and accepted
    larger = zip(refused.larger_targets, refused.larger_hbm_bytes, refused.larger_spec_bytes)
    for name, usable, spec_bytes in larger:
        # the compiler's figure (its message rounds it to 0.01 GiB), the spec sheet's beside it
        assert usable == pytest.approx(_stated_hbm(name), abs=0.01 * GiB)
        assert spec_bytes == {"v6e": 32 * GiB, "v5p": 95 * GiB}[name]
    (oom,) = [f for f in findings(session.events("target_compile")) if f.kind == "hbm_oom"]
    assert ("v6e: 31.25 GiB usable (spec 32.00 GiB)" in oom.fix) is (spec == "v5e")
    # the refusal is the dry run's and the target tracer's record both: one finding of the run
    assert [f.kind for f in session.findings()].count("hbm_oom") == 1


def test_dry_run_gives_each_programs_target_compile_as_a_target_run_records_it():
    def step():
        a = torch.empty(M, K, device="tpu")
        b = torch.empty(K, N, device="tpu")
        a @ b

    result = tpu_debug.dry_run(step, target="v6e")
    assert {e.name for e in result.compiles} == {p.name for p in result.programs}
    (mm,) = [e for e in result.compiles if e.name == "mm"]
    memory, cost = _reference("v6e", _dot(torch.float32), [(M, K), (K, N)], torch.float32)
    assert mm.ok and mm.optimization_level == "O0" and mm.flops == pytest.approx(cost["flops"], rel=0.02)
    assert (mm.argument_bytes, mm.output_bytes, mm.temp_bytes) == (
        memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.temp_size_in_bytes)
    peak, bandwidth = _PEAKS["v6e"]
    compute = cost["flops"] * _PASSES[torch.float32] / peak
    assert mm.estimated_seconds == pytest.approx(max(compute, cost["bytes accessed"] / bandwidth), rel=0.02)
