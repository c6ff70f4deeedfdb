"""TorchTPU's compile backend, graph compilers and debug container (runtime/torchtpu/compile.py),
its defer modes, profiler entry points, model description, named spans, eager-state reset and
layout hint, each against what it does on this runtime."""

from __future__ import annotations

import json
import os
import socket
import warnings

import pytest
import torch
from tpu_debug.core.errors import TpuArgumentError
from tpu_debug.runtime import lazy


def test_the_tpu_backend_fills_a_debug_container():
    from torch_tpu._internal import compile as compile_lib

    torch._dynamo.reset()
    debugs = []

    def simple(x, y):
        return (x + y) * 2.0

    compiled = torch.compile(simple, backend="tpu", options={"debug_callback": debugs.append})
    x = torch.tensor([1.0, 2.0, 3.0], device="tpu", requires_grad=True)
    y = torch.tensor([4.0, 5.0, 6.0], device="tpu", requires_grad=True)
    out = compiled(x, y)
    out.sum().backward()
    assert torch.equal(out.detach().cpu(), torch.tensor([10.0, 14.0, 18.0]))
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
    (debug,) = debugs
    assert isinstance(debug, compile_lib.TpuCompileDebug)
    assert repr(debug) == ("TpuCompileDebug(pre_fx=1, post_fx_fwd=1, post_fx_bwd=1, stablehlo_fwd=1, stablehlo_bwd=1, "
                           "executables=2)")
    assert "torch.ops.aten.add" in debug.post_autograd_fx_forward_code[0]
    assert "stablehlo.add" in debug.stablehlo_forward_text[0] and "stablehlo.multiply" in debug.stablehlo_forward_text[0]
    assert "=== StableHLO Backward ===" in str(debug)
    assert "HloModule" in debug.compiled_executables[0].as_text()
    assert str(compile_lib.TpuCompileDebug()) == "TpuCompileDebug(empty)"
    with pytest.raises(TpuArgumentError, match=r"TpuBackend: unknown option\(s\) 'fast'; it takes async_compile"):
        compile_lib.TpuBackend()(torch.fx.symbolic_trace(simple), [x, y], options={"fast": True})


def test_the_graph_compilers_compile_a_graph():
    from torch_tpu._internal import compile as compile_lib

    debug = compile_lib.TpuCompileDebug()
    static = compile_lib.compiler.StaticCompiler(debug=debug)
    dynamic = compile_lib.dynamic_compiler.DynamicCompiler(debug=debug, num_buckets=2)
    split = compile_lib.split_compiler.SplitCompiler(static)
    assert static._debug is debug and dynamic.static_compiler._debug is debug and split._debug is debug
    assert compile_lib.dynamic.dynamic_compiler.DynamicCompiler is type(dynamic)

    def f(a, b):
        return torch.relu(a @ b) + 1

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    for compiler in (static, dynamic, split):
        run = compiler(torch.fx.symbolic_trace(f), [a.to("tpu"), b.to("tpu")])
        torch.testing.assert_close(run(a.to("tpu"), b.to("tpu")).cpu(), f(a, b))
    # the benchmarks' trainer adapter names the inputs TorchTPU may donate to the program
    run = static(torch.fx.symbolic_trace(f), [a.to("tpu"), b.to("tpu")], donated_inputs=[0])
    torch.testing.assert_close(run(a.to("tpu"), b.to("tpu")).cpu(), f(a, b))
    assert not compile_lib.compiler.has_dynamic_symints([a, (b, 3)])


def test_defer_modes_are_the_eager_modes():
    from torch_tpu._internal import execution_mode as em
    from torch_tpu._internal import execution_mode_impl

    before = lazy.eager_mode()
    try:
        assert em.EagerMode.INTERNAL_DEFER_ALL is em.EagerMode.DEFER_AND_FUSE
        # the deprecated mode of the guide's deferred-execution table defers and fuses
        assert em.EagerMode.DEFER_AND_FUSE_WITH_O1 is em.EagerMode.DEFER_AND_FUSE
        with torch.tpu.set_eager_mode(em.EagerMode.DEFER_AND_FUSE_WITH_O1):
            z = torch.ones(3, device="tpu") + 1
            assert lazy.pending_ops() > 0
        assert torch.equal(z.cpu(), torch.full((3,), 2.0))
        em.set_defer_mode(em.DeferMode.NEVER)
        assert torch.tpu.eager_mode is em.EagerMode.DEFER_NEVER and em.get_defer_mode() is em.DeferMode.NEVER
        with em.defer_mode(em.DeferMode.ALL):
            y = torch.ones(3, device="tpu") * 2
            assert lazy.pending_ops() > 0 and execution_mode_impl.get_defer_mode() is em.DeferMode.ALL
        assert torch.tpu.eager_mode is em.EagerMode.DEFER_NEVER and torch.equal(y.cpu(), torch.full((3,), 2.0))
        em.set_defer_mode(em.DeferMode.DEFAULT)
        assert torch.tpu.eager_mode.value == execution_mode_impl.default_mode()
        execution_mode_impl.enable_cpu_fallback(True)
        assert execution_mode_impl.is_cpu_fallback_enabled() and em.enable_cpu_fallback
        execution_mode_impl.enable_cpu_fallback(False)
        with pytest.raises(TpuArgumentError, match=r"not one of DeferMode.DEFAULT, ALL, NEVER"):
            em.set_defer_mode("never")
    finally:
        lazy.set_mode(before)


def test_reset_eager_state_runs_what_is_pending():
    from torch_tpu._internal import execution_mode as em
    from torch_tpu._internal import execution_mode_impl, testing

    em.eager_mode = em.EagerMode.DEFER_AND_FUSE
    y = torch.arange(4.0, device="tpu") + 1
    assert lazy.pending_ops() > 0
    testing.reset_eager_state()
    assert lazy.pending_ops() == 0 and torch.tpu.eager_mode.value == execution_mode_impl.default_mode()
    assert torch.equal(y.cpu(), torch.arange(4.0) + 1)


def test_format_model_describes_a_model_and_a_function():
    from torch_tpu._internal.utils import utils

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("tpu")
    x = torch.randn(4, 3, device="tpu")
    text = utils.format_model(model, x, params=True, pt=True, aten=True, shlo=True)
    memory = utils.model_memory(model)
    assert memory == 8 * 2 * 4 / 1024**3  # 8 parameters, each with a gradient, float32
    assert text.startswith(f"Parameters: 8, Trainable: 8\nEstimated Memory: {memory:.3f} GB")
    assert "Linear(in_features=3, out_features=2, bias=True)" in text
    assert "aten.addmm.default: 1" in text and "stablehlo.dot_general" in text
    shown = utils.format_model(lambda a: torch.sin(a) * 2, x, pt=True)
    assert "torch.ops.aten.sin.default" in shown and "torch.ops.aten.mul.Tensor" in shown


def test_profile_writes_an_xplane_for_each_activity(tmp_path):
    from torch_tpu import profiler as public_profiler
    from torch_tpu._internal import profiler
    from torch_tpu._internal.profiler import _impl, profiler_api

    assert public_profiler.TpuProfilerConfig is profiler.TpuProfilerConfig is torch.tpu.profiler.TpuProfilerConfig
    assert torch.profiler.xprof_trace_handler is profiler.xprof_trace_handler
    for activities in ([profiler.ProfilerActivity.CPU], [profiler.ProfilerActivity.TPU]):
        out = tmp_path / activities[0].name
        _impl._profile_state.reset()
        with profiler.profile(activities=activities, on_trace_ready=profiler.xprof_trace_handler(dir_name=out)):
            assert _impl._profile_state.active
            (torch.randn(16, 16, device="tpu") @ torch.randn(16, 16, device="tpu")).cpu()
        (run,) = os.listdir(out / "plugins" / "profile")
        assert any(f.endswith(".xplane.pb") for f in os.listdir(out / "plugins" / "profile" / run))
        assert bool(list(out.glob("trace.*.json"))) is (activities[0] is profiler.ProfilerActivity.CPU)
    assert profiler_api._get_profile_options([profiler.ProfilerActivity.TPU]) == profiler.ProfileOptions(0, 1, 0)
    assert profiler_api._get_profile_options([profiler.ProfilerActivity.CPU]) == profiler.ProfileOptions(2, 0, 1)
    assert profiler_api._get_profile_options([]) == profiler.ProfileOptions(0, 0, 0)
    gpu = profiler.profile(activities=[profiler.ProfilerActivity.GPU],
                           on_trace_ready=profiler.xprof_trace_handler(dir_name=tmp_path / "gpu"))
    with pytest.raises(TpuArgumentError, match=r"^GPU profiling is not supported\."), gpu:
        pass


def test_the_profiler_server_starts_and_stops():
    from torch_tpu._internal import profiler
    from torch_tpu._internal.profiler import _impl

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _impl._profiler_server is None
    profiler.start_server(port)
    try:
        assert _impl._profiler_server is not None
        with pytest.raises(TpuArgumentError, match=r"a profiler server already runs"):
            profiler.start_server(port)
    finally:
        _impl.stop_server()
    assert _impl._profiler_server is None


def test_traceme_spans_reach_the_profilers(tmp_path):
    from torch_tpu._internal.shims.xprof import traceme

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
            traceme.TraceMe("decode step 3"):
        (torch.ones(4, device="tpu") + 1).cpu()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    names = {e.get("name") for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert "decode step 3" in names


def test_the_layout_hint_is_checked_and_said_to_change_nothing():
    from torch_tpu._internal.device_utils.annotations import LayoutContext, TpuLayout

    layout = TpuLayout(minor_to_major=[1, 0], tiles=[[8, 128]])
    with pytest.raises(TypeError, match=r"^layout must be an instance of TpuLayout$"):
        LayoutContext([1, 0])
    LayoutContext._said = False
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with LayoutContext(layout):
            x = torch.arange(6.0).reshape(2, 3).to("tpu")
    assert len(said) == 1 and "changes nothing here" in str(said[0].message)
    assert torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3))
