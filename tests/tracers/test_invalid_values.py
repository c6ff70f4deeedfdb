"""What a TPU would compute silently, named under a trace (tracers/recording/invalid_value_tracer.py and the
advisor's ``invalid_value`` rule): a planted out-of-range ``gather`` index in a training loop
is one error finding at its line in eager, lazy and compiled runs, raised or not, and a correct
loop beside it gives none. (The runtime's checks themselves, and their messages against CPU's,
are tests/runtime/test_value_checks.py's.)"""

from __future__ import annotations

import pytest
import torch
from tpu_debug.core.records import InvalidValueInfo
from tpu_debug.runtime.config import config
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.advisor import RunFacts, lookup
from tpu_debug.tracers.reading.invalid_values_query import InvalidValuePlace
from tpu_debug.tracers.recording.invalid_value_tracer import InvalidValueTracer

import tpu_debug

TPU = torch.device("tpu")
STEPS = 3


def planted_loss(logits, idx):
    return torch.gather(logits, 1, idx).sum()  # the planted index


def correct_loss(logits, idx):
    return torch.gather(logits, 1, idx).sum()  # the correct index


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith(marker))


PLANTED, CORRECT = _line("# the planted index"), _line("# the correct index")


def _train(loss_fn, idx, *, raises: bool = False) -> None:
    """STEPS steps of a tiny classifier whose loss gathers at ``idx`` (a raised refusal ends
    the step, as it would end a user's loop at the line)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4).to(TPU)
    for _ in range(STEPS):
        opt.zero_grad()
        try:
            loss = loss_fn(model(x), idx)
        except RuntimeError as exc:
            assert raises and "index 7 is out of bounds for dimension 1 with size 3" in str(exc)
            continue
        loss.backward()
        opt.step()
    if not raises:
        loss.detach().cpu()


def _record(tmp_path, mode: str, *, checks: bool | None = None):
    """Both loops in one traced run in ``mode``; the planted one raises in eager mode (the
    runtime checks eager indices by default) and where ``checks`` turns the data checks on."""
    good, bad = torch.tensor([[0, 2], [1, 2]]).to(TPU), torch.tensor([[0, 7], [1, 2]]).to(TPU)
    planted, correct = planted_loss, correct_loss
    if mode == "compiled":
        torch._dynamo.reset()
        planted = torch.compile(planted_loss, backend="tpu_debug", dynamic=False)
        correct = torch.compile(correct_loss, backend="tpu_debug", dynamic=False)
    options = {"eager_mode": "defer_and_fuse"} if mode == "lazy" else {}
    saved = config.data_checks
    config.data_checks = checks
    try:
        with tpu_debug.trace(logdir=tmp_path, name=mode, hlo=False, **options) as session:
            _train(correct, good)
            _train(planted, bad, raises=mode == "eager" or bool(checks))
    finally:
        config.data_checks = saved
        if mode == "compiled":
            torch._dynamo.reset()
    return session


def _only_finding(session):
    found = [f for f in session.findings() if f.kind == "invalid_value"]
    assert len(found) == 1, [f.title for f in found]
    return found[0]


@pytest.mark.parametrize("mode", ["eager", "lazy", "compiled"])
def test_a_planted_index_is_one_error_at_its_line(tmp_path, mode):
    session = _record(tmp_path, mode)
    finding = _only_finding(session)
    assert finding.severity == "error"
    loc = finding.evidence.location
    assert (loc.file, loc.line) == (__file__, PLANTED)
    assert finding.title.startswith(
        f"gather index 7 out of range [0, 3) at test_invalid_values.py:{PLANTED}: "
        "a TPU clamps it and reads another row; CPU PyTorch raises"
    ), finding.title
    assert "TPU_DEBUG_DATA_CHECKS=1" in finding.fix and "TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS=1" in finding.fix
    assert finding.evidence.count("occurrences") == STEPS
    raised = mode == "eager"
    assert ("raised at the op in this run (RuntimeError)" in finding.evidence.facts) == raised
    # every step met it: one place per (line, op, argument) with its count, never one row a step
    places = session.invalid_values()
    assert {(p.event.location.line, p.event.raised, p.count) for p in places if p.event.phase == "forward"} == {
        (PLANTED, raised, STEPS)
    }
    assert len(session.events("invalid_value")) <= 2 * len(places)
    if mode != "eager":  # the backward's scatter_add met the same index: folded into the finding
        (back,) = [p for p in places if p.event.phase == "backward"]
        assert back.event.op.startswith("scatter_add") and back.count == STEPS
        assert any(f.startswith("its backward") for f in finding.evidence.facts)
    assert all(p.event.location.line != CORRECT for p in places)


def test_the_switch_raises_at_the_line_and_the_finding_stays(tmp_path):
    """With the data checks on, a lazy program raises PyTorch's error at the op: the finding is
    the same one, saying it was raised."""
    finding = _only_finding(_record(tmp_path, "lazy", checks=True))
    assert (finding.evidence.location.line, finding.evidence.count("occurrences")) == (PLANTED, STEPS)
    assert "raised at the op in this run (RuntimeError)" in finding.evidence.facts


def test_a_tracer_failure_never_breaks_the_program(tmp_path, monkeypatch):
    def broken(self, *args):
        raise RuntimeError("tracer bug")

    monkeypatch.setattr(InvalidValueTracer, "_seen", broken)
    session = _record(tmp_path, "lazy")  # runs to its end: the planted loop does not raise lazily
    assert not [f for f in session.findings() if f.kind == "invalid_value"]
    errors = [(e.where, e.message) for e in session.internal_errors()]
    assert ("InvalidValueTracer.on_invalid_value", "RuntimeError: tracer bug") in errors


class _Run:
    """A run holding only ``places`` (what the rule reads), with no steps."""

    def __init__(self, places) -> None:
        self._places = places

    def invalid_values(self):
        return self._places

    def steps(self):
        return []


def _place(op, argument, value, low, high, *, phase="forward", node="", silent="clamped", line=9, count=2):
    event = ev.InvalidValueEvent(line, 0.5, "lazy", 1, ev.SourceLocation(__file__, line, "f"), InvalidValueInfo(op, argument, value, low, high, "message", "RuntimeError", silent, "lazy", False), phase=phase, autograd_node=node, count=count)
    return InvalidValuePlace(event, 0.5)


def test_a_backward_alone_is_its_own_finding_and_a_forward_takes_in_its_backward():
    rule = lookup("invalid_value").check
    forward = _place("gather", "index", 7.0, 0.0, 3.0, line=9)
    folded = _place("scatter_add_", "index", 7.0, 0.0, 3.0, phase="backward", node="GatherBackward0", line=10)
    alone = _place("embedding_dense_backward", "indices", 12.0, 0.0, 10.0, phase="backward",
                   node="EmbeddingBackward0", line=11)
    found = list(rule(RunFacts(_Run([forward, folded, alone]))))
    assert [f.evidence.location.line for f in found] == [9, 11]
    assert "its backward (GatherBackward0) met it again: scatter_add_ at" in " ".join(found[0].evidence.facts)
    assert found[1].title.endswith("(in the backward of EmbeddingBackward0)")
    assert "embedding_dense_backward indices 12 out of range [0, 10)" in found[1].title


def test_an_invalid_distribution_is_named_as_one():
    place = _place("multinomial", "self", -0.1, 0.0, None, silent="sampled")
    (finding,) = lookup("invalid_value").check(RunFacts(_Run([place])))
    assert finding.title.startswith("multinomial self is not a probability distribution (message) at ")
    assert "a TPU samples from it anyway; CPU PyTorch raises" in finding.title
    assert "probabilities" in finding.fix
