"""``trace()`` failing half-way through its set-up: what it started is stopped, the run says why.

Each test makes one set-up step raise (divergence, guards, TensorBoard) after the steps
before it have started things (the recorder subscribed to the probes, the writer thread,
dynamo's log handlers, a running JAX profiler), then checks that nothing is left behind:
no probe, listener or transfer check still installed, the writer closed with the run
marked ``failed`` and the reason, and a following ``trace()`` recording normally.
"""

from __future__ import annotations

import pytest
import torch
from tpu_debug.runtime import probes
from tpu_debug.tracers.recording import dynamo_events
from tpu_debug.tracers.liveness import writer_alive

import tpu_debug
from tpu_debug.tracing import active_trace


class Injected(RuntimeError):
    pass


def _nothing_left_behind() -> None:
    assert probes.active() == ()
    assert probes._transfer_checks == ()
    assert not dynamo_events.installed()
    assert active_trace() is None


def _failed_run(logdir, message: str) -> None:
    (session,) = [tpu_debug.open_run(p) for p in tpu_debug.list_runs(logdir)]
    meta = session.metadata()
    assert (meta.status, meta.error) == ("failed", f"trace() could not start: Injected: {message}")
    assert meta.end_time is not None
    assert not writer_alive(session.db_path)  # the writer let go: the run is closed, not "killed"
    session.close()


def _traces_again(tmp_path, **options) -> tpu_debug.Session:
    x = torch.ones(4).to("tpu")
    with tpu_debug.trace(logdir=tmp_path / "again", **options) as session:
        y = (x * 3.0).cpu()
    assert y.tolist() == [3.0] * 4
    _nothing_left_behind()
    meta = session.metadata()
    assert meta.status == "finished"
    assert session.ops(name="mul.Tensor")[0].count == 1
    return session


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "runs"


def _raise_when_subscribing(monkeypatch, kind: type, message: str) -> None:
    """``probes.subscribe`` raises for a ``kind`` probe: what set-up started before stays started."""
    subscribe = probes.subscribe

    def failing(probe, **kwargs):
        if isinstance(probe, kind):
            raise Injected(message)
        subscribe(probe, **kwargs)

    monkeypatch.setattr(probes, "subscribe", failing)


def test_divergence_set_up_fails(monkeypatch, logdir, tmp_path):
    from tpu_debug.tracers.recording.divergence import DivergenceTracer

    closed = []
    monkeypatch.setattr(DivergenceTracer, "close", lambda self: closed.append(self))
    _raise_when_subscribing(monkeypatch, DivergenceTracer, "no divergence today")
    with (
        pytest.raises(Injected, match="no divergence today"),
        tpu_debug.trace(logdir=logdir, divergence=True),
    ):
        pytest.fail("the block ran although trace() failed")
    assert len(closed) == 1  # the tracer was made before it failed to subscribe: it was closed
    _nothing_left_behind()
    _failed_run(logdir, "no divergence today")
    monkeypatch.undo()
    _traces_again(tmp_path, divergence=True)


def test_guards_set_up_fails(monkeypatch, logdir, tmp_path):
    def failing(check):
        raise Injected("no transfer guard today")

    # the guards start dynamo's log handlers and the recompile guard, then fail on the transfer check
    monkeypatch.setattr(probes, "add_transfer_check", failing)
    with (
        pytest.raises(Injected, match="no transfer guard today"),
        tpu_debug.trace(logdir=logdir, fail_on_recompile=True, transfer_guard="log"),
    ):
        pytest.fail("the block ran although trace() failed")
    _nothing_left_behind()
    _failed_run(logdir, "no transfer guard today")
    monkeypatch.undo()
    _traces_again(tmp_path, fail_on_recompile=True, transfer_guard="log")


def test_tensorboard_set_up_fails(monkeypatch, logdir, tmp_path):
    from tpu_debug.tracers.recording.tensorboard_exporter import TensorBoardExporter
    from tpu_debug.tracers.xplane import profile_files

    # the exporter has started the JAX profiler and hears the writer's events when this fails
    _raise_when_subscribing(monkeypatch, TensorBoardExporter, "no tensorboard today")
    with (
        pytest.raises(Injected, match="no tensorboard today"),
        tpu_debug.trace(logdir=logdir, tensorboard=True),
    ):
        pytest.fail("the block ran although trace() failed")
    _nothing_left_behind()
    _failed_run(logdir, "no tensorboard today")
    monkeypatch.undo()
    # a profiler left running would make this one fail to start its own capture
    session = _traces_again(tmp_path, tensorboard=True)
    assert session.tensorboard_summary().status != "failed"
    assert len(profile_files(session.run_dir / "tensorboard")) == 1
