"""What projects built on TorchTPU call, as they call it: openxla/tokamax's TorchTPU ops (a Pallas
TPU kernel with manual DMA, registered through ``torch_tpu._internal.pallas.pallas.jax_op``),
google/tpu-sync's loader (``torch_tpu._loader.load()``, files beside ``torch_tpu.__file__``) and
its deferred-tensor checks, vLLM-TorchTPU's compiler (``TpuBackend`` called on a graph with fake
example inputs) and worker profiling (``TpuProfilerConfig`` with ``torch.profiler``). Each is our
own code written from what those projects do; the projects themselves need their own
dependencies (vLLM, tokamax's jaxtyping, tpu-sync's C++ extension), see docs/torchtpu_compat.md."""

from __future__ import annotations

import importlib
import pathlib
import types
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

V_BLOCK = 128


def _lse_kernel(x_ref, w_hbm, labels_ref, lse_ref, loss_ref, w_vmem, sem):
    # tokamax's pattern: the weight stays in HBM and blocks of it are copied into a VMEM
    # scratch by DMA (a semaphore each), an online log-sum-exp over the blocks, the scalar
    # loss in SMEM
    n_blocks = w_hbm.shape[1] // V_BLOCK

    def block(j, carry):
        m, s, picked = carry
        copy = pltpu.make_async_copy(w_hbm.at[:, pl.ds(j * V_BLOCK, V_BLOCK)], w_vmem, sem.at[0])
        copy.start()
        copy.wait()
        logits = jnp.dot(x_ref[...], w_vmem[...], preferred_element_type=jnp.float32)
        top = jnp.maximum(m, logits.max(axis=-1, keepdims=True))
        s = s * jnp.exp(m - top) + jnp.exp(logits - top).sum(axis=-1, keepdims=True)
        cols = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1) + j * V_BLOCK
        picked = picked + jnp.where(cols == labels_ref[...], logits, 0.0).sum(axis=-1, keepdims=True)
        return top, s, picked

    rows = (x_ref.shape[0], 1)
    m, s, picked = jax.lax.fori_loop(0, n_blocks, block, (jnp.full(rows, -jnp.inf), jnp.zeros(rows), jnp.zeros(rows)))
    lse_ref[...] = m + jnp.log(s)
    loss_ref[0] = jnp.mean(lse_ref[...] - picked)


def linear_cross_entropy(x: jax.Array, labels: jax.Array, w: jax.Array, reduction: str) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy of ``x @ w`` against ``labels``, and each row's log-sum-exp."""
    b, h = x.shape
    lse, loss = pl.pallas_call(
        _lse_kernel,
        out_shape=(jax.ShapeDtypeStruct((b, 1), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32)),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.HBM),
                  pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)),
        scratch_shapes=[pltpu.VMEM((h, V_BLOCK), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
    )(x, w, labels.reshape(b, 1))
    return loss.reshape(()), lse.reshape(b)


def linear_cross_entropy_backward(d_loss: jax.Array, lse: jax.Array, x: jax.Array, labels: jax.Array, w: jax.Array,
                                  reduction: str) -> tuple[jax.Array, jax.Array]:
    probs = jnp.exp(x @ w - lse[:, None])
    d_logits = (probs - jax.nn.one_hot(labels, w.shape[1])) * d_loss / x.shape[0]
    return d_logits @ w.T, x.T @ d_logits


@pytest.fixture(scope="module")
def tokamax_op():
    import torch_tpu._internal.pallas.pallas

    forward = torch_tpu._internal.pallas.pallas.jax_op("tpu_debug_test::linear_cross_entropy", linear_cross_entropy)
    backward = torch_tpu._internal.pallas.pallas.jax_op("tpu_debug_test::linear_cross_entropy_backward",
                                                        linear_cross_entropy_backward)

    def setup_context(ctx, inputs, output):
        x, labels, w, reduction = inputs
        ctx.save_for_backward(x, labels, w, output[1])
        ctx.reduction = reduction

    def grad(ctx, d_loss, d_lse):
        x, labels, w, lse = ctx.saved_tensors
        grad_x, grad_w = backward(d_loss, lse, x, labels, w, ctx.reduction)
        return grad_x, None, grad_w, None

    forward.register_autograd(grad, setup_context=setup_context)
    return forward


def test_a_tokamax_style_kernel_runs_through_jax_op(tokamax_op):
    from tpu_debug.runtime.pallas import _per_platform

    torch.manual_seed(0)
    x, w = torch.randn(8, 128), torch.randn(128, 512) * 0.1
    labels = torch.randint(0, 512, (8,), dtype=torch.int32)
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    loss, lse = tokamax_op(xt, labels.to("tpu"), wt, "mean")
    loss.backward()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    logits = xc @ wc
    expected = torch.nn.functional.cross_entropy(logits, labels.long())
    expected.backward()
    torch.testing.assert_close(loss.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.detach().cpu(), torch.logsumexp(logits, -1).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)
    # on CPU tensors too, as tokamax's reference comparison calls it
    cpu_loss, _ = tokamax_op(x, labels, w, "mean")
    torch.testing.assert_close(cpu_loss, expected.detach(), rtol=1e-5, atol=1e-5)
    # lowered for a TPU (what --target compiles), the kernel is Mosaic's, not interpreted
    specs = (jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.int32),
             jax.ShapeDtypeStruct((128, 512), jnp.float32))
    traced = jax.jit(_per_platform(linear_cross_entropy), static_argnums=(3,)).trace(*specs, "mean")
    assert "tpu_custom_call" in traced.lower(lowering_platforms=("tpu",)).as_text()


def test_jax_op_signatures_as_torchtpu_reports_them(tokamax_op):
    from torch_tpu._internal import pallas

    signature = tokamax_op._init_fn.__signature__
    assert signature.parameters["x"].annotation is torch.Tensor
    assert signature.parameters["reduction"].annotation is str
    assert signature.return_annotation == tuple[torch.Tensor, torch.Tensor]

    def maybe(x: jax.Array | None) -> jax.Array:
        return x

    callable_ = pallas.pallas.JaxCallable(name="maybe", jit_fn=jax.jit(maybe), trace_key="k")
    assert callable_.__signature__.parameters["x"].annotation == torch.Tensor | types.NoneType
    assert torch.equal(callable_(torch.ones(2)), torch.ones(2))
    assert pallas.pallas.JAX_TO_TORCH_DTYPE_MAP[jnp.dtype("bfloat16")] is torch.bfloat16


def test_tpu_sync_loader_finds_the_package_and_no_native_library():
    # what tpu-sync's torch_tpu_common_loader does before it opens TorchTPU's native library
    import torch_tpu

    loader = importlib.import_module("torch_tpu._loader")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader._said.clear()
        loader.load()
        loader.load()
    assert [type(w.message).__name__ for w in said] == ["NoNativeExtensionWarning"]
    assert "no native TorchTPU library beside torch_tpu.__file__" in str(said[0].message)
    common = pathlib.Path(torch_tpu.__file__).resolve().parent / "common"
    assert pathlib.Path(torch_tpu.__file__).is_file()
    assert not (common / "libpywrap_torch_tpu_common.so").exists() and not list(common.glob("glue_*"))
    assert loader.NATIVE_EXTENSION is None and torch.tpu.is_available()


def test_tpu_sync_sees_deferred_tensors_materialize():
    from torch_tpu._internal import execution_mode, sync

    with execution_mode.set_eager_mode(execution_mode.EagerMode.DEFER_AND_FUSE):
        shard = torch.arange(6.0, device="tpu").reshape(2, 3) * 2
        assert not sync.is_materialized(shard)
        torch.tpu.synchronize()
        assert sync.is_materialized(shard)
    assert torch.equal(shard.cpu(), torch.arange(6.0).reshape(2, 3) * 2)


def test_vllm_compiler_calls_the_backend_on_a_graph():
    # vLLM-TorchTPU's adaptor: one TpuBackend, called on a piecewise graph (made to return a
    # tuple) with the graph's fake example inputs, under a tracing context of their fake mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch_tpu._internal.compile._backend import TpuBackend

    def piece(x, w):
        return torch.relu(x @ w).sum(-1)

    graph = torch.fx.symbolic_trace(piece)
    output = graph.graph.output_node()
    output.args = ((output.args[0],),)
    graph.recompile()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    xt, wt = x.to("tpu"), w.to("tpu")
    with torch._guards.tracing(torch._guards.TracingContext(mode)):
        run = TpuBackend()(graph, [mode.from_tensor(xt), mode.from_tensor(wt)])
    (out,) = run(xt, wt)
    torch.testing.assert_close(out.cpu(), piece(x, w))


def test_vllm_worker_profiles_with_torchtpus_config(tmp_path):
    from torch_tpu._internal.profiler import TpuProfilerConfig

    config = TpuProfilerConfig(run_dir=str(tmp_path / "capture"), host_tracer_level=2, device_tracer_level=1,
                               python_tracer_level=0, experimental_options={})
    context = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1],
        on_trace_ready=torch.profiler.tensorboard_trace_handler(dir_name=str(tmp_path / "capture"), use_gzip=True),
        experimental_config=config,
    )
    context.__enter__()
    (torch.randn(8, 8, device="tpu") @ torch.randn(8, 8, device="tpu")).cpu()
    context.__exit__(None, None, None)
    assert list((tmp_path / "capture").rglob("*.xplane.pb")) and list((tmp_path / "capture").glob("*.pt.trace.json.gz"))


def test_vllm_runner_compiles_in_place_programs_with_the_tpu_backend():
    # vLLM-TorchTPU's runner compiles small programs that write into their inputs
    # (torch.compile(backend="tpu", fullgraph=True, dynamic=False)), as its async token
    # substitution and its mamba read-offset resets do
    compile_tpu = torch.compile(backend="tpu", fullgraph=True, dynamic=False)

    def substitute(input_ids, destinations, sources, next_tokens):
        keep = sources > -1
        new = next_tokens[torch.clamp_min(sources, 0)].to(input_ids.dtype)
        input_ids.scatter_(0, destinations, torch.where(keep, new, input_ids[destinations]))
        return input_ids

    def reset(offsets, rows):
        offsets.index_put_((rows,), torch.zeros((), dtype=offsets.dtype, device=offsets.device))

    ids = torch.arange(8)
    destinations, sources = torch.tensor([2, 5, 0, 1, 3, 4, 6, 7]), torch.tensor([1, 0, -1, -1, -1, -1, -1, -1])
    tokens = torch.tensor([70, 71])
    expected = substitute(ids.clone(), destinations, sources, tokens)
    on_tpu = ids.to("tpu")
    out = compile_tpu(substitute)(on_tpu, destinations.to("tpu"), sources.to("tpu"), tokens.to("tpu"))
    assert torch.equal(out.cpu(), expected) and torch.equal(on_tpu.cpu(), expected)
    offsets = torch.arange(1, 7, device="tpu")
    compile_tpu(reset)(offsets, torch.tensor([0, 3], device="tpu"))
    assert offsets.cpu().tolist() == [0, 2, 3, 0, 5, 6]
