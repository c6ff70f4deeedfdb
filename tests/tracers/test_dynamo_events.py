"""Dynamo's side of recompiles: failed guards, graph breaks, the recompile limit,
read through PyTorch's logging while a trace is active."""

from __future__ import annotations

import logging

import pytest
import torch
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.recording.dynamo_events import clean_guard, guard_diffs
from tpu_debug.tracers.events import KeyDiff
from tpu_debug.tracers.reading.recompile_analysis import describe

import tpu_debug
from tpu_debug.core.errors import RecompileError


@pytest.fixture(autouse=True)
def _forget_graphs():
    """Graphs compiled here are not replayed into the runs of later tests."""
    from tpu_debug.runtime import compiled

    before = list(compiled._graphs)
    yield
    with compiled._lock:
        compiled._graphs[:] = before


def _ours(logger: str) -> list:
    return [h for h in logging.getLogger(logger).handlers if type(h).__module__ == dynamo_events.__name__]


def test_guard_text_becomes_structured_diffs():
    assert clean_guard("0/1: n == 2    # y = x * n  # f.py:3 in f\nUser stack trace:\n  ...") == (
        "0/1",
        "n == 2",
    )
    assert guard_diffs("tensor 'x' size mismatch at index 1. expected 8, actual 9") == [
        KeyDiff("shape", "8", "9", arg_name="x", dims=(1,), source="guard")
    ]
    assert guard_diffs("tensor 'x' dtype mismatch. expected Float, actual BFloat16") == [
        KeyDiff("dtype", "Float", "BFloat16", arg_name="x", source="guard")
    ]
    assert guard_diffs("tensor 'x' requires_grad mismatch. expected requires_grad=0") == [
        KeyDiff("grad", "False", "True", arg_name="x", detail="requires_grad", source="guard")
    ]
    assert guard_diffs("L['lr'] == 0.5") == [
        KeyDiff("scalar", "0.5", "changed", arg_name="lr", source="guard")
    ]
    assert guard_diffs("___check_obj_id(L['self'], 1403)") == [
        KeyDiff("guard", "___check_obj_id(L['self'], 1403)", "failed", source="guard")
    ]


def test_size_guard_failure_and_dynamic_recompiles(logdir):
    def scale(x):
        return (x * 2).relu()

    fn = tpu_debug.compile(scale)
    xs = [torch.randn(n, 3, device="tpu") for n in (4, 5, 6)]
    with tpu_debug.trace(logdir=logdir) as session:
        for x in xs:
            fn(x)  # the call that recompiles
    assert not _ours("torch.__trace") and not _ours("torch._dynamo.convert_frame")  # removed after
    (failure,) = session.recompiles.guard_failures()
    assert failure.name == "scale" and failure.mode == "compiled"
    assert failure.guards[0].endswith(": tensor 'x' size mismatch at index 0. expected 4, actual 5")
    assert failure.location.file == __file__
    compiles = session.compiles(mode="compiled")
    # a compiled function is named by its name and the line it starts at
    line = scale.__code__.co_firstlineno
    assert [c.identity for c in compiles] == [f"scale in test_dynamo_events.py:{line} (forward)"] * 3
    first, dynamo_recompile, xla_recompile = compiles
    assert first.diffs == () and dynamo_recompile.previous == first.id
    assert dynamo_recompile.diffs[0] == KeyDiff("shape", "4", "5", arg_name="x", dims=(0,), source="guard")
    # the second graph has a dynamic size: XLA still compiles once per size, dynamo does not retrace
    assert [d.render() for d in xla_recompile.diffs] == [
        "static arg 'x.size()[0]': 5 -> 6",
        "arg 1 'x': f32[5,3] -> f32[6,3]",
    ]
    (group,) = [g for g in session.recompiles.groups() if g.mode == "compiled"]
    assert (group.recompiles, group.changing.what, group.changing.values) == (
        2,
        "dim 0 of arg 0 'x'",
        ("4", "5", "6"),
    )


def test_scalar_grad_mode_and_requires_grad_guards(logdir):
    def affine(x, n):
        return x * n + 1

    fn = tpu_debug.compile(affine)
    x = torch.randn(3, device="tpu")
    w = torch.randn(3, device="tpu").requires_grad_()
    with tpu_debug.trace(logdir=logdir) as session:
        fn(x, 2)
        fn(x, 3)  # n is a Python int: baked in, then made dynamic
        with torch.no_grad():
            fn(x, 3)
        fn(w, 3)
    failures = session.recompiles.guard_failures()
    assert failures[0].guards[0].split(": ", 1)[1] == "n == 2"
    # each cached graph's failed guard, the most recent graph first
    reasons = {g.split(": ", 1)[1] for f in failures for g in f.guards}
    assert "GLOBAL_STATE changed: grad_mode" in reasons
    assert "tensor 'x' requires_grad mismatch. expected requires_grad=0" in reasons
    texts = [describe(d) for c in session.compiles(mode="compiled") for d in c.diffs]
    assert "python scalar 'n' was baked in as 2; this call passed 3" in texts
    assert "grad mode: enabled -> disabled" in texts
    assert "tensor 'x' requires_grad: False -> True" in texts


def test_graph_break_recorded_with_reason_and_line(logdir):
    def noisy(x):
        y = x + 1
        print("between graphs")  # breaks the graph
        return y * 2

    fn = tpu_debug.compile(noisy)
    x = torch.ones(2, device="tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        out = fn(x)
    assert out.cpu().tolist() == [4.0, 4.0]
    (brk,) = session.recompiles.graph_breaks()
    assert brk.name == "noisy" and brk.mode == "compiled"
    assert brk.reason.startswith(
        "Failed to trace builtin operator: Dynamo does not know how to trace builtin operator `print`"
    )
    assert brk.location.file == __file__
    assert brk.location.line == noisy.__code__.co_firstlineno + 2 and brk.location.function == "noisy"
    identities = {c.identity for c in session.compiles(mode="compiled")}
    assert identities == {
        f"noisy in test_dynamo_events.py:{noisy.__code__.co_firstlineno} (forward)",
        f"noisy (after the graph break at line {brk.location.line}) in test_dynamo_events.py:{brk.location.line} (forward)",
    }
    assert "graph breaks:" in session.summary(width=300)


def test_recompile_limit_hit(logdir):
    def limited(x):
        return x.exp()

    fn = tpu_debug.compile(limited)
    xs = [torch.ones(n, device="tpu") for n in (2, 3, 4, 5)]
    limits = torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False)
    with limits, tpu_debug.trace(logdir=logdir) as session:
        for x in xs:
            fn(x)
    (hit,) = session.recompiles.limits()
    name = f"limited in test_dynamo_events.py:{limited.__code__.co_firstlineno}"
    assert (hit.name, hit.limit_type, hit.limit, hit.identity) == (name, "recompile_limit", 2, f"{name} (forward)")
    assert {c.identity for c in session.compiles(mode="compiled")} == {hit.identity}
    assert hit.reason == "tensor 'x' size mismatch at index 0. expected 3, actual 4"
    assert hit.location.file == __file__
    assert "hit dynamo's recompile_limit (2)" in session.summary(width=300)


def test_expect_no_recompiles_names_the_failed_guard():
    def double(x):
        return x * 2

    fn = tpu_debug.compile(double)
    a, b = torch.ones(2, device="tpu"), torch.ones(7, device="tpu")
    fn(a)
    line = double.__code__.co_firstlineno
    pattern = rf"(?s)^double in test_dynamo_events.py:{line} \(forward\) recompiled at .*tensor 'x' dim 0: 2 -> 7"
    with pytest.raises(RecompileError, match=pattern), tpu_debug.expect_no_recompiles():
        fn(b)
    assert not _ours("torch.__trace")


def test_a_raising_listener_does_not_break_the_compile(monkeypatch):
    """A listener that raises on a graph break: the function still compiles and runs, the
    failure is kept as text in the bounded log and handed to the listener."""
    from tpu_debug.core.hooks import ErrorLog

    log = ErrorLog()
    monkeypatch.setattr(dynamo_events, "internal_errors", log)

    class Broken:
        def __init__(self):
            self.handled = []

        def on_graph_break(self, brk):
            raise LookupError(f"no table for {brk.function}")

        def on_internal_error(self, method, exc):
            self.handled.append((method, type(exc).__name__))

    def breaks(x):
        y = x * 3
        print("between graphs")  # breaks the graph
        return y - 1

    listener = Broken()
    dynamo_events.subscribe(listener)
    try:
        out = tpu_debug.compile(breaks)(torch.arange(3.0, device="tpu"))
    finally:
        dynamo_events.unsubscribe(listener)
    assert out.cpu().tolist() == (torch.arange(3.0) * 3 - 1).tolist()
    assert listener.handled == [("on_graph_break", "LookupError")]
    (error,) = log
    assert (error.where, error.type, error.message) == (
        "Broken.on_graph_break",
        "LookupError",
        "no table for breaks",
    )
    assert log.count == 1


def test_a_failed_guard_names_the_users_line_that_reads_the_value():
    from tpu_debug.tracers.recording.dynamo_events import clean_guard, guard_location

    text = (
        "0/3: self.calls == 3                     # self.calls += 1  # /home/me/train.py:14 in forward "
        "(HINT: torch.compile considers integer attributes of the nn.Module to be static.)\n"
        'User stack trace:\n  File "/home/me/train.py", line 14, in forward\n    self.calls += 1'
    )
    assert clean_guard(text) == ("0/3", "self.calls == 3")
    loc = guard_location(text)
    assert (loc.file, loc.line, loc.function) == ("/home/me/train.py", 14, "forward")
    assert guard_location("0/1: tensor 'x' size mismatch at index 0. expected 8, actual 9") is None


SETTINGS = {"scale": 2.0}


def test_recompile_diff_says_clip_3_0_changed(logdir):
    # a value guard gives the value a graph was compiled for; the diff also shows the one the call
    # passed, read from the call dynamo compiles again (a local, and a global dict's entry)
    def clipped(x, clip):
        return (x * clip * SETTINGS["scale"]).sum()

    fn = tpu_debug.compile(clipped)
    x = torch.ones(4, device="tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        fn(x, 3.0)
        fn(x, 5.0)
        SETTINGS["scale"] = 4.0
        fn(x, 5.0)
    SETTINGS["scale"] = 2.0
    rendered = [d.render() for c in session.compiles(mode="compiled") for d in c.diffs if d.aspect == "scalar"]
    assert "python scalar baked in 'clip': 3.0 -> 5.0" in rendered
    assert any(r.endswith(": 2.0 -> 4.0") and "scale" in r for r in rendered), rendered
    assert not any(r.endswith("-> changed") for r in rendered), rendered
