"""Each compiled program's memory at its peak, buffer by buffer, with its kind and its PyTorch line.

The figures are the compiler's: the buffers of a recorded ``program_memory`` event add up to
its ``total_bytes``, which less the constants the executable carries is the executable's own
``memory_analysis()`` (arguments + outputs - aliased + temporaries), or, for a program the
TPU compiler refuses, the figure of its refusal. The lines are planted: the largest value of
each program is made on a line marked below, which the event must name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime.target import _libtpu
from tpu_debug.tracers.reading.memory_view import memory_view

import tpu_debug

requires_libtpu = pytest.mark.skipif(
    not _libtpu._find_libtpu(),
    reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it',
)
GiB = 1024**3


def _line(marker: str) -> int:
    """The line of this file holding ``marker`` (a comment)."""
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text)


def _wide(x, w, v):
    h = x @ w  # PLANTED: the largest value, read twice so XLA keeps it whole
    return h.tanh().sum() + (h @ v).sum()


def _adds_up(event) -> None:
    assert sum(b.nbytes for b in event.buffers) == event.total_bytes
    assert sum(event.kind_bytes) == event.total_bytes
    if event.source == "local":
        other = event.by_kind().get("other", 0)
        assert event.total_bytes - other == event.compiler_bytes


@pytest.mark.parametrize("mode", ["compiled", "lazy"])
def test_the_largest_buffer_is_named_at_the_line_that_made_it(mode, tmp_path):
    x, w, v = (torch.randn(*s, device="tpu") for s in ((256, 32), (32, 2048), (2048, 8)))
    with tpu_debug.trace(logdir=tmp_path, memory=True,
                         eager_mode="defer_and_fuse" if mode == "lazy" else None) as session:
        fn = tpu_debug.compile(_wide) if mode == "compiled" else _wide
        fn(x, w, v).item()
    (event,) = [e for e in session.events("program_memory") if e.mode == mode]
    _adds_up(event)
    largest = event.buffers[0]
    assert (largest.kind, largest.shape, largest.dtype) == ("temporary", (256, 2048), "f32")
    assert (largest.file, largest.line) == (__file__, _line("# PLANTED"))
    assert largest.nbytes == 256 * 2048 * 4
    assert event.peak_position >= 0 and event.length > event.peak_position


def test_a_training_steps_buffers_have_their_kinds(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = F.mse_loss(model(x), y)  # FORWARD
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    x, y = torch.randn(512, 64, device="tpu"), torch.randn(512, 8, device="tpu")
    with tpu_debug.trace(logdir=tmp_path, memory=True) as session:
        step = tpu_debug.compile(step)
        step(x, y)
    (event,) = [e for e in session.events("program_memory") if e.name.endswith("train_step")]
    _adds_up(event)
    kinds = event.by_kind()
    # the weights and AdamW's two moments, whole: their bytes are the model's, known here
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert kinds["optimizer_state"] >= 2 * weights
    assert {"parameter", "activation", "input"} <= set(kinds)
    # an input by its argument's name, a parameter by its module path, AdamW's moments by their
    # parameter's: the tensors were made before the trace, and the rows say so in words
    (inputs,) = [b for b in event.buffers if b.op == "x"]
    assert inputs.kind == "input" and inputs.nbytes == 512 * 64 * 4
    assert inputs.file is None and inputs.note == "made before the trace began"
    (weight,) = [b for b in event.buffers if b.kind == "parameter" and b.shape == (256, 64)]
    assert weight.op == "0.weight"
    states = {b.op for b in event.buffers if b.kind == "optimizer_state" and b.count == 1}
    assert {"exp_avg of 0.weight", "exp_avg_sq of 0.weight"} <= states
    # tanh's output is what the backward of the first layer reads: kept, made on the forward's line
    (kept,) = [b for b in event.buffers if b.kind == "activation" and b.shape == (512, 256)]
    assert "tanh" in kept.op and kept.line == _line("# FORWARD")


@requires_libtpu
def test_the_targets_assignment_is_recorded_and_a_refusal_adds_up_to_its_figure(tmp_path, monkeypatch):
    from tpu_debug.runtime import probes
    from tpu_debug.runtime.target import compile_for_target
    from tpu_debug.tracers.recording.program_buffers import analyse, context_of

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "cache"))
    compiled = []

    class Keep:
        def on_compile(self, info):
            compiled.append(info)

    x, w, v = (torch.randn(*s, device="tpu") for s in ((256, 32), (32, 2048), (2048, 8)))
    keep = Keep()
    probes.subscribe(keep, replay=True)  # the graph may be compiled already, by an earlier test
    try:
        with tpu_debug.trace(logdir=tmp_path / "runs", target="v5e") as session:
            tpu_debug.compile(_wide)(x, w, v)
    finally:
        probes.unsubscribe(keep)
    (event,) = [e for e in session.events("program_memory") if e.source == "target"]
    _adds_up(event)
    # at this size the TPU keeps the product in its on-chip VMEM: the device's memory holds the inputs
    assert event.target == "v5e" and event.tpu_program is not None
    assert {b.op for b in event.buffers if b.kind == "input"} >= {"x", "w", "v"}
    # the same graph at sizes one v5e device cannot hold: (131072 x 4096) @ (4096 x 32768) is a
    # 16 GiB product, refused; the assignment the compiler gave up on adds up to its figure
    info = [i for i in compiled if str(i.name) == event.name][-1]
    big = (jax_struct((131072, 4096)), jax_struct((4096, 32768)), jax_struct((32768, 8)))
    result = compile_for_target(info.jitted, big, "v5e", x64=True, cache=False)
    assert result.error is not None and result.error.kind == "hbm_oom"
    refused = analyse(result.buffers, result.hlo, context_of(info), source="target", status="hbm_oom",
                      required_bytes=result.error.required_bytes)
    _adds_up(refused)
    # the refusal prints GiB with two decimals: within half a hundredth of one
    assert abs(refused.total_bytes - refused.required_bytes) <= 0.005 * GiB
    largest = refused.buffers[0]
    assert largest.kind == "temporary" and (largest.file, largest.line) == (__file__, _line("# PLANTED"))
    assert largest.nbytes == 131072 * 32768 * 4


@requires_libtpu
def test_a_target_result_before_its_compile_gets_the_same_context(tmp_path, monkeypatch):
    """The target's worker can finish before the program-memory tracer's on_compile (a warm
    target cache): the event recorded is the one the usual order records, location included."""
    from tpu_debug.runtime import probes
    from tpu_debug.runtime.target import compile_for_target
    from tpu_debug.tracers.recording.program_memory_tracer import ProgramMemoryTracer

    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "cache"))
    compiled = []

    class Keep:
        def on_compile(self, info):
            compiled.append(info)

    args = [torch.randn(*s, device="tpu") for s in ((64, 32), (32, 256), (256, 8))]
    keep = Keep()
    probes.subscribe(keep, replay=True)  # the graph may be compiled already, by an earlier test
    try:
        tpu_debug.compile(_wide)(*args)
    finally:
        probes.unsubscribe(keep)
    info = [i for i in compiled if i.graph is not None][-1]
    result = compile_for_target(info.jitted, [jax_struct(tuple(a.shape)) for a in args], "v5e", cache=False)

    class Writer:
        def __init__(self):
            self.events = []

        def put(self, event):
            self.events.append(event)

        def new_id(self):
            return len(self.events)

    def record(target_first: bool):
        writer = Writer()
        tracer = ProgramMemoryTracer(writer, local=False)
        if target_first:
            tracer.on_target(info, result, None, "tpu")
        tracer.on_compile(info)  # (one line: the location the two orders see is the same)
        if not target_first:
            tracer.on_target(info, result, None, "tpu")
        assert tracer.close() == 0
        (event,) = [e for e in writer.events if type(e).__name__ == "ProgramMemoryEvent"]
        return event

    usual, early = record(False), record(True)
    assert usual.location is not None
    # (the thread: the one the analysis ran on, a worker of the tracer in the early order)
    assert dataclasses.replace(early, thread=0) == dataclasses.replace(usual, thread=0)


def jax_struct(shape):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_an_eager_steps_holders_have_their_kinds(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 8)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(1024, 256, device="tpu"), torch.randn(1024, 8, device="tpu")
    with tpu_debug.trace(logdir=tmp_path, memory=True) as session:
        for _ in range(2):
            F.mse_loss(model(x), y).backward()  # EAGER STEP
            opt.step()
            opt.zero_grad(set_to_none=False)
    kinds = {(h.phase, h.kind) for h in memory_view(session).peak_holders()}
    # made before the trace and kept: the weights; made by the optimizer and kept: its momentum;
    # made by the backward and mostly gone by the step's end (the gradients of the activations
    # outweigh the weights' gradients made on the same line): temporaries; made by the forward
    # and gone by the step's end: what it kept for the backward (tanh's output, [1024, 4096])
    assert {("before trace", "parameter"), ("optimizer", "optimizer_state"), ("backward", "temporary")} <= kinds
    (kept,) = [h for h in memory_view(session).peak_holders() if h.kind == "activation" and h.shape == (1024, 4096)]
    assert kept.line == _line("# EAGER STEP")


@requires_libtpu
def test_xprofs_memory_viewer_shows_the_same_peak(tmp_path):
    """The profile the TensorBoard export writes for a target program is read by xprof's memory
    viewer, whose figures are the peak's: its total allocation is the buffer assignment's
    total, its peak heap that total less the heap's unused bytes (what the timeline tops at)."""
    import base64
    import json

    import jax
    import jax.numpy as jnp
    from tpu_debug.runtime.target import compile_for_target
    from tpu_debug.tracers.events import ProgramProtoEvent
    from tpu_debug.tracers.recording.program_buffers import ProgramContext, analyse
    from tpu_debug.tracers.xplane import write_programs
    from xprof.convert import raw_to_tool_data

    def loss(w1, w2, x):  # its gradient holds an 8 GiB product and two 4 GiB ones: not on a v5e device
        return ((jnp.tanh(x @ w1) @ w2) ** 2).sum()

    args = tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in ((8192, 8192), (8192, 32768), (131072, 8192)))
    result = compile_for_target(jax.grad(loss, argnums=(0, 1)), args, "v5e", cache=False)
    assert result.error is not None and result.hlo_proto
    peak = analyse(result.buffers, result.hlo, ProgramContext("refused", "compiled"), source="target",
                   target="v5e", status="hbm_oom")
    proto = ProgramProtoEvent(0, 0.0, None, 0, None, "refused.v5e", 1_000_001, "target",
                              base64.b64encode(result.hlo_proto).decode(), "v5e")
    path = write_programs(tmp_path, [proto], session=tmp_path / "plugins" / "profile" / "run")
    raw_to_tool_data.xspace_to_tool_names([str(path)])  # xprof's first read: it lists the programs
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(path)], "memory_viewer",
                                                   {"module_name": "refused.v5e(1000001)"})
    viewer = json.loads(data)
    mib = 1024**2
    assert viewer["moduleName"] == "refused.v5e"
    assert viewer["totalBufferAllocationMib"] * mib == pytest.approx(peak.total_bytes, abs=1)
    assert viewer["peakHeapMib"] * mib == pytest.approx(peak.total_bytes - peak.unused_bytes, abs=1)
    assert max(peak.timeline_bytes) == peak.total_bytes - peak.unused_bytes
