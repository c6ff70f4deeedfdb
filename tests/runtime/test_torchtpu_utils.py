"""TorchTPU's utilities with their behaviour (runtime/tpu_utils.py, runtime/torchtpu/): assert_close's
modes against the rules TorchTPU documents, eager-mode properties and contexts, sync, cache and
HBM telemetry from the runtime's own counters, precision and excess precision against CPU PyTorch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch_tpu._internal import execution_mode as em
from torch_tpu._internal import profiler, sync
from torch_tpu._internal.utils import utils
from tpu_debug.runtime import lazy
from tpu_debug.runtime.config import config

Mode = utils.CheckValueMode


def _passes(actual, expected, *args, **kwargs) -> bool:
    try:
        utils.assert_close(actual, expected, *args, **kwargs)
    except AssertionError:
        return False
    return True


def test_assert_close_modes_follow_torchtpus_rules():
    expected = torch.tensor([0.0, 0.5, 2.0, 100.0])
    err = torch.tensor([5e-6, 2e-3, 5e-3, 0.5])
    actual = expected + err
    rtol, atol = 1e-2, 1e-2
    # LOOSE: |a - e| <= atol + rtol |e| elementwise, PyTorch's rule (rtol, atol positional)
    loose = bool((err <= atol + rtol * expected.abs()).all())
    assert _passes(actual, expected, rtol, atol) is loose is True
    # STRICT: within atol and within rtol |e| (+1e-7) both: 0.5 > atol fails, and the 5e-6
    # error at 0 is over rtol * 0 + 1e-7
    strict = bool(((err <= atol) & (err <= rtol * expected.abs() + 1e-7)).all())
    assert _passes(actual, expected, rtol, atol, check_value=Mode.STRICT) is strict is False
    assert _passes(actual[1:3], expected[1:3], rtol, atol, check_value=Mode.STRICT)
    # SKIP: values are not compared; shapes and dtypes are
    assert _passes(actual * 10, expected, check_value=Mode.SKIP)
    assert not _passes(actual[:2], expected, check_value=Mode.SKIP)
    # check_dtype=False compares in the promoted dtype
    assert not _passes(expected.double(), expected)
    assert _passes(expected.double(), expected, check_dtype=False)


def test_assert_close_reports_the_preamble_the_largest_mismatch_and_what_passes():
    expected = torch.zeros(3, 4)
    actual = expected.clone()
    actual[2, 1] = 0.25
    actual[0, 3] = 0.01
    with pytest.raises(AssertionError, match="^step 7\n") as info:
        utils.assert_close(actual.to("tpu"), expected, 1e-3, 1e-3, preamble="step 7",
                           check_value=Mode.STRICT)
    text = str(info.value)
    assert text.splitlines()[0] == "step 7"
    assert "Mismatched elements: 2 / 12" in text
    first = text.split("Largest mismatches:\n")[1].splitlines()[0]
    assert first.startswith("    at index (2, 1), expected=0.0, actual=0.25")
    found = re.search(r"rtol>=(\S+) and atol>=(\S+)$", text)
    assert float(found.group(2)) >= 0.25 and _passes(actual, expected, float(found.group(1)), float(found.group(2)),
                                                       check_value=Mode.STRICT) is False  # rtol can't cover a 0
    assert _passes(actual, expected, 1e9, float(found.group(2)))


def test_op_tracer_pformat_is_torchtpus_name_for_the_report():
    with utils.OpTracer() as tracer:
        torch.ones(3, device="tpu").mul(2.0).sum()
    assert tracer._pformat() == torch.tpu.utils.pformat_op_tracer(tracer)
    assert "  aten.sum.default: 1" in tracer._pformat().splitlines()
    # DeepSeek's trace example: utils.OpTracer, then tracer_utils.pformat_op_tracer
    from torch_tpu._internal.utils import tracer_utils
    from torch_tpu._internal.utils import utils as tpu_utils

    with tpu_utils.OpTracer() as traced:
        torch.ones(2, device="tpu").add(1.0)
    assert "  aten.add.Tensor: 1" in tracer_utils.pformat_op_tracer(traced).splitlines()


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_activation_tracer_logs_each_modules_calls_as_cpu_pytorch_computes_them():
    # Gemma 3's model test: ActivationTracer on two implementations, outputs compared per module
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 4), _Block())
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), _Block()).to("tpu")
    model.load_state_dict(cpu.state_dict())
    x = torch.randn(5, 3)
    with utils.ActivationTracer(model) as trace:
        model(x.to("tpu").requires_grad_()).sum().backward()
    block = model[1]
    called = [model, model[0], block, block.layers[0], block.layers[1]]
    assert [e["module"] for e in trace.forward_pre_log] == called
    assert [e["module"] for e in trace.forward_log] == [model[0], block.layers[0], block.layers[1], block, model]
    # a ModuleList's children share its depth (TorchTPU's rule): the block's linears are at 2
    assert [e["depth"] for e in trace.forward_log] == [1, 2, 2, 1, 0]
    events = sorted(trace.forward_pre_log + trace.forward_log, key=lambda e: e["idx"])
    assert [e["idx"] for e in events] == list(range(10)) and events[2]["module"] is model[0]
    h = cpu[0](x)
    a = cpu[1].layers[0](h)
    expected = [h, a, cpu[1].layers[1](torch.relu(a))]  # each Linear's own output
    for event, value in zip(trace.forward_log[:3], expected):
        torch.testing.assert_close(event["output"].cpu(), value)
    assert trace.forward_log[0]["args"][0].device.type == "tpu"
    assert trace.backward_pre_log[0]["module"] is model
    torch.testing.assert_close(trace.backward_pre_log[0]["grad_output"][0].cpu(), torch.ones(5, 4))
    assert {id(e["module"]) for e in trace.backward_log} <= {id(m) for m in called}
    model(x.to("tpu"))  # hooks are gone after the block
    assert len(trace.forward_log) == 5


def test_pformat_activation_tracer_draws_the_calls_as_a_tree():
    # the Hugging Face trace_activations example: ActivationTracer, then tracer_utils' tree
    import numpy as np
    from torch_tpu._internal.utils import tracer_utils

    values = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    stats = f"Min:1.00 Max:6.00 Mean:3.50 Var:{np.var(values):.2f}"  # the values' own variance
    assert utils.get_tensor_summary(torch.tensor(values, requires_grad=True)) == f"(2, 3) {stats} Grad:Y float32 cpu"
    assert utils.get_tensor_summary(torch.tensor(values, device="tpu"), data=False) == "(2, 3) float32 tpu:0"
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).to("tpu")
    with utils.ActivationTracer(model) as trace:
        model(torch.tensor(values, device="tpu"))
    lines = tracer_utils.pformat_activation_tracer(trace).splitlines()
    assert lines[:4] == ["ActivationTracer Collected Data:", "+- Sequential (#0)",
                         f"|  Args[0]:   (2, 3) {stats} Grad:N float32 tpu:0", "|"]
    assert lines[4:6] == ["|  +- Linear (#1)", f"|  |  Args[0]:   (2, 3) {stats} Grad:N float32 tpu:0"]
    assert "|  +- Linear END (#2)" in lines and "|  +- ReLU (#3)" in lines
    assert lines[-2].startswith("|  Output:    (2, 2) ") and lines[-1] == "+- Sequential END (#5)"


def test_eager_mode_property_contexts_and_cpu_fallback():
    before = em.eager_mode
    with em.eager_mode(em.EagerMode.DEFER_AND_FUSE):  # the guide's spelling
        assert em.get_eager_mode() is em.EagerMode.DEFER_AND_FUSE is torch.tpu.eager_mode
        with torch.tpu.set_eager_mode(em.EagerMode.DEFER_NEVER):
            assert em.eager_mode is em.EagerMode.DEFER_NEVER
        assert em.eager_mode is em.EagerMode.DEFER_AND_FUSE
    assert em.eager_mode is before
    em.eager_mode = em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    try:
        assert config.eager_mode == "defer_never_and_launch_blocking"
    finally:
        em.eager_mode = before
    # execution_mode.set_eager_mode called alone sets the mode (gpt-oss's training example);
    # in a with block it puts back the mode the call found; torch.tpu's waits for the with
    try:
        em.set_eager_mode(em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)
        assert em.eager_mode is em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):
            assert em.eager_mode is em.EagerMode.DEFER_AND_FUSE
        assert em.eager_mode is em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        torch.tpu.set_eager_mode(em.EagerMode.DEFER_AND_FUSE)
        assert em.eager_mode is em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    finally:
        em.eager_mode = before
    fallback = config.cpu_fallback
    with em.cpu_fallback_mode(not fallback):
        assert em.enable_cpu_fallback is (not fallback)
    assert config.cpu_fallback == fallback


def test_synchronize_runs_what_is_pending_and_computation_mlir_shows_it():
    x = torch.full((4,), 2.0, device="tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = x * 3.0 + 1.0
        assert not sync.is_materialized(y)
        text = sync.computation_mlir(y)
        assert "func.func" in text and "stablehlo.multiply" in text and "stablehlo.add" in text
        sync.synchronize([y], wait=True)
        assert sync.is_materialized(y) and lazy.pending_ops() == 0
    assert torch.equal(y.cpu(), torch.full((4,), 7.0))
    assert "stablehlo.multiply" not in sync.computation_mlir(y)  # computed: nothing left to run


def test_cache_stats_count_the_runtimes_lookups():
    torch.tpu._clear_cache()
    a = torch.ones(7, 3, device="tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        before = torch.tpu._get_cache_stats()
        torch.tanh(a)
        mid = torch.tpu._get_cache_stats()
        torch.tanh(a)
        after = torch.tpu._get_cache_stats()
    assert (mid.num_cache_reqs - before.num_cache_reqs, mid.num_cache_hits - before.num_cache_hits) == (1, 0)
    assert (after.num_cache_reqs - mid.num_cache_reqs, after.num_cache_hits - mid.num_cache_hits) == (1, 1)
    assert torch.tpu._get_cache_misses() == after.num_cache_reqs - after.num_cache_hits == after.num_compilations
    tanh = [e for e in after.per_entry_stats if e.name.startswith("tanh")]
    assert [e.read_count for e in tanh] == [2] and tanh[0].compilation_duration > 0
    torch.tpu._clear_cache()
    assert torch.tpu._get_cache_stats().num_cache_reqs == 0


def test_hbm_usage_summary_counts_the_bytes_a_tensor_holds():
    before = torch.tpu._hbm_usage_summary()
    held = torch.zeros(1000, 25, device="tpu") + 1.0  # 100,000 bytes of float32
    after = torch.tpu._hbm_usage_summary()
    assert after.live_bytes - before.live_bytes >= held.numel() * 4
    assert "live buffers" in str(after) and after.device.startswith("tpu:0 (XLA ")
    del held


def test_precision_context_sets_and_restores_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    with torch.tpu.precision(torch.tpu.Precision.HIGH):
        assert torch.tpu.precision.get() == "high" == torch.get_float32_matmul_precision()
    assert torch.get_float32_matmul_precision() == before


def test_excess_precision_flag_against_cpu_pytorch():
    """The precision notebook's check: bfloat16 (1 + 2**-6) x (1 + 2**-7), then times float32 1.
    CPU PyTorch rounds the bfloat16 product (its bit 13 dropped). XLA computes a bfloat16 dot
    in float32 and, with excess precision allowed, may skip the rounding: it does for a JAX
    function whose dot and multiply it fuses (the runtime's own matmul lowering rounds
    explicitly), so the flag is checked on one, run as a runtime op."""
    import jax
    import jax.numpy as jnp
    from tpu_debug.runtime.pallas import jax_op

    def mul_add(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        return (a @ b).astype(jnp.float32) * c

    op = jax_op("tpu_debug_test::excess_mul_add", mul_add)
    eye = torch.eye(16, dtype=torch.bfloat16)
    a, b, one = eye * (1 + 2**-6), eye * (1 + 2**-7), torch.tensor([1.0])
    rounded = (a @ b * one)[0, 0]  # CPU PyTorch: the bfloat16 product rounded, then float32
    wide = (a.float() @ b.float() * one)[0, 0]  # the product kept in float32
    assert rounded != wide
    args = [t.to("tpu") for t in (a, b, one)]
    try:
        for allowed, want in ((False, rounded), (True, wide)):
            torch.backends.tpu.allow_excess_precision = allowed
            assert torch.tpu.allow_excess_precision is allowed
            torch.tpu._clear_cache()  # the flag applies to programs compiled after it is set
            assert op(*args)[0, 0].cpu() == want
    finally:
        torch.backends.tpu.allow_excess_precision = True


def test_profile_writes_the_device_trace_where_the_handler_says(tmp_path):
    handler = profiler.xprof_trace_handler(dir_name=tmp_path / "prof")
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.TPU],
                          on_trace_ready=handler):
        (torch.ones(4, device="tpu") * 2).cpu()
    assert list((tmp_path / "prof").rglob("*.xplane.pb"))
    assert list((tmp_path / "prof").glob("trace.*.json"))


def test_benchmarking_writes_each_value_and_each_statistic_as_tensorboard_scalars(tmp_path):
    # Llama 3's and gpt-oss's training examples end with their step times written this way: each
    # value under <name>/Value_<unit> at its index, each statistic of the profile under its tag,
    # the statistics numpy's
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from torch_tpu._internal.utils import benchmarking

    times = [0.31, 0.29, 0.35, 0.30, 0.42, 0.28]
    profile = benchmarking.METRIC_PROFILES["Training/StepTime"]
    writer = SummaryWriter(str(tmp_path))
    benchmarking.record_tensorboard_metrics(writer, profile, times)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    values = [(e.step, e.value) for e in events.Scalars("Training/StepTime/Value_s")]
    assert values == [(i, pytest.approx(t)) for i, t in enumerate(times)]
    expected = {"Mean": np.mean(times), "Median_p50": np.median(times), "P90": np.percentile(times, 90),
                "P95": np.percentile(times, 95), "P99": np.percentile(times, 99), "StdDev": np.std(times)}
    for stat, value in expected.items():
        (event,) = events.Scalars(f"Training/StepTime/{stat}_s")
        assert event.value == pytest.approx(value, rel=1e-6)  # float32 in the event file
    stat = benchmarking.Stat.MEDIAN
    benchmarking.assert_metric_within_threshold(times, profile, stat, 0.30, 5, benchmarking.Comparison.LESS)
    with pytest.raises(AssertionError, match="Training/StepTime"):
        benchmarking.assert_metric_within_threshold(times, profile, stat, 0.25, 5, benchmarking.Comparison.LESS)


def test_api_stage_decorators_warn_once_as_torchtpus_policy_says():
    # TorchTPU's API policy: an experimental API warns once per process (UserWarning), a
    # deprecated one once (DeprecationWarning), a stable one never; each records its stage
    import warnings

    from torch_tpu._internal.utils import annotations

    @annotations.experimental("the signature may change")
    def fast(x):
        return x + 1

    @annotations.deprecated("2.13", "use torch.accelerator.synchronize()")
    def old(x):
        return x * 2

    def plain(x):
        return x

    assert annotations.stable()(plain) is plain and plain.__tt_api_stage__ == "Stable"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert [fast(1), fast(2), old(3), old(4), plain(5)] == [2, 3, 6, 8, 5]
    assert [(w.category, str(w.message)) for w in seen] == [
        (UserWarning, "fast is experimental and subject to change: the signature may change"),
        (DeprecationWarning, ("old is deprecated as of TorchTPU 2.13 and will be removed in a future release: "
                              "use torch.accelerator.synchronize()")),
    ]
    assert (fast.__name__, fast.__tt_api_stage__, fast.__tt_stage_reason__) == (
        "fast", "Experimental", "the signature may change")
    assert (old.__tt_api_stage__, old.__tt_deprecated_version__) == ("Deprecated", "2.13")
    with pytest.raises(ValueError, match=r"^@experimental requires a non-empty reason string\.$"):
        annotations.experimental(" ")
    with pytest.raises(ValueError, match=r"^@deprecated requires a non-empty version string \(e\.g\. version='2\.13'\)\.$"):
        annotations.deprecated("", "why")
