"""The tracers on lazy mode: each materialization with its trigger and line, each fused graph
a program whose HLO maps to the aten ops and lines it fused, recompiles of fused graphs
explained op by op, and the report's "Lazy graphs" section."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tpu_debug.runtime import lazy
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import CompileInfo, DynamoOrigin, GraphInfo, LazyNode
from tpu_debug.tracers.events import KeyDiff, MaterializationEvent
from tpu_debug.tracers.reading.lazy_graphs import summarize
from tpu_debug.tracers.recording.recompile_tracker import RecompileTracker

import tpu_debug
from tpu_debug.cli.run import prepare_parser
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError

FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE


@pytest.fixture(autouse=True)
def op_by_op_after():
    yield
    lazy.set_mode(torch.tpu.EagerMode.DEFER_NEVER)


def _line(marker: str) -> int:
    """The line of this file holding ``marker`` (a comment), so the test names lines by content."""
    with open(__file__, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(marker) and "_line(" not in text:
                return n
    raise AssertionError(marker)


def _where(e) -> tuple[str, int]:
    return os.path.basename(e.location.file), e.location.line


# -- materializations: trigger and line -------------------------------------------------------


def _train(model, opt, x, y, steps):
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if loss > 100:  # MARK-bool
            print("diverged")
        loss.backward()
        opt.step()  # MARK-step
    print(loss)  # MARK-print-train
    return loss.item()


def test_each_materialization_says_what_needed_it_and_where(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 3).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 4).to("tpu"), torch.tensor([0, 1, 2, 0, 1]).to("tpu")
    with tpu_debug.trace(logdir=tmp_path, eager_mode=FUSE) as session:
        assert torch.tpu.eager_mode is FUSE
        _train(model, opt, x, y, 3)
        loss = model(x).sum()
        print(loss)  # MARK-print-test
        events = session.events("materialize")
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER  # the trace put it back
    this = os.path.basename(__file__)
    got = [(e.trigger, _where(e), e.step) for e in events]
    bool_line, step_line = _line("# MARK-bool"), _line("# MARK-step")
    assert got[:6] == [
        ("bool", (this, bool_line), 0), ("optimizer_step", (this, step_line), 0),
        ("bool", (this, bool_line), 1), ("optimizer_step", (this, step_line), 1),
        ("bool", (this, bool_line), 2), ("optimizer_step", (this, step_line), 2),
    ]
    # printing a tensor runs the ops that format it (masked_select, abs, max...): each read
    # of theirs is a materialization of its own, all of them "print"
    prints = {_line("# MARK-print-train"), _line("# MARK-print-test")}
    assert got[6:] and {(t, w[1]) for t, w, _s in got[6:]} <= {("print", n) for n in prints}
    first_bool, second_bool = events[0], events[2]
    assert first_bool.compiled and not second_bool.compiled and first_bool.compile is not None
    assert first_bool.graph == "lazy/read" and first_bool.ops > 0 and first_bool.outputs >= 1

    lazy_graphs = summarize(events)
    assert lazy_graphs.steps == 3 and lazy_graphs.per_step == (2, 2, 2) and lazy_graphs.split_steps == 3
    (extra,) = lazy_graphs.extra_cuts
    assert (extra.trigger, extra.location.line, extra.count, extra.steps) == ("bool", bool_line, 3, 3)

    report = session.summary(width=160)
    section = report[report.index("Lazy graphs"):]
    assert "3 optimizer step(s): 2 graph(s) per step (median); 3 step(s) run as more than one graph" in section
    assert f"{this}:{bool_line} in _train: bool() / if t: cut the graph inside 3 step(s)" in section

    # the TUI's overview: the split steps and the line that cuts them, linked to the compiles
    from tpu_debug.tui.screens.overview import finding_lines

    run = tpu_debug.open_run(session.run_dir)
    (finding,) = [f for f in finding_lines(run, None) if "lazy graph" in f.text.plain]
    assert finding.view == "recompiles" and finding.severity == "warning"
    assert finding.text.plain.startswith("3 of 3 optimizer steps ran as more than one lazy graph; most often cut by")
    assert f"{this}:{bool_line}" in finding.text.plain


def test_a_fused_graph_is_a_program_mapped_to_its_ops_and_lines(tmp_path):
    a = torch.randn(8, 8).to("tpu")
    with tpu_debug.trace(logdir=tmp_path) as session, torch.tpu.set_eager_mode(FUSE):
        b = torch.relu(a @ a)  # MARK-mm
        c = (b * 3).sum()  # MARK-sum
        c.item()
    (compile_event,) = session.compiles(mode="lazy")
    assert compile_event.name == "lazy/read" and compile_event.program is not None
    nodes = session.programs.fx_nodes(compile_event.program)
    assert [(n.name, n.target) for n in nodes] == [
        ("n0", "aten::mm"), ("n1", "aten::relu"), ("n2", "aten::mul.Tensor"), ("n3", "aten::sum"),
    ]
    assert [n.location.line for n in nodes] == [_line("# MARK-mm")] * 2 + [_line("# MARK-sum")] * 2
    # XLA's optimized HLO keeps each op's scope: the product maps back to n0, the sum to n3
    assert any("dot" in i or "fusion" in i for i in session.programs.node_instructions(compile_event.program, "n0"))
    assert session.programs.node_instructions(compile_event.program, "n3")


def _scaled(a, extra):
    b = torch.relu(a @ a)  # MARK-part-mm
    if extra:
        b = b * 3  # MARK-part-mul
    return b.sum()  # MARK-part-sum


def test_a_graph_parting_from_a_recorded_sequence_names_every_ops_line(tmp_path):
    # ops repeating a recorded sequence are not announced again; a graph that parts from
    # it after a shared prefix still names each op's line, the prefix's included
    a = torch.randn(8, 8).to("tpu")
    with tpu_debug.trace(logdir=tmp_path) as session, torch.tpu.set_eager_mode(FUSE):
        for extra in (False, False, True):
            _scaled(a, extra).item()
    first, parted = session.compiles(mode="lazy")
    mm, mul, total = _line("# MARK-part-mm"), _line("# MARK-part-mul"), _line("# MARK-part-sum")
    assert [n.location.line for n in session.programs.fx_nodes(first.program)] == [mm, mm, total]
    assert [n.location.line for n in session.programs.fx_nodes(parted.program)] == [mm, mm, mul, total]


# -- recompiles of fused graphs, op by op ----------------------------------------------------


def _lazy_info(ops, outputs, args, *, key):
    graph = GraphInfo("lazy", (), "", DynamoOrigin(True), ops=tuple(ops), outputs=tuple(outputs))
    return CompileInfo("lazy", "lazy/synchronize", key, tuple(args), 0.1, graph=graph, replayed=False)


def _observe(tracker, info, locations=()):
    # one line for every compile: a lazy graph is known by the line that cut it
    return tracker.observe(info, op_locations=locations)


def _op(name, inputs, *args, outputs=("float32[4]",)):
    return LazyNode(name, tuple(inputs), tuple(args), tuple(outputs))


X4 = ArgSpec("self", (4,), "float32")


def test_lazy_key_diffs_name_the_op_the_input_or_the_output_that_changed():
    tracker = RecompileTracker()
    inputs = (ArgSpec("mul.Tensor.self", (4,), "float32"), ArgSpec("float scalars", (1,), "float32"))
    base = [_op("mul.Tensor", ("in0", "s0"), X4), _op("sum.dim_IntList", ("n0",), X4, ArgSpec("dim", static=[0]))]
    first = _observe(tracker, _lazy_info(base, ("n1",), inputs, key=1))
    assert not first.recompile and first.identity.startswith("graph cut by torch.tpu.synchronize() at ")

    # a batch of another size: the graph input's shape
    wider = (ArgSpec("mul.Tensor.self", (6,), "float32"), inputs[1])
    seen = _observe(tracker, _lazy_info(base, ("n1",), wider, key=2))
    assert seen.recompile and [d.render() for d in seen.diffs] == ["arg 0 'mul.Tensor.self': f32[4] -> f32[6]"]

    # the same ops with another static argument: that op, and its line
    other_dim = [base[0], _op("sum.dim_IntList", ("n0",), X4, ArgSpec("dim", static=[-1]))]
    seen = _observe(tracker, _lazy_info(other_dim, ("n1",), inputs, key=3), [None, None])
    assert [d.render() for d in seen.diffs] == ["static arg 'op 1 sum.dim_IntList: dim': [0] -> [-1]"]

    # another op recorded (Python control flow): where the sequences part, with the op's line
    loc = tpu_debug.tracers.events.SourceLocation("/x/train.py", 40, "step")
    branch = [base[0], _op("neg", ("n0",), X4), _op("sum.dim_IntList", ("n1",), X4, ArgSpec("dim", static=[0]))]
    seen = _observe(tracker, _lazy_info(branch, ("n2",), inputs, key=4), [None, loc, None])
    assert seen.diffs == (
        KeyDiff("graph", "-", "neg", detail="op 1 at train.py:40"),
        KeyDiff("graph", "2 ops", "3 ops", detail="ops"),
    )
    assert seen.diffs[0].render() == "op 1 at train.py:40: - -> neg"

    # one more value still referenced when the graph runs: one more program output
    seen = _observe(tracker, _lazy_info(base, ("n0", "n1"), inputs, key=5), [loc, None])
    assert [d.render() for d in seen.diffs] == ["outputs: 1 values -> 2 values (new: n0 mul.Tensor at train.py:40)"]


def test_a_recompiled_fused_graph_in_a_run(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to("tpu")
    with tpu_debug.trace(logdir=tmp_path, eager_mode="defer_and_fuse") as session:
        for n in (3, 3, 5):
            model(torch.randn(n, 4).to("tpu")).sum().item()  # MARK-loop
    lazy_compiles = session.compiles(mode="lazy")
    assert [bool(c.diffs) for c in lazy_compiles] == [False, True]
    (diff,) = lazy_compiles[1].diffs
    assert (diff.aspect, diff.before, diff.now) == ("shape", "f32[3,4]", "f32[5,4]")
    (group,) = [g for g in session.recompiles.groups() if g.mode == "lazy"]
    assert group.identity == f"graph cut by .item() at {os.path.basename(__file__)}:{_line('# MARK-loop')}"
    # no optimizer step, no split step: the overview notes the graphs and their programs
    from tpu_debug.tui.screens.overview import finding_lines

    findings = finding_lines(tpu_debug.open_run(session.run_dir), None)
    (finding,) = [f for f in findings if "lazy graph" in f.text.plain]
    assert (finding.text.plain, finding.severity) == ("3 lazy graph(s) run as 2 program(s), 2 compiled", "info")


# -- options ------------------------------------------------------------------------------


def test_eager_mode_option_everywhere():
    assert TraceConfig.from_env({"TPU_DEBUG_EAGER_MODE": "Defer_And_Fuse"}).eager_mode == "defer_and_fuse"
    assert TraceConfig().override(eager_mode=FUSE).eager_mode == "defer_and_fuse"
    with pytest.raises(ConfigError, match=r"TPU_DEBUG_EAGER_MODE='fast' is not an eager mode; use one of "):
        TraceConfig.from_env({"TPU_DEBUG_EAGER_MODE": "fast"})
    with pytest.raises(ConfigError, match=r"^eager_mode='DEBUG': expected one of defer_and_fuse, defer_never, "):
        tpu_debug.trace(eager_mode="DEBUG")
    import argparse

    parser = argparse.ArgumentParser()
    prepare_parser(parser)
    assert parser.parse_args(["--eager-mode", "defer_and_fuse", "s.py"]).eager_mode == "defer_and_fuse"


def test_materialization_event_round_trips(tmp_path):
    with tpu_debug.trace(logdir=tmp_path, eager_mode=FUSE) as session:
        x = torch.ones(3, device="tpu") + 1
        torch.tpu.synchronize()
    (e,) = session.events("materialize")
    assert isinstance(e, MaterializationEvent) and e.trigger == "synchronize" and e.mode == "lazy"
    assert (e.ops, e.outputs, e.compiled, e.step) == (2, 1, True, 0)
    del x
