"""Dynamo never traces tpu_debug: the hooks a trace installs into the user's program (the
optimizer-step hooks, the guards, the backend's lazy backward compile) leave a compiled
training step with the graphs and graph breaks it has without tracing."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from tpu_debug.tracers.location import own_dirs

import tpu_debug


class _Log(logging.Handler):
    """Dynamo's own log (``TORCH_LOGS=+dynamo``): it names each frame it starts tracing."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def dynamo_log() -> Iterator[_Log]:
    handler = _Log()
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(dynamo=logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()


def _compiled_training(trace_options: dict | None, logdir) -> tuple[int, dict[str, int]]:
    """Three steps of a compiled forward+backward+opt.step with an LR scheduler (the third
    meets the lr StepLR halved: dynamo makes one more graph; a fourth step adds no graph
    and no break); the number of graphs dynamo made and its graph breaks by reason."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step, backend="tpu_debug")
    x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 1).to("tpu")

    def loop() -> None:
        for _ in range(3):
            compiled(x, y)
            sched.step()

    if trace_options is None:
        loop()
    else:
        with tpu_debug.trace(logdir=logdir, **trace_options):
            loop()
    return counters["stats"]["unique_graphs"], dict(counters["graph_break"])


# every tracer a trace can run on CPU, and the transfer guards; fail_on_recompile is left
# out because the scheduler's Python float lr does recompile opt.step (a true finding)
EVERYTHING = {
    "hlo": True,
    "op_events": True,
    "tensorboard": True,
    "divergence": True,
    "transfer_guard": "log",
    "transfer_guard_implicit": "log",
    "memory": True,
}


def test_tracing_leaves_a_compiled_steps_graphs_and_breaks_as_they_are(tmp_path, dynamo_log):
    graphs_off, breaks_off = _compiled_training(None, None)
    graphs_on, breaks_on = _compiled_training(EVERYTHING, tmp_path / "runs")
    assert graphs_off > 0 and breaks_off  # the step has graphs and breaks of its own (backward, opt.step)
    assert (graphs_on, breaks_on) == (graphs_off, breaks_off)
    traced = [m for m in dynamo_log.messages if "torchdynamo start tracing " in m]
    assert any(os.path.basename(__file__) in m for m in traced)  # the log names the user's frames
    ours = tuple(os.path.realpath(d) for d in own_dirs())
    assert [m for m in traced if any(d in m for d in ours)] == []
    # a break's reason names the function dynamo would not trace: never one of ours
    assert [b for b in breaks_on if any(d in b for d in ours)] == []
