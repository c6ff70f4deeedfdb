"""``torch.profiler`` asked for the `tpu` device's activity (runtime/profiler.py): what a user
sees for a small matmul loop, and the one line saying where the device's timeline is.

PyTorch's profiler takes device events only from C++ (a kineto plugin or PrivateUse1 profiler
stubs), so a session asking for ``ProfilerActivity.TPU`` holds no device event here; the
reference for "no device event" is the chrome trace's own JSON: every event is a host
thread's (``cpu_op``, ``user_annotation``) or the profiler's metadata.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from tpu_debug.runtime.profiler import NoDeviceTraceWarning, TpuProfilerConfig

TPU = ProfilerActivity.PrivateUse1  # ProfilerActivity.TPU once PrivateUse1 is renamed
HOST_CATEGORIES = {"cpu_op", "user_annotation", "python_function", "Trace", None}
POINTER = ("For the device's timeline use tpu_debug.trace(tensorboard=True) and `tpu-debug tensorboard`, or "
           "experimental_config=torch.tpu.profiler.TpuProfilerConfig(run_dir=...)")
LEAD = ("torch.profiler records no tpu device activity: tpu_debug's runtime is a Python backend, and PyTorch "
        "takes a device's events only from a C++ profiler plugin; ")
WITH_CPU = LEAD + "its compiles, runs and copies are the host ranges tpu::<name> of this profile. " + POINTER
WITHOUT_CPU = (LEAD + "without ProfilerActivity.CPU this profile is empty; with it, the runtime's compiles, runs "
               "and copies are host ranges tpu::<name>. " + POINTER)


def matmul_loop(tpu) -> None:
    x, w = torch.randn(32, 32, device=tpu), torch.randn(32, 32, device=tpu)
    for _ in range(3):
        x = torch.tanh(x @ w)
    x.cpu()


def trace_events(prof, path) -> list[dict]:
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_the_tpu_activity_is_named_tpu():
    assert TPU is ProfilerActivity.TPU
    assert TPU in torch.profiler.supported_activities()


def test_tpu_alone_records_nothing_and_says_where_the_timeline_is(tpu, tmp_path):
    with pytest.warns(NoDeviceTraceWarning, match=f"^{re.escape(WITHOUT_CPU)}$") as heard, \
            profile(activities=[TPU]) as prof:
        matmul_loop(tpu)
    assert len(heard) == 1 and heard[0].filename == __file__  # the user's line, not the profiler's
    events = trace_events(prof, tmp_path / "trace.json")
    assert not [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    assert len(prof.key_averages()) == 0


def test_cpu_and_tpu_hold_the_runtime_s_host_ranges_and_no_device_event(tpu, tmp_path):
    with pytest.warns(NoDeviceTraceWarning, match=f"^{re.escape(WITH_CPU)}$"), \
            profile(activities=[ProfilerActivity.CPU, TPU]) as prof:
        matmul_loop(tpu)
    events = trace_events(prof, tmp_path / "trace.json")
    assert {e.get("cat") for e in events} <= HOST_CATEGORIES
    runs = [e for e in events if e.get("name") == "tpu::mm"]
    assert len(runs) == 3 and {e["cat"] for e in runs} == {"user_annotation"}
    table = prof.key_averages().table()
    assert "tpu::mm" in table and "aten::mm" in table
    assert "TPU" not in table.splitlines()[1]  # no device-time column
    assert all(avg.device_time_total == 0 for avg in prof.key_averages())


def test_the_default_activities_ask_for_the_device_and_are_told(tpu):
    with pytest.warns(NoDeviceTraceWarning, match=f"^{re.escape(WITH_CPU)}$"), profile():
        matmul_loop(tpu)


def test_a_session_that_ran_nothing_on_tpu_is_not_told_anything():
    # a CPU job's profile (torch.profiler's default activities include TPU once it is registered)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoDeviceTraceWarning)
        with profile() as prof:
            torch.ones(8, 8) @ torch.ones(8, 8)
    assert "aten::mm" in prof.key_averages().table()


def test_cpu_alone_is_not_told_anything(tpu):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoDeviceTraceWarning)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            matmul_loop(tpu)
    assert "tpu::mm" in prof.key_averages().table()


def test_a_config_writing_a_jax_trace_is_the_device_s_timeline_so_nothing_is_said(tpu, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoDeviceTraceWarning)
        with profile(activities=[ProfilerActivity.CPU, TPU],
                     experimental_config=TpuProfilerConfig(run_dir=tmp_path / "jax")):
            matmul_loop(tpu)
    assert list((tmp_path / "jax").rglob("*.xplane.pb"))


def test_a_config_without_a_jax_trace_is_told(tpu):
    with pytest.warns(NoDeviceTraceWarning, match=f"^{re.escape(WITH_CPU)}$"), \
            profile(activities=[ProfilerActivity.CPU, TPU], experimental_config=TpuProfilerConfig()):
        matmul_loop(tpu)


def test_legacy_use_device_tpu_records_a_cpu_profile_instead_of_failing_at_each_range(tpu, capfd):
    with pytest.warns(NoDeviceTraceWarning, match=f"^{re.escape(WITH_CPU)}$"), \
            torch.autograd.profiler.profile(use_device="tpu") as prof:
        matmul_loop(tpu)
    # PyTorch's PrivateUse1 stubs, unregistered, fail at every range (a C++ warning on stderr)
    assert "PrivateUse1 used in profiler but not enabled" not in capfd.readouterr().err
    averages = {avg.key: avg for avg in prof.key_averages()}
    assert averages["tpu::mm"].count == 3
    assert 0 < averages["aten::mm"].cpu_time_total < 60e6  # microseconds: a real time, not garbage
