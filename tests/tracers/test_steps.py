"""Steps: finding the loop in an op sequence, the step of an event by time, warm-up vs steady state."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tpu_debug.core.records import TransferInfo
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers.events import StepEvent
from tpu_debug.tracers.reading.memory_view import memory_view
from tpu_debug.tracers.reading.step_phases import STEADY, WARMUP, StepIndex, phase_of, step_phases
from tpu_debug.tracers.recording.step_tracker import Loop, StepTracker, detect_loop

import tpu_debug


def _step(index: int, ts: float, end: float, *, compiles: int = 0, sequence: str = "a") -> StepEvent:
    return StepEvent(
        id=index, ts=ts, mode=None, thread=0, location=None, index=index, detected="explicit",
        end=end, seconds=end - ts, compiles=compiles, sequence=sequence,
    )


def test_a_loop_is_found_after_setup_and_before_a_tail():
    assert detect_loop([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7]) == Loop(start=1, period=3, iterations=3)
    # a block repeated twice is not yet a loop; the third time makes it one
    assert detect_loop([1, 2, 1, 2]) is None
    assert detect_loop([1, 2, 1, 2, 1, 2]) == Loop(0, 2, 3)


def test_the_loop_is_the_shortest_block_that_repeats():
    # period 2 also agrees at 4 (over fewer ops): the shorter period is the loop
    assert detect_loop([5, 6] * 8) == Loop(0, 2, 8)
    # an iteration that runs one op twice (a, b, a, c) is one block of 4, not two of 2
    assert detect_loop([1, 2, 1, 3] * 4) == Loop(0, 4, 4)


def test_no_loop_in_a_sequence_that_does_not_repeat():
    assert detect_loop(list(range(50))) is None
    assert detect_loop([]) is None


def test_an_event_belongs_to_the_step_holding_its_time():
    steps = [_step(0, 1.0, 2.0), _step(1, 2.0, 3.0), _step(2, 5.0, 6.0)]
    index = StepIndex(steps)
    assert [index.step_of(t) for t in (0.5, 1.0, 1.99, 2.0, 2.5, 3.0, 4.0, 5.5, 6.0)] == [
        None, 0, 0, 1, 1, None, None, 2, None,
    ]
    phases = {0: WARMUP, 1: STEADY, 2: STEADY}
    assert [phase_of(index, phases, t) for t in (0.5, 1.5, 2.5, 4.0, 7.0)] == [
        "setup", WARMUP, STEADY, "between", "tail",
    ]
    assert phase_of(StepIndex([]), {}, 1.0) == "unstepped"


def test_compiles_until_the_sequence_repeats_are_warm_up():
    steps = [
        _step(0, 0, 1, compiles=37, sequence="first"),
        _step(1, 1, 2, compiles=4, sequence="second"),
        _step(2, 2, 3, sequence="loop"),
        _step(3, 3, 4, sequence="loop"),
    ]
    assert step_phases(steps) == [WARMUP, WARMUP, STEADY, STEADY]


def test_a_new_phase_of_the_program_warms_up_again():
    # an evaluation loop after training: new programs compile once, then repeat
    steps = [
        _step(0, 0, 1, compiles=5, sequence="train"),
        _step(1, 1, 2, sequence="train"),
        _step(2, 2, 3, compiles=3, sequence="eval"),
        _step(3, 3, 4, sequence="eval"),
    ]
    assert step_phases(steps) == [WARMUP, STEADY, WARMUP, STEADY]


def test_compiles_in_a_step_that_then_runs_the_same_programs_are_steady_state():
    # step 3 compiled, and step 4 ran what steps 1-2 ran: the compile was not for new work
    steps = [
        _step(0, 0, 1, compiles=5, sequence="train"),
        _step(1, 1, 2, sequence="train"),
        _step(2, 2, 3, sequence="train"),
        _step(3, 3, 4, compiles=1, sequence="train-recompiled"),
        _step(4, 4, 5, sequence="train"),
    ]
    assert step_phases(steps) == [WARMUP, STEADY, STEADY, STEADY, STEADY]


def test_compiling_step_after_step_is_not_warming_up():
    steps = [_step(i, i, i + 1, compiles=2, sequence=f"s{i}") for i in range(8)]
    assert step_phases(steps, warmup_max=3) == [WARMUP] + [STEADY] * 7
    assert step_phases(steps[:3], warmup_max=3) == [WARMUP] * 3


@pytest.mark.parametrize("optimizer", [True, False])
def test_steps_are_recorded_per_optimizer_step_or_found_in_the_loop(tmp_path, optimizer):
    clear_cache()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4).to("tpu")
    with tpu_debug.trace(logdir=tmp_path, name="steps") as session:
        for _ in range(5):
            loss = model(x).square().sum()
            if optimizer:
                opt.zero_grad()
                loss.backward()
                opt.step()
    steps = session.steps()
    assert [s.index for s in steps] == list(range(5))
    assert {s.detected for s in steps} == {"optimizer" if optimizer else "loop"}
    # the first step compiles; the rest run the same programs and compile nothing
    assert steps[0].compiles > 0 and all(s.compiles == 0 for s in steps[1:])
    assert len({s.sequence for s in steps[1:]}) == 1
    assert all(s.end >= s.ts for s in steps)
    # every compile of the run is placed in the step holding it
    index = StepIndex(steps)
    assert {index.step_of(c.ts) for c in session.compiles()} == {0}
    assert session.findings() == []


def test_a_lazy_steps_graph_runs_in_the_step_it_belongs_to(tmp_path):
    # lazy mode runs what a step recorded when optimizer.step() returns: one fused graph per
    # iteration of this loop, which must be counted in that iteration's step, not the next
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("tpu")
    iterations = 4
    with tpu_debug.trace(logdir=tmp_path, eager_mode="defer_and_fuse", hlo=False) as session:
        for _ in range(iterations):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    assert [(s.index, s.graph_runs) for s in session.steps()] == [(i, 1) for i in range(iterations)]


def test_dynamos_work_after_a_compiler_reset_is_still_its_steps_compile_side(tmp_path):
    # torch.compiler.reset() clears every dynamo compile callback (TorchTPU's guide calls it
    # between examples): the steps after it still count dynamo's tracing of the model compiled
    # again, the trace closes without an error, and dynamo's handler is left as it was found
    import torch._dynamo.callback as callback

    handler = callback.callback_handler
    before = (list(handler.start_callbacks), list(handler.end_callbacks), vars(handler).get("clear"))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("tpu")
    with tpu_debug.trace(logdir=tmp_path, hlo=False) as session:
        for i in range(4):
            if i == 2:
                torch.compiler.reset()
            compiled = torch.compile(model, backend="tpu_debug")
            opt.zero_grad()
            compiled(x).square().mean().backward()
            opt.step()
    steps = session.steps()
    assert [s.index for s in steps] == [0, 1, 2, 3]
    # dynamo traced the model in step 0 and again in step 2, after the reset dropped its code cache
    assert [s.trace_seconds > 0 for s in steps] == [True, False, True, False]
    assert [e for e in session.events("internal_error")] == []
    assert (list(handler.start_callbacks), list(handler.end_callbacks), vars(handler).get("clear")) == before


def test_dynamos_work_is_heard_when_dynamo_loads_after_the_trace_began(tmp_path):
    # a script's first torch.compile call loads dynamo inside the trace: its first frame's
    # tracing is the first step's compile side too. A fresh interpreter: this one loaded dynamo
    code = f"""
import sys, torch, tpu_debug
assert "torch._dynamo.callback" not in sys.modules
with tpu_debug.trace(logdir={str(tmp_path)!r}, hlo=False) as session:
    import torch._dynamo.callback  # what torch.compile's first call imports, before its first frame
    listening = any(type(getattr(cb, "__self__", None)).__name__ == "StepTracker"
                    for cb in torch._dynamo.callback.callback_handler.start_callbacks)
    model = torch.compile(torch.nn.Linear(8, 4).to("tpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("tpu")
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
print(listening, [s.trace_seconds > 0 for s in session.steps()], len(list(session.events("internal_error"))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
    assert done.stdout.strip() == "True [True, False, False] 0", done.stdout + done.stderr[-3000:]


def test_an_optimizer_of_cpu_tensors_ends_no_step_in_any_tracer(tmp_path):
    # a CPU reference trained beside the traced model: its optimizer steps are not the device's
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(4, 2).to("tpu"), torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    iterations = 3
    with tpu_debug.trace(logdir=tmp_path, memory=True) as session:
        for _ in range(iterations):
            for m, o, data in ((model, opt, x.to("tpu")), (reference, ref_opt, x)):
                o.zero_grad()
                m(data).square().sum().backward()
                o.step()
    assert [s.index for s in session.steps()] == list(range(iterations))
    memory = memory_view(session)
    assert memory.summary.steps == iterations
    assert [m.step for m in memory.steps][:iterations] == list(range(iterations))


def _tracker(recorded: list) -> StepTracker:
    ids = iter(range(1, 1000))
    return StepTracker(recorded.append, ids.__next__, clock=lambda: 1.0)


def test_what_runs_after_the_last_step_end_is_numbered_as_the_next_step_and_never_recorded():
    recorded: list[StepEvent] = []
    tracker = _tracker(recorded)
    for _ in range(2):
        tracker.on_execute("eager", "add.Tensor", "add", 1e-3)
    tracker.mark()
    assert tracker.unfinished() is None  # nothing ran since
    tracker.on_transfer(TransferInfo("d2h", 4, (), "float32", "item", 1e-6))  # reading the loss back: no step's work
    assert tracker.unfinished() is None
    tracker.on_execute("eager", "mul.Tensor", "mul", 1e-3)
    tracker.close()
    tail = tracker.unfinished()
    assert (tail.index, tail.detected, tail.eager_ops, tail.transfer_bytes) == (1, "unfinished", 1, 4)
    assert [(s.index, s.eager_ops) for s in recorded] == [(0, 2)]


def test_a_run_without_step_ends_is_one_unfinished_step_0_unless_its_loop_made_steps():
    recorded: list[StepEvent] = []
    tracker = _tracker(recorded)
    tracker.on_execute("eager", "add.Tensor", "add", 1e-3)
    tracker.close()
    assert (tracker.unfinished().index, tracker.unfinished().eager_ops, recorded) == (0, 1, [])
    looped = _tracker(recorded)
    for _ in range(3):
        looped.on_execute("eager", "add.Tensor", "add", 1e-3)
        looped.on_execute("eager", "mul.Tensor", "mul", 1e-3)
    looped.close()
    assert [(s.index, s.detected) for s in recorded] == [(0, "loop"), (1, "loop"), (2, "loop")]
    assert looped.unfinished() is None  # the loop's steps hold what ran
