"""What TorchTPU's benchmarks (``examples/benchmarks/``) call besides the guide's names: the
device helpers they measure through, their profiling sessions, the run modes of their harness,
``torch.ops.tpu.ragged_dot`` of their MoE layers, and the Google-only services they export to."""

from __future__ import annotations

import json

import pytest
import torch
from tpu_debug.core.errors import TraceActiveError, UnsupportedError


def test_device_utils_synchronize_count_and_compile_as_the_benchmarks_call_them():
    from torch_tpu._internal import execution_mode, sync
    from torch_tpu._internal.torchbenchmark import device_utils as benchmark_spelling
    from torch_tpu._internal.utils import device_utils

    assert benchmark_spelling.synchronize is device_utils.synchronize
    x = torch.randn(4, 8, device="tpu")
    with execution_mode.eager_mode(execution_mode.EagerMode.DEFER_AND_FUSE):
        y = (x * 2).relu()
        assert not sync.is_materialized(y)
        device_utils.synchronize("tpu", {"out": [y], "step": 3})  # a pytree, non-tensors skipped
        assert sync.is_materialized(y)
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2).relu())

    assert device_utils.cache_miss_count("tpu") == torch.tpu._get_cache_misses()
    assert device_utils.cache_miss_count("cuda") == 0

    def step(a, b):
        return (a @ b).softmax(-1)

    a, b = torch.randn(3, 5), torch.randn(5, 2)
    for dynamic in (False, True):
        compiled = device_utils.torch_compile(step, "tpu", dynamic=dynamic)
        torch.testing.assert_close(compiled(a.to("tpu"), b.to("tpu")).cpu(), step(a, b))
    device_utils.clear_cache("tpu")
    device_utils.reset_peak_memory_stats("tpu")

    class Client:  # what an XProf client gives for a session's memory profile
        def get_profile_data(self, tool, session_id):
            assert (tool, session_id) == ("memory_profile.json", "s1")
            summary = {"profileSummary": {"peakStats": {"peakBytesInUse": str(3 * 2**20)}}}
            return "application/json", json.dumps({"memoryProfilePerAllocator": {"0": summary}}).encode()

    assert device_utils.get_peak_memory_hbm("tpu", "s1", Client()) == 3.0
    assert device_utils.get_peak_memory_hbm("tpu") == -1.0  # no session: TorchTPU's answer
    assert device_utils.get_peak_memory_hbm("cpu") > 0
    assert device_utils.get_peak_host_compilation_memory_mb("tpu") is None
    with pytest.raises(ValueError, match=r"^Unsupported device: xla_cuda \(device_utils takes"):
        device_utils.synchronize("xla_cuda", y)


def test_xprof_session_writes_a_profile_of_its_spans_and_names_it(tmp_path):
    from torch_tpu._internal.profiler import xprof_adapter
    from torch_tpu._internal.shims.xprof import traceme, xprof_analysis_client, xprof_session

    assert xprof_adapter.TraceMe is traceme.TraceMe
    session = xprof_session.XprofSession(tmp_path)
    session.start_session(host_trace_level=3, enable_python_tracer=True, host_cpu_profile=True)
    x = torch.randn(8, device="tpu")
    with traceme.TraceMe("Warmup", step_num=0):
        torch.tpu.synchronize()
        (x + 1).cpu()
    session_id = session.end_session_and_get_session_id()
    run = tmp_path / "plugins" / "profile" / session_id
    assert session_id and list(run.glob("*.xplane.pb"))

    again = xprof_adapter.XprofSession(tmp_path)
    again.start_session(host_trace_level=2)
    url = again.end_session_and_get_url()
    assert url.startswith("file://") and url.endswith(url.rsplit("/", 1)[-1]) and url.rsplit("/", 1)[-1] != session_id
    with pytest.raises(TraceActiveError, match=r"no session runs; call start_session\(\) first"):
        again.end_session_and_get_session_id()
    with pytest.raises(UnsupportedError, match=r"^XprofAnalysisClient needs Google's XProf service"):
        xprof_analysis_client.XprofAnalysisClient()


def test_the_harness_run_modes_set_the_eager_mode():
    from torch_tpu._internal import execution_mode

    before = execution_mode.eager_mode
    try:
        for mode in (execution_mode.EagerMode.DEFER_NEVER, execution_mode.EagerMode.DEFER_AND_FUSE,
                     execution_mode.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
            execution_mode.eager_mode = mode
            assert execution_mode.eager_mode == mode
            x = torch.arange(6.0, device="tpu")
            assert (x * x).sum().item() == 55.0
    finally:
        execution_mode.eager_mode = before
    assert execution_mode.eager_mode == before


def test_tpu_ragged_dot_is_the_torch_tpu_op_on_cpu_and_tpu_tensors():
    torch.tpu  # noqa: B018 (the device registered, which defines the ops)
    lhs, rhs = torch.randn(7, 4), torch.randn(3, 4, 5)
    group_sizes = torch.tensor([2, 0, 4], dtype=torch.int32)
    expected = torch.cat([lhs[:2] @ rhs[0], lhs[2:6] @ rhs[2], torch.zeros(1, 5)])
    torch.testing.assert_close(torch.ops.tpu.ragged_dot(lhs, rhs, group_sizes), expected)
    on_tpu = torch.ops.tpu.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), group_sizes.to("tpu"))
    torch.testing.assert_close(on_tpu.cpu(), expected, rtol=1e-5, atol=1e-5)
    # the public API's spelling of the same op
    by_public_name = torch.tpu.ops.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), group_sizes.to("tpu"))
    torch.testing.assert_close(by_public_name.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_benchmark_records_are_data_and_the_exports_say_what_to_do():
    from torch_tpu._internal.benchmarks import export_adapter
    from torch_tpu._internal.distributed import gpu_env
    from torch_tpu._internal.shims.mlcompass import benchmark_data, export_lib_borg

    data = benchmark_data.BenchmarkData(test_name="torch_tpu/v7_1x1x1/test_x/linear", wall_time=1.5,
                                        metrics={"post_warmup_step_time_seconds": 0.1}, succeeded=True)
    data.micro_result_key = "batch_size_1"
    assert (data.test_name, data.metrics["post_warmup_step_time_seconds"], data.micro_result_key) == (
        "torch_tpu/v7_1x1x1/test_x/linear", 0.1, "batch_size_1")
    with pytest.raises(UnsupportedError, match=r"^export_lib_borg.export_results_to_mlcompass needs Google's MLCompass .* "
                                               r"leave --mlcompass_tracking_id unset"):
        export_lib_borg.export_results_to_mlcompass(data=data)
    with pytest.raises(UnsupportedError, match=r"^export_adapter.export_benchmark_results needs Google's MLCompass"):
        export_adapter.export_benchmark_results(spec_name="x", metrics={}, succeeded=True)
    with pytest.raises(UnsupportedError, match=r"^gpu_env.run_in_workers needs CUDA devices"):
        gpu_env.run_in_workers(print)


def test_handle_test_main_runs_the_test_runner():
    from torch_tpu._internal.distributed import multiprocessing
    from torch_tpu._internal.shims.pyglib.contrib.g3_multiprocessing import g3_multiprocessing

    for module in (multiprocessing, g3_multiprocessing):
        assert module.handle_test_main(lambda *argv: ("ran", argv), "a") == ("ran", ("a",))
