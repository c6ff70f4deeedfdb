"""The parts a trace starts and stops (tpu_debug/tracer_parts.py): their declared order, and a
stop that fails leaving the others to stop."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tpu_debug.runtime import probes

import tpu_debug
from tpu_debug import tracer_parts, tracing
from tpu_debug.tracer_parts import PARTS, Running, TracerPart, start_order, stop_all, stop_order


def _names(parts):
    return [p.name for p in parts]


def _noop(_run):
    pass


def test_each_part_starts_after_what_it_uses_and_stops_after_what_it_outlives():
    starts, stops = _names(start_order(PARTS)), _names(stop_order(PARTS))
    assert sorted(starts) == sorted(stops) == sorted(_names(PARTS))
    for part in PARTS:
        assert all(starts.index(d) < starts.index(part.name) for d in part.after), part.name
        assert all(stops.index(d) < stops.index(part.name) for d in part.stop_after), part.name
    # the recorder hears everything: first in, last out; the eager mode is put back before any
    # tracer stops, so what lazy mode still holds runs while they record
    assert starts[0] == stops[-1] == "recorder"
    assert stops[0] == "eager_mode"
    # the loop's steps the step tracker finds as it stops get TPU estimates, and both reach TensorBoard
    assert stops.index("steps") < stops.index("target") < stops.index("tensorboard")
    assert stops.index("target") < stops.index("torch_trace")


def test_the_order_is_the_declared_one_moved_only_where_a_part_says():
    a = TracerPart("a", _noop, _noop, "a")
    b = TracerPart("b", _noop, _noop, "b", after=("c",))  # moved behind c
    c = TracerPart("c", _noop, _noop, "c")
    d = TracerPart("d", _noop, _noop, "d", stop_after=("a", "absent"))  # a part not in the run is ignored
    assert _names(start_order([a, b, c, d])) == ["a", "c", "b", "d"]
    # stops: the reverse (d b c a), but d outlives a
    assert _names(stop_order([a, b, c, d])) == ["b", "c", "a", "d"]
    loop = [TracerPart("x", _noop, _noop, "x", after=("y",)), TracerPart("y", _noop, _noop, "y", after=("x",))]
    with pytest.raises(ValueError, match=r"^tracer parts ordered in a loop: x, y$"):
        start_order(loop)


def test_every_stop_runs_when_one_fails_and_an_interrupt_waits_for_them():
    stopped, errors = [], []

    class Recorder:
        def record_error(self, where, message):
            errors.append((where, message))

    def stop(name, exc=None):
        def run(_run):
            stopped.append(name)
            if exc is not None:
                raise exc

        return run

    parts = [
        TracerPart("first", _noop, stop("first"), "first.close"),
        TracerPart("broken", _noop, stop("broken", RuntimeError("planted")), "broken.close"),
        TracerPart("interrupted", _noop, stop("interrupted", KeyboardInterrupt("planted interrupt")), "interrupted.close"),
        TracerPart("last", _noop, stop("last"), "last.close"),
    ]
    run = Running(None, None, None, Recorder(), None, print)
    with pytest.raises(KeyboardInterrupt, match=r"^planted interrupt$"):
        stop_all(parts, run)
    assert stopped == ["last", "interrupted", "broken", "first"]
    assert errors == [("broken.close", "RuntimeError: planted")]


def test_a_failing_stop_in_a_trace_is_a_tracer_error_and_the_run_closes(logdir, monkeypatch):
    def failing(real):
        def stop(run):
            real(run)
            raise RuntimeError("planted")

        return stop

    parts = tuple(dataclasses.replace(p, stop=failing(p.stop)) if p.name == "collectives" else p for p in PARTS)
    monkeypatch.setattr(tracing, "PARTS", parts)
    subscribed = probes.active()
    x = torch.arange(4.0)
    with tpu_debug.trace(logdir=logdir) as session:
        for _ in range(3):
            y = (x.to("tpu") * 2).cpu()
    torch.testing.assert_close(y, x * 2)
    assert [(e.where, e.message) for e in session.internal_errors()] == [("CollectivesTracer.close", "RuntimeError: planted")]
    assert session.metadata().status == "finished"
    # the parts stopped after it did stop: the step tracker wrote the loop's steps, every probe left
    assert [s.index for s in session.steps()] == [0, 1, 2]
    assert probes.active() == subscribed
    assert tracer_parts.PARTS is not parts  # the declaration itself was left alone
