"""Where each step's time goes, checked against the test's own clock on planted programs.

Each program plants one cost that dominates its steps by construction (a DataLoader that
sleeps, a read of a value behind queued device work, ops compiled for a new shape at every
step, a checkpoint save) and times that cost with ``time.perf_counter()`` around the call
that pays it. No assertion is on how long anything took. What is asserted:

- the part the split names for the plant, and that it is the largest (the bound);
- nesting: the tracer's interval of a wait lies inside the test's interval around the same
  call, so the part is at most the test's time (and at least a sleep's own length);
- the part holds the test's time within 10 % in the median over the steps: the two clocks
  differ by the Python between them (PyTorch's dispatch of ``.item()``, the hook's call),
  microseconds against waits of tens of milliseconds; the median leaves out a step where the
  machine happened to preempt the test between its clock and the tracer's;
- the measured parts of a step never come to more than its wall time (nothing counted twice).
"""

from __future__ import annotations

import io
import statistics
import time

import pytest
import torch
from tpu_debug.tracers.events import StepEvent, WaitEvent
from tpu_debug.tracers.reading.step_time import Goodput, goodput, ideal_step_seconds, split_step, verdict
from tpu_debug.tracers.reading.step_phases import STEADY, WARMUP, step_phases

import tpu_debug

SLEEP = 0.1  # a batch's loading: far above what a step of four small ops costs the host


class _SlowData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(SLEEP)
        return torch.full((16,), float(i))


def _median_ratio(parts: list[float], clocks: list[float]) -> float:
    return statistics.median(p / c for p, c in zip(parts, clocks))


def _no_double_count(session) -> None:
    for s in session.steps():
        split = split_step(s)
        assert split is not None and not split.overlapped, (s.index, split)
        assert sum(split.parts) == pytest.approx(s.seconds)


def test_a_dataloader_that_sleeps_is_input_bound(logdir):
    w = torch.randn(16, 16, device="tpu")
    clocks = []
    with tpu_debug.trace(logdir=logdir) as session:
        it = iter(torch.utils.data.DataLoader(_SlowData(), batch_size=None))
        while True:
            start = time.perf_counter()
            try:
                x = next(it)
            except StopIteration:
                break
            clocks.append(time.perf_counter() - start)
            (x.to("tpu") @ w).sum()
            tpu_debug.step()
    waits = session.steps.waits("input")
    assert [w.api for w in waits] == ["DataLoader"] * 6  # five batches, then the StopIteration
    inner = [w.seconds for w in waits[:5]]
    assert all(SLEEP <= t <= c for t, c in zip(inner, clocks))
    assert _median_ratio(inner, clocks) >= 0.9
    assert (waits[0].workers, waits[0].pin_memory) == (0, False)
    steps = session.steps()
    for s in steps:  # each step's input part: its batch's wait and the batch's upload
        mine = [w.seconds for w in waits if s.ts <= w.ts < s.end]
        assert s.input_seconds >= sum(mine) >= SLEEP
    v = session.steps.verdict()
    assert (v.part, v.bound) == ("input", "input-bound") and v.share > 0.5
    _no_double_count(session)
    (finding,) = [f for f in session.findings() if f.kind == "step_bound"]
    assert finding.cause == "input" and "num_workers" in finding.fix
    # the finding's cost is the steady steps' input part: the test's clock around their batches
    steady = [c for c, phase in zip(clocks, session.steps.phases()) if phase == STEADY]
    assert steady and 0.9 * sum(steady) <= finding.cost_seconds <= 1.1 * sum(steady)
    assert finding.evidence.location.file.endswith("test_step_time.py")
    # the hooks are the trace's: gone when it ends
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__.__name__ == "__next__"
    assert not hasattr(torch.utils.data.dataloader._BaseDataLoaderIter.__next__, "_torchdynamo_disable")
    assert not hasattr(torch.save, "_torchdynamo_disable")


def _queue_work(w: torch.Tensor) -> torch.Tensor:
    # four products queued on the device: the host returns at once, the device works on
    y = w
    for _ in range(4):
        y = (y @ w) * 1e-3
    return y.sum()


def test_a_read_every_step_is_sync_bound_and_said_once(logdir):
    w = torch.randn(512, 512, device="tpu")
    _queue_work(w).item()  # compiled before the trace: its steps are all alike
    clocks = []
    with tpu_debug.trace(logdir=logdir) as session:
        for _ in range(5):
            loss = _queue_work(w)
            start = time.perf_counter()
            loss.item()  # waits for the products queued above
            clocks.append(time.perf_counter() - start)
            tpu_debug.step()
    steps = session.steps()
    syncs = [s.sync_seconds for s in steps]
    assert all(0 < t <= c for t, c in zip(syncs, clocks))
    # the test's clock around .item() also holds the tracer's own recording of the read (its
    # stack walk, the transfer event), which is not the device wait and grows with the machine's
    # load: the wait is most of the clock, not all of it
    assert _median_ratio(syncs, clocks) >= 0.75
    v = session.steps.verdict()
    assert (v.part, v.bound) == ("sync", "sync-bound")
    _no_double_count(session)
    findings = session.findings()
    # the read's own rule names the line with the time it waited; the bound is not said twice
    (read,) = [f for f in findings if f.kind == "implicit_sync"]
    assert read.evidence.location.file.endswith("test_step_time.py")
    steady = [c for c, phase in zip(clocks, session.steps.phases()) if phase == STEADY]
    assert steady and 0.75 * sum(steady) <= read.cost_seconds <= sum(steady)  # the same clock, as above
    assert "step_bound" not in {f.kind for f in findings}


def test_a_recompile_every_step_is_compile_bound(logdir):
    import jax.monitoring

    clocks = []
    jax_seconds = []  # JAX's own clock of its tracing, lowering and compiling: a second witness

    def jax_clock(event: str, seconds: float, **_: object) -> None:
        if event.startswith("/jax/core/compile/"):
            jax_seconds.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(jax_clock)
    try:
        with tpu_debug.trace(logdir=logdir) as session:
            for step in range(5):
                start = time.perf_counter()
                x = torch.ones(211 + step, 24, device="tpu")  # a length no other test uses: compiles
                ((x * 2.0).relu() + 1.0).sum()
                clocks.append(time.perf_counter() - start)
                tpu_debug.step()
    finally:
        jax.monitoring.unregister_event_duration_listener(jax_clock)
    steps = session.steps()
    compiles = session.compiles()
    for s, clock in zip(steps, clocks):
        split = split_step(s)
        own = sum(c.seconds for c in compiles if s.ts <= c.ts < s.end)
        assert split.part("compile") == pytest.approx(own) and 0 < own <= clock
        # an XLA compile is tens of ms, the dispatch of the op it is for tens of µs; the rest of
        # the test's interval is the tracer's own record of each compile
        assert own >= 0.5 * clock
    # the runtime's compile spans hold JAX's trace, lowering and compile, and little else
    part = sum(split_step(s).part("compile") for s in steps)
    assert 0.9 * part <= sum(jax_seconds) <= part
    v = session.steps.verdict()
    assert (v.part, v.bound) == ("compile", "compile-bound")
    _no_double_count(session)
    findings = session.findings()
    # the recompile rules name the ops and the argument that changes, and between them the
    # steady steps' compile time (ones' size in one, the ops on its result in the other)
    named = sum(f.cost_seconds for f in findings if f.kind in ("dynamic_shape", "recompile"))
    steady = sum(s.compile_seconds for s, phase in zip(steps, session.steps.phases()) if phase == STEADY)
    assert "dynamic_shape" in {f.kind for f in findings} and 0.9 * steady <= named <= 1.1 * steady
    assert "step_bound" not in {f.kind for f in findings}


def test_a_correct_device_bound_loop_gets_no_finding(logdir):
    w = torch.randn(512, 512, device="tpu")
    _queue_work(w)
    with tpu_debug.trace(logdir=logdir) as session:
        for _ in range(8):
            _queue_work(w)
            tpu_debug.step()
        torch.tpu.synchronize()  # after the loop: the last steps' work, outside every step
    # the host runs ahead until the device's queue is full; then launching a program waits for
    # the device, which is where a device-bound loop's time goes
    v = session.steps.verdict()
    assert (v.part, v.bound) == ("dispatch", "device-bound")
    _no_double_count(session)
    assert session.findings() == []
    (wait,) = session.steps.waits("synchronize")
    assert wait.api == "torch.tpu.synchronize" and wait.location.file.endswith("test_step_time.py")


class _Checkpoint:
    """A checkpoint whose pickling reads its device tensor back (``.cpu()``: a copy to the host)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __getstate__(self) -> dict:
        return {"weight": self.weight.cpu()}


def test_a_checkpoint_save_is_its_own_part_and_its_copies_are_not_syncs(logdir):
    model = torch.nn.Linear(64, 64).to("tpu")
    clocks = []
    with tpu_debug.trace(logdir=logdir) as session:
        for _ in range(3):
            model(torch.ones(2, 64, device="tpu")).sum()
            start = time.perf_counter()
            torch.save(_Checkpoint(model.weight), io.BytesIO())
            clocks.append(time.perf_counter() - start)
            tpu_debug.step()
    steps = session.steps()
    saves = session.steps.waits("checkpoint")
    assert [w.api for w in saves] == ["torch.save"] * 3
    assert all(w.seconds <= c for w, c in zip(saves, clocks))
    reads = [t for t in session.transfers() if t.direction == "d2h"]
    assert [t.op for t in reads] == ["cpu"] * 3
    for s, w, t in zip(steps, saves, reads):
        # the save's copy to the host is inside it: the save's time, not a wait on the device
        assert w.ts <= t.ts and s.checkpoint_seconds == pytest.approx(w.seconds) and s.sync_seconds == 0
    _no_double_count(session)


def test_a_dcp_save_is_a_checkpoint_wait_and_its_hook_goes_with_the_trace(logdir, tmp_path):
    import torch.distributed.checkpoint as dcp

    original = dcp.save
    with tpu_debug.trace(logdir=logdir) as session:
        for i in range(2):
            dcp.save({"w": torch.ones(8)}, checkpoint_id=str(tmp_path / f"ckpt{i}"))
            tpu_debug.step()
    assert [w.api for w in session.steps.waits("checkpoint")] == ["dcp.save"] * 2
    assert all(s.checkpoint_seconds > 0 for s in session.steps())
    assert dcp.save is original and dcp.state_dict_saver.save is original


# -- goodput, on steps written by hand --------------------------------------------------------


def _steps(*rows: tuple) -> list[StepEvent]:
    """(seconds, compile, input, sync, checkpoint) per step, back to back from t=1."""
    out, t = [], 1.0
    for i, (seconds, compile_, data, sync, save) in enumerate(rows):
        out.append(StepEvent(
            i, t, None, 0, None, i, "explicit", t + seconds, seconds, eager_ops=1, op_seconds=0.0,
            compiles=int(compile_ > 0), compile_seconds=compile_, sequence="same" if i else "first",
            input_seconds=data, sync_seconds=sync, collective_seconds=0.0, checkpoint_seconds=save,
        ))
        t += seconds
    return out


def test_goodput_counts_warmup_excess_and_steady_badput_by_cause():
    steps = _steps(
        (5.0, 3.0, 0.0, 0.0, 0.0),   # warm-up: 3 s of compiles, 1 s of other start-up past the ideal 1 s
        (1.0, 0.0, 0.25, 0.0, 0.0),  # steady: a quarter waiting for input
        (1.0, 0.0, 0.0, 0.5, 0.0),   # steady: half waiting on the device, the other half host time
        (1.0, 0.2, 0.0, 0.0, 0.0),   # steady: a recompile
        (1.0, 0.0, 0.0, 0.0, 0.0),
    )
    phases = step_phases(steps)
    assert phases == [WARMUP, STEADY, STEADY, STEADY, STEADY]
    assert ideal_step_seconds([1.0, 1.0, 1.0, 1.0]) == 1.0
    save = WaitEvent(99, 12.0, None, 0, None, "checkpoint", 0.5, "torch.save")  # after the last step
    g = goodput(steps, phases, 13.0, [save])
    assert isinstance(g, Goodput) and g.ideal_step_seconds == 1.0
    bad = {b.cause: b.seconds for b in g.badput}
    assert bad["start-up"] == pytest.approx(1.0 + 1.0)  # before the first step, and the warm-up excess
    assert bad["first compiles"] == pytest.approx(3.0)
    assert (bad["data"], bad["recompiles"], bad["checkpoints"]) == pytest.approx((0.25, 0.2, 0.5))
    # the sync's cost: the smaller of the wait and the step's host time (0.5 each here)
    assert bad["syncs"] == pytest.approx(0.5) and next(b for b in g.badput if b.cause == "syncs").estimated
    assert g.goodput_seconds == pytest.approx(1.0 + (4.0 - 0.25 - 0.5 - 0.2))
    assert g.goodput_seconds + sum(bad.values()) == pytest.approx(13.0)  # "other" is the rest
    assert bad["other"] == pytest.approx(13.0 - 10.0 - 0.5)


def test_a_run_without_a_recorded_split_has_no_goodput_and_no_verdict():
    old = [StepEvent(i, float(i), None, 0, None, i, "explicit", i + 1.0, 1.0) for i in range(4)]
    assert split_step(old[0]) is None
    assert goodput(old, step_phases(old), 4.0) is None
    assert verdict(old, step_phases(old)) is None
