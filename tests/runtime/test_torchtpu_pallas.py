"""JAX functions and Pallas kernels as PyTorch ops (runtime/pallas.py, ``torch.tpu.pallas.jax_op``):
each kernel is checked against the same computation in CPU PyTorch, eagerly, fused and in a
``torch.compile`` graph, with autograd; and its lowering for a TPU is the Mosaic kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime.pallas import _per_platform, jax_op
from tpu_debug.runtime.target import _libtpu


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _add(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def _add_sub_kernel(x_ref, y_ref, s_ref, d_ref):
    s_ref[...] = x_ref[...] + y_ref[...]
    d_ref[...] = x_ref[...] - y_ref[...]


def _add_sub(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(_add_sub_kernel, out_shape=[shape, shape])(x, y)


def _matmul_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def _matmul(x: jax.Array, y: jax.Array, block: int) -> jax.Array:
    """A tiled matmul: a (m/block, n/block) grid, each step one output block from a row block
    of x and a column block of y (the guide's blocked kernel; ``block`` is static)."""
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // block, n // block),
        in_specs=[pl.BlockSpec((block, k), lambda i, j: (i, 0)), pl.BlockSpec((k, block), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j: (i, j)),
    )(x, y)


@pytest.fixture(scope="module")
def ops():
    made = {
        "add": jax_op("tpu_debug_test::pallas_add", _add),
        "add_sub": jax_op("tpu_debug_test::pallas_add_sub", _add_sub),
        "matmul": jax_op("tpu_debug_test::pallas_matmul", _matmul),
    }

    def mul_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * y_ref[...]

    def mul(x: jax.Array, y: jax.Array) -> jax.Array:
        return pl.pallas_call(mul_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    def mul_grad(g: jax.Array, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return g * y, g * x

    made["mul"] = jax_op("tpu_debug_test::pallas_mul", mul)
    backward = jax_op("tpu_debug_test::pallas_mul_grad", mul_grad)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def grad(ctx, g):
        x, y = ctx.saved_tensors
        return backward(g, x, y)

    made["mul"].register_autograd(grad, setup_context=setup)
    return made


def _pair(*shape):
    gen = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)


def test_a_pallas_kernel_runs_eagerly_on_tpu_tensors_as_cpu_pytorch_computes(ops):
    a, b = _pair(8, 128)
    # one float32 add per element, in Pallas' interpreter and on CPU alike: bit for bit
    assert torch.equal(ops["add"](a.to("tpu"), b.to("tpu")).cpu(), a + b)
    total, diff = ops["add_sub"](a.to("tpu"), b.to("tpu"))
    assert torch.equal(total.cpu(), a + b) and torch.equal(diff.cpu(), a - b)
    # the op on CPU tensors runs the same kernel on the host: a reference beside the device's
    assert torch.equal(ops["add"](a, b), a + b)


def test_a_gridded_kernel_with_a_static_argument_matches_cpu_matmul(ops):
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 32, generator=gen), torch.randn(32, 16, generator=gen)
    out = ops["matmul"](x.to("tpu"), y.to("tpu"), 8).cpu()
    # float32 sums of 32 products, accumulated in another order than CPU PyTorch's: a few
    # ulps of the largest partial sums (|x @ y| stays under ~20 here)
    torch.testing.assert_close(out, x @ y, rtol=1e-5, atol=1e-5)


def test_a_kernel_in_a_compiled_graph_and_in_a_fused_program(ops):
    a, b = _pair(4, 128)

    @torch.compile(backend="tpu_debug")
    def f(x, y):
        return ops["add"](x, y).relu() * 2.0

    assert torch.equal(f(a.to("tpu"), b.to("tpu")).cpu(), (a + b).relu() * 2.0)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        fused = (ops["add"](a.to("tpu"), b.to("tpu")) - 1.0).cpu()
    assert torch.equal(fused, a + b - 1.0)


def test_a_kernel_trains_with_its_registered_backward_eager_and_compiled(ops):
    x, y = _pair(2, 128)

    def grads(fn, device):
        xs, ys = (t.detach().clone().to(device).requires_grad_() for t in (x, y))
        loss = fn(xs, ys)
        loss.backward()
        return loss.detach().cpu(), xs.grad.cpu(), ys.grad.cpu()

    want = grads(lambda a, b: (a * b).sum(), "cpu")
    # the forward and the backward are one float32 product per element; the loss is a sum of
    # 256 of them, in another order on XLA than on CPU: float32 rounding of the sum
    for fn in (lambda a, b: ops["mul"](a, b).sum(), torch.compile(lambda a, b: ops["mul"](a, b).sum(),
                                                                    backend="tpu_debug")):
        loss, gx, gy = grads(fn, "tpu")
        torch.testing.assert_close(loss, want[0], rtol=1e-6, atol=1e-5)
        assert torch.equal(gx, want[1]) and torch.equal(gy, want[2])


def test_lowered_for_a_tpu_the_kernel_is_mosaic_and_for_cpu_interpreted():
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    traced = jax.jit(_per_platform(_add)).trace(spec, spec)
    assert "tpu_custom_call" in traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" not in traced.lower(lowering_platforms=("cpu",)).as_text()


def test_jax_op_refuses_what_its_schema_cannot_say():
    # the messages start with TorchTPU's words (its tests match them), then say what to do
    def unannotated(x):
        return x

    def takes_a_dict(x: jax.Array, y: dict[str, int]) -> jax.Array:
        return x

    def returns_a_string(x: jax.Array) -> str:
        return "x"

    with pytest.raises(TpuArgumentError, match=r"^Missing argument type annotation for JAX function .*'x'.*annotate"):
        jax_op("tpu_debug_test::bad1", unannotated)
    with pytest.raises(TpuArgumentError, match=r"^Arguments at indices \[1\] are invalid .*'y' annotated"):
        jax_op("tpu_debug_test::bad3", takes_a_dict)
    with pytest.raises(TpuArgumentError, match=r"^The return annotation is invalid .*<class 'str'>"):
        jax_op("tpu_debug_test::bad4", returns_a_string)
    with pytest.raises(TpuArgumentError, match=r"must be 'namespace::op'"):
        jax_op("no_namespace", _add)
    with pytest.raises(TpuArgumentError, match=r"a kernel over several devices runs on a TPU slice"):
        jax_op("tpu_debug_test::bad2", _add, mesh=object())


# slow: a libtpu compile; test_lowered_for_a_tpu_the_kernel_is_mosaic_and_for_cpu_interpreted
# checks the same lowering in the default tier
@pytest.mark.slow
@pytest.mark.skipif(not _libtpu._find_libtpu(),
                    reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')
def test_under_a_tpu_target_the_kernel_is_compiled_as_written(ops, tmp_path, monkeypatch):
    import tpu_debug

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    a, b = _pair(8, 128)
    with (tpu_debug.trace(logdir=tmp_path, target="v5e", hlo=True) as session,
          torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)):
        out = ops["add"](a.to("tpu"), b.to("tpu"))
    assert torch.equal(out.cpu(), a + b)
    (kernel,) = [e for e in session.events("target_compile") if "pallas_add" in e.name]
    # the CPU program interprets the kernel; the TPU's is lowered again and holds the Mosaic kernel
    assert "tpu_debug_interpreted_kernel" in session.programs.text(kernel.program).stablehlo
    assert kernel.ok and kernel.relowered and "tpu_custom_call" in session.programs.text(kernel.tpu_program).hlo
