"""torch.profiler on the tpu device (runtime/profiler.py): a profiled training step's
chrome trace holds the runtime's compiles, program runs and copies, nested in the aten
ops that caused them. The reference is a recording probe subscribed beside the
profiler (what the runtime reported) and the ops the test ran itself.

Perfetto's trace processor cannot be downloaded in this environment, so the chrome
trace is read as the JSON it is (the format Perfetto and chrome://tracing load).
"""

from __future__ import annotations

import collections
import json

import jax.profiler
import pytest
import torch
from tpu_debug.runtime import clear_cache, probes
from tpu_debug.runtime.profiler import ProfilerProbe

from tpu_debug.core.errors import TpuArgumentError, TraceActiveError

NEVER = torch.tpu.EagerMode.DEFER_NEVER
FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE


class Heard:
    """What the runtime reported, counted by range name as the profiler should show it."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def on_execute(self, mode, name, key, seconds):
        self.counts[f"tpu::{name}"] += 1

    def on_compile(self, info):
        if not info.replayed:
            self.counts[f"tpu::compile::{info.name}"] += 1

    def on_transfer(self, info):
        self.counts[f"tpu::{info.direction}::{info.op}"] += 1


def _train_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu"))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _profile_step(mode, tmp_path, **profile_kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    clear_cache()  # so this step compiles its ops
    heard = Heard()
    with torch.tpu.set_eager_mode(mode), torch.profiler.profile(**profile_kwargs) as prof:
        probes.subscribe(heard)
        try:
            _train_step(model, opt, x, y)
        finally:
            probes.unsubscribe(heard)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return prof, json.loads(path.read_text()), heard.counts


def _ranges(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def test_profiled_step_shows_every_compile_run_and_copy_the_runtime_reported(tmp_path):
    prof, trace, heard = _profile_step(NEVER, tmp_path)
    seen = collections.Counter(e["name"] for e in _ranges(trace) if e["name"].startswith("tpu::"))
    assert seen == heard
    # the ops the step ran itself: its two copies in, its loss read back, the matmuls
    assert seen["tpu::h2d::copy"] + seen["tpu::h2d::_to_copy"] >= 2
    assert seen["tpu::d2h::item"] == 1
    assert seen["tpu::addmm"] == 2 and seen["tpu::compile::addmm"] >= 1
    averages = {e.key: e.count for e in prof.key_averages()}
    assert averages["tpu::addmm"] == 2
    assert all(averages[name] == n for name, n in heard.items())


def test_runtime_ranges_nest_inside_the_aten_ops_that_caused_them(tmp_path):
    _, trace, _ = _profile_step(NEVER, tmp_path)
    by_thread = collections.defaultdict(list)
    for e in _ranges(trace):
        by_thread[e["tid"]].append(e)
    checked = 0
    for events in by_thread.values():
        for e in events:
            if not e["name"].startswith("tpu::"):
                continue
            start, end = e["ts"], e["ts"] + e["dur"]
            assert e["dur"] >= 0
            # a runtime range runs inside an aten op (the dispatcher's range of the op)
            assert any(
                o["name"].startswith("aten::") and o["ts"] <= start and end <= o["ts"] + o["dur"]
                for o in events
            ), e["name"]
            # and no range on its thread overlaps it without one containing the other
            for o in events:
                o_start, o_end = o["ts"], o["ts"] + o["dur"]
                overlap = o_start < end and start < o_end
                nested = (o_start <= start and end <= o_end) or (start <= o_start and o_end <= end)
                assert not overlap or nested, (e["name"], o["name"])
            checked += 1
    assert checked > 0


def test_a_compile_is_inside_its_op_s_range_before_the_run(tmp_path):
    _, trace, _ = _profile_step(NEVER, tmp_path)
    events = _ranges(trace)
    compiles = [e for e in events if e["name"] == "tpu::compile::addmm"]
    runs = [e for e in events if e["name"] == "tpu::addmm"]
    assert compiles and runs
    first_run = min(runs, key=lambda e: e["ts"])
    assert min(c["ts"] + c["dur"] for c in compiles) <= first_run["ts"]


def test_lazy_mode_shows_its_fused_programs(tmp_path):
    _, trace, heard = _profile_step(FUSE, tmp_path)
    seen = collections.Counter(e["name"] for e in _ranges(trace) if e["name"].startswith("tpu::"))
    assert seen == heard
    assert (
        sum(n for name, n in heard.items() if not name.startswith(("tpu::compile::", "tpu::h2d", "tpu::d2h")))
        > 0
    )


def test_no_probe_when_no_profiler_runs(tmp_path):
    assert probes.active() == ()
    with torch.profiler.profile():
        assert any(isinstance(p, ProfilerProbe) for p in probes.active())
        with torch.profiler.profile():  # a nested session shares the probe
            pass
        assert any(isinstance(p, ProfilerProbe) for p in probes.active())
    assert probes.active() == ()
    (torch.ones(3, device="tpu") + 1).cpu()
    assert probes.active() == ()


def test_scheduled_profiler_subscribes_only_while_recording(tmp_path):
    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=1)
    states = []
    with torch.profiler.profile(schedule=sched) as prof:
        for _ in range(4):
            states.append(any(isinstance(p, ProfilerProbe) for p in probes.active()))
            (torch.ones(3, device="tpu") * 2).cpu()
            prof.step()
    assert states == [False, False, True, False]  # waiting, warming up, recording, done
    assert probes.active() == ()


def test_host_tracer_level_below_two_leaves_the_runtime_out(tmp_path):
    cfg = torch.tpu.profiler.TpuProfilerConfig(host_tracer_level=1)
    _, trace, heard = _profile_step(NEVER, tmp_path, experimental_config=cfg)
    assert sum(heard.values()) > 0
    assert not [e for e in _ranges(trace) if e["name"].startswith("tpu::")]
    assert any(e["name"] == "aten::addmm" for e in _ranges(trace))


def test_run_dir_gets_a_jax_trace_and_worker_rank_is_metadata(tmp_path):
    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=tmp_path / "xprof", worker_rank="host0")
    _, trace, _ = _profile_step(NEVER, tmp_path, experimental_config=cfg)
    assert list((tmp_path / "xprof").rglob("*.xplane.pb"))
    assert trace["tpu_worker_rank"] == "host0"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"host_tracer_level": 4}, r"^host_tracer_level must be an integer from 0 to 3, got 4$"),
        ({"device_tracer_level": True}, r"^device_tracer_level must be an integer from 0 to 1, got True$"),
        ({"worker_rank": 3}, r"^worker_rank must be a string, got int$"),
        ({"worker_rank": "a:b"}, r"^worker_rank cannot contain ':' or ',': 'a:b'$"),
        ({"worker_rank": 'a"b'}, r"""^worker_rank cannot contain '"' or '\\': 'a"b'$"""),
        ({"experimental_options": {"x": 1}}, r"^experimental_options \['x'\] are TorchTPU backend options"),
    ],
)
def test_tpu_profiler_config_refuses_what_torchtpu_refuses(kwargs, match):
    with pytest.raises(TpuArgumentError, match=match):
        torch.tpu.profiler.TpuProfilerConfig(**kwargs)


def test_unchecked_experimental_options_are_ignored():
    cfg = torch.tpu.profiler.TpuProfilerConfig(
        experimental_options={"x": 1}, check_experimental_options=False
    )
    assert isinstance(cfg, torch.profiler._ExperimentalConfig)


def test_a_range_left_open_by_an_error_is_closed_by_the_enclosing_end():
    probe = ProfilerProbe()
    with torch.profiler.profile() as prof:
        probe.on_transfer_begin("d2h", "item")
        probe.on_execute_begin("eager", "mm", None)  # raised: no on_execute
        probe.on_transfer(None)
        probe.on_execute("eager", "mm", None, 0.0)  # its range is closed already: ignored
    names = collections.Counter(e.key for e in prof.key_averages())
    assert names["tpu::d2h::item"] == 1 and names["tpu::mm"] == 1


def test_run_dir_while_another_jax_trace_runs_leaves_the_profiler_off(tmp_path):
    jax.profiler.start_trace(str(tmp_path / "other"))
    try:
        cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=tmp_path / "xprof")
        refused = pytest.raises(
            TraceActiveError, match=r"^TpuProfilerConfig\(run_dir=.*\) cannot start a JAX trace: "
        )
        with refused, torch.profiler.profile(experimental_config=cfg):
            pass
    finally:
        jax.profiler.stop_trace()
    assert not torch.autograd.profiler._is_profiler_enabled
    assert probes.active() == ()


def test_compiled_graph_programs_are_ranges_and_cache_stats_count_their_calls(tmp_path):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x.sin() * 2.0).sum(), backend="tpu")
    x = torch.ones(5, device="tpu")
    recorder = Heard()
    with torch.profiler.profile() as prof:
        probes.subscribe(recorder)
        try:
            for _ in range(3):
                fn(x)
        finally:
            probes.unsubscribe(recorder)
    heard = recorder.counts
    averages = {e.key: e.count for e in prof.key_averages()}
    programs = [name for name in heard if name.startswith("tpu::") and not name.startswith("tpu::compile::")]
    assert programs and all(averages[name] == heard[name] for name in programs)
    assert sum(n for name, n in heard.items() if name.startswith("tpu::compile::")) >= 1
    stats = next(c for c in torch.tpu._get_cache_stats().caches if c.name == "compiled programs")
    called = [e for e in stats.entries if f"tpu::{e.name}" in heard]
    assert sum(e.requests for e in called) == 3 and sum(e.hits for e in called) == 2


def test_torchtpu_import_of_the_config_works():
    from torch.tpu.profiler import TpuProfilerConfig
    from torch.tpu.utils import OpTracer

    assert TpuProfilerConfig is torch.tpu.profiler.TpuProfilerConfig
    assert OpTracer is torch.tpu.utils.OpTracer
