"""Lazy mode: a read written after optimizer.step() (a metric at each step, a read after an
inner loop) does not cut the step's work and is not told to move; a read inside the step is."""

from __future__ import annotations

import sys

import torch
from torch import nn
from tpu_debug.tracers.reading.lazy_graphs import summarize

import tpu_debug

FUSE = torch.tpu.EagerMode.DEFER_AND_FUSE
MOVE = "move the read after optimizer.step()"


def _line(offset: int = 0) -> int:
    return sys._getframe(1).f_lineno + offset


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16).to("tpu"), torch.randint(0, 4, (64,)).to("tpu")
    return model, opt, x, y


def _lazy_section(session) -> str:
    report = session.summary(width=200)
    return report[report.index("Lazy graphs") :]


def test_a_metric_read_after_the_step_at_every_step_does_not_split_the_step(logdir):
    model, opt, x, y = _setup()
    accs = []
    with tpu_debug.trace(logdir=logdir, eager_mode=FUSE, hlo=False) as session:
        for i in range(0, 64, 8):
            logits = model(x[i : i + 8])
            loss = nn.functional.cross_entropy(logits, y[i : i + 8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            accs.append((logits.argmax(1) == y[i : i + 8]).float().mean().cpu())
            read = _line(-1)
        events = session.events("materialize")
    assert len(accs) == 8
    reads = [e for e in events if e.trigger == "cpu" and e.outputs]
    # the read runs the metric as a graph of its own after each step: 8 of them
    assert len(reads) == 8 and {e.location.line for e in reads} == {read}
    lazy = summarize(events)
    assert (lazy.split_steps, lazy.extra_cuts) == (0, ())
    assert MOVE not in _lazy_section(session)


def test_a_read_after_an_inner_loop_does_not_split_the_next_epoch(logdir):
    model, opt, x, y = _setup()
    with tpu_debug.trace(logdir=logdir, eager_mode=FUSE, hlo=False) as session:
        for _epoch in range(3):
            losses = []
            for i in range(0, 64, 16):
                loss = nn.functional.cross_entropy(model(x[i : i + 16]), y[i : i + 16])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            epoch_loss = torch.stack(losses).mean().cpu()
        events = session.events("materialize")
    assert epoch_loss.shape == ()
    lazy = summarize(events)
    assert lazy.steps == 12 and (lazy.split_steps, lazy.extra_cuts) == (0, ())
    assert MOVE not in _lazy_section(session)


def test_a_read_inside_the_step_still_splits_it(logdir):
    model, opt, x, y = _setup()
    with tpu_debug.trace(logdir=logdir, eager_mode=FUSE, hlo=False) as session:
        for i in range(0, 64, 16):
            loss = nn.functional.cross_entropy(model(x[i : i + 16]), y[i : i + 16])
            if torch.isnan(loss):
                raise AssertionError("the loss of a fixed seed is finite")
            read = _line(-2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        events = session.events("materialize")
    lazy = summarize(events)
    (cut,) = lazy.extra_cuts
    assert (cut.trigger, cut.location.line, cut.count, lazy.split_steps) == ("bool", read, 4, 4)
    assert MOVE in _lazy_section(session)


def _train_step(model, opt, x, y, check: bool):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    if check and torch.isnan(loss):
        raise AssertionError("the loss of a fixed seed is finite")
    opt.zero_grad()
    loss.backward()
    opt.step()
    return logits


CHECK_LINE = _train_step.__code__.co_firstlineno + 3


def test_a_read_in_the_caller_after_a_train_step_function_does_not_split_the_step(logdir):
    # opt.step() runs inside _train_step; the read is in the loop that called it, after the call
    model, opt, x, y = _setup()
    with tpu_debug.trace(logdir=logdir, eager_mode=FUSE, hlo=False) as session:
        for i in range(0, 64, 16):
            logits = _train_step(model, opt, x[i : i + 16], y[i : i + 16], check=False)
            (logits.argmax(1) == y[i : i + 16]).float().mean().cpu()
            read = _line(-1)
        events = session.events("materialize")
    assert [e.after_step for e in events if e.trigger == "cpu"] == [True] * 4
    assert {e.location.line for e in events if e.trigger == "cpu"} == {read}
    lazy = summarize(events)
    assert (lazy.split_steps, lazy.extra_cuts) == (0, ())


def test_a_read_inside_a_train_step_function_still_splits_the_step(logdir):
    # each call is a new frame of the same function: the read at its line 4 is before its
    # opt.step(), whatever frame the previous call's step was seen in
    model, opt, x, y = _setup()
    with tpu_debug.trace(logdir=logdir, eager_mode=FUSE, hlo=False) as session:
        for i in range(0, 64, 16):
            _train_step(model, opt, x[i : i + 16], y[i : i + 16], check=True)
        events = session.events("materialize")
    lazy = summarize(events)
    (cut,) = lazy.extra_cuts
    assert (cut.trigger, cut.location.line, cut.count, lazy.split_steps) == ("bool", CHECK_LINE, 4, 4)
