"""The roofline model of target compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tpu_debug.runtime.target import CostStats, TargetError, compile_for_target, parse_target, roofline
from tpu_debug.runtime.target._libtpu import _find_libtpu

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


def test_the_model_from_cost_figures():
    # 1 TFLOP over 1 GB on a v5e (197 TFLOP/s, 819 GB/s): intensity 1000 FLOP/B, over the
    # ridge of 240.5: compute-bound, 1e12 / 197e12 s
    model = roofline(CostStats(flops=1e12, transcendentals=0, bytes_accessed=1e9), parse_target("v5e"))
    assert model.intensity == 1000
    assert model.ridge == pytest.approx(197e12 / 819e9)
    assert model.bound == "compute" and model.seconds == 1e12 / 197e12
    memory = roofline(CostStats(flops=1e9, transcendentals=0, bytes_accessed=1e10), parse_target("v5e"))
    assert memory.bound == "memory" and memory.seconds == 1e10 / 819e9
    # a v4 device is one of a chip's two TensorCores: half the chip's peak and bandwidth
    v4 = roofline(CostStats(flops=1e12, transcendentals=0, bytes_accessed=1e9), parse_target("v4"))
    assert v4.peak_flops == 137.5e12 and v4.bandwidth == 600e9
    int8 = roofline(CostStats(flops=1e12, transcendentals=0, bytes_accessed=1e9), parse_target("v6e"), precision="int8")
    assert int8.peak_flops == 1836e12
    assert "model estimate" in model.render() and "compute-bound" in model.render()


def test_the_model_refuses_what_it_cannot_compute():
    cost = CostStats(flops=1.0, transcendentals=0, bytes_accessed=1.0)
    with pytest.raises(TargetError, match=r"v5p publishes no int8 peak \(https://cloud.google.com/tpu/docs/v5p\)"):
        roofline(cost, parse_target("v5p"), precision="int8")
    with pytest.raises(TargetError, match="precision 'fp4' is not one of 'bf16', 'int8'"):
        roofline(cost, parse_target("v5e"), precision="fp4")
    with pytest.raises(TargetError, match="needs the target"):
        roofline(cost)
    assert roofline(CostStats(0.0, 0.0, 0.0), parse_target("v5e")).intensity == float("inf")


@requires_libtpu
def test_a_big_matmul_is_compute_bound_and_an_add_memory_bound():
    n = 8192
    a = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
    mm = roofline(compile_for_target(lambda x, y: x @ y, (a, a), "v5e"))
    assert mm.flops == 2 * n**3
    assert mm.bound == "compute" and mm.seconds == pytest.approx(2 * n**3 / 197e12)
    # the compiler's own model prices this matmul at the same v5e peak (checked against
    # libtpu 0.0.52): 5.58 ms both ways, to within its rounding
    assert mm.xla_seconds == pytest.approx(mm.seconds, rel=0.01)

    v = jax.ShapeDtypeStruct((64 * 1024 * 1024,), jnp.float32)
    add = roofline(compile_for_target(lambda x, y: x + y, (v, v), "v5e"))
    assert add.bytes_accessed == 3 * 64 * 1024 * 1024 * 4  # two reads, one write
    assert add.bound == "memory" and add.seconds == add.bytes_accessed / 819e9
    assert add.intensity == pytest.approx(1 / 12)


@requires_libtpu
def test_a_failed_compile_has_no_roofline():
    x = jax.ShapeDtypeStruct((70_000, 70_000), jnp.float32)
    failed = compile_for_target(lambda a: a @ a, (x,), parse_target("v5e"))
    with pytest.raises(TargetError, match="did not compile for v5e: no cost to model"):
        roofline(failed)


# bf16 passes of one product by the precision XLA's TPU compiler gives it (BF16_BF16_F32_X3 and
# _X6 for float32 at HIGH and HIGHEST); a bf16 product is one pass at any precision
_PASSES = {"default": 1, "high": 3, "highest": 6}
_PEAK = {"v5e": 197e12, "v6e": 918e12}  # the Cloud TPU pages' bf16 peak per chip
_BANDWIDTH = {"v5e": 819e9, "v6e": 1640e9}


def _compiled_directly(spec, fn, args):
    """``fn`` compiled straight through JAX for one device of ``spec``: (TPU HLO, cost analysis)."""
    from tpu_debug.runtime.target._libtpu import topology

    device = topology(parse_target(spec))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    placed = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
    compiled = jax.jit(fn).lower(*placed).compile()
    cost = compiled.cost_analysis()
    return compiled.as_text(), cost[0] if isinstance(cost, (list, tuple)) else cost


@pytest.fixture(scope="module")
def direct_dot():
    """``direct_dot(spec, n, dtype, precision)``: ``jnp.dot`` of two (n, n) arrays at ``precision``
    compiled straight through JAX (``_compiled_directly``), each reference compiled once for the
    tests that read it (a float32 HIGHEST product of 1536 is the costliest compile here)."""
    done = {}

    def compiled(spec, n, dtype, precision):
        key = (spec, n, jnp.dtype(dtype).name, precision)
        if key not in done:
            a = jax.ShapeDtypeStruct((n, n), dtype)
            done[key] = _compiled_directly(spec, lambda x, y: jnp.dot(x, y, precision=precision), (a, a))
        return done[key]

    return compiled


@requires_libtpu
@pytest.mark.parametrize("spec", ["v5e", pytest.param("v6e", marks=pytest.mark.slow)])  # v6e: the same passes, another rate
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("precision", ["default", "high", "highest"])
def test_a_float32_products_time_is_its_passes(spec, dtype, precision, direct_dot):
    import re

    # the expected time is the roofline of either bound, whichever it is; at 1536 every float32
    # product of more than one pass is compute-bound on both chips (HIGH on v6e: 24 µs of passes
    # against 17 µs of bytes), so the passes decide it (a TPU compile of 2048 takes 2.5x longer)
    n = 1536
    a = jax.ShapeDtypeStruct((n, n), dtype)

    def f(x, y):
        return jnp.dot(x, y, precision=precision)

    hlo, cost = direct_dot(spec, n, dtype, precision)  # f's dot, compiled straight through JAX
    (dot,) = [line for line in hlo.splitlines() if " convolution(" in line or " dot(" in line]
    named = re.search(r"operand_precision=\{(\w+),", dot)
    said = named.group(1) if named else "default"
    assert said == precision  # the compiler keeps the precision asked for
    passes = _PASSES[said] if dtype == jnp.float32 else 1
    expected = max(passes * cost["flops"] / _PEAK[spec], cost["bytes accessed"] / _BANDWIDTH[spec])

    model = roofline(compile_for_target(f, (a, a), spec))
    assert model.seconds == pytest.approx(expected, rel=0.02)
    assert model.mfu == pytest.approx(cost["flops"] / (expected * _PEAK[spec]), rel=0.02)
    if dtype == jnp.float32:
        assert f"at {precision.upper()} ({passes} bf16 pass" in model.render()
    else:
        assert "float32 dots" not in model.render()


@requires_libtpu
def test_a_torch_float32_matmul_on_the_target_is_timed_at_six_passes(direct_dot):
    # torch's float32 matmul precision is "highest" by default; the runtime's lowering keeps
    # it, and the TPU compiler runs it as six bf16 passes
    import torch

    import tpu_debug

    n = 1536  # compute-bound at six passes: 221 µs of passes against 35 µs of bytes on v5e

    def step():
        x = torch.empty(n, n, device="tpu")
        return x @ x

    hlo, cost = direct_dot("v5e", n, jnp.float32, "highest")
    assert "operand_precision={highest,highest}" in hlo
    result = tpu_debug.dry_run(step, target="v5e")
    (program,) = [p for p in result.programs if p.result is not None and "mm" in p.name]
    model = roofline(program.result)
    assert model.dot_precisions == (("HIGHEST", pytest.approx(cost["flops"], rel=0.02)),)
    assert model.seconds == pytest.approx(6 * cost["flops"] / 197e12, rel=0.02)


@requires_libtpu
def test_op_by_op_adds_each_ops_own_bound_where_the_roofline_lets_them_overlap():
    from tpu_debug.runtime.target.roofline import op_by_op

    n = 4096
    a = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((64 * 1024 * 1024,), jnp.float32)  # too big to stage on chip
    mm = compile_for_target(lambda x, y: x @ y, (a, a), "v5e")
    add = compile_for_target(lambda p, q: p + q, (v, v), "v5e")
    # each alone: the matmul's flops and the sum's bytes are the compiler's cost analysis's
    assert op_by_op(mm.hlo, mm.target).compute_seconds == pytest.approx(roofline(mm).compute_seconds, rel=1e-6)
    assert op_by_op(add.hlo, add.target).memory_seconds == pytest.approx(roofline(add).memory_seconds, rel=1e-6)

    # together, independent of each other: the roofline lets the sum's bytes hide under the
    # matmul's flops; one after another, each takes its own bound
    both = compile_for_target(lambda x, y, p, q: (x @ y, p + q), (a, a, v, v), "v5e")
    each = op_by_op(both.hlo, both.target)
    alone = roofline(mm).compute_seconds + roofline(add).memory_seconds
    # within the matmul's own operands and result (48 MiB of the 816 MiB moved), which the
    # compiler may stage on chip differently once the sum is beside it
    assert each.seconds == pytest.approx(alone, rel=0.07)
    assert each.seconds > roofline(both).seconds
