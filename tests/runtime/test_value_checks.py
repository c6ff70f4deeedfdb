"""Checks of argument values (runtime/value_checks.py): an index out of range, an invalid
probability distribution. PyTorch on CPU raises for them; XLA computes silently. Eagerly the
runtime raises CPU's error at the op; in lazy and compiled programs only with
``config.data_checks`` on; and a probe listening for ``on_invalid_value`` hears each one in
every mode, raised or not. (The messages for every op are checked against CPU's by
test_opinfo_errors.py, from PyTorch's own error inputs.)"""

from __future__ import annotations

import re
import sys

import pytest
import torch
from tpu_debug.runtime import lazy, probes
from tpu_debug.runtime.config import config
from tpu_debug.core.records import InvalidValueInfo

from tpu_debug.core.errors import OpArgumentError

TPU = torch.device("tpu")
MESSAGE = "index 5 is out of bounds for dimension 1 with size 3"


def _cpu_error(fn, *args) -> Exception:
    """What PyTorch on CPU raises for the call (the reference every tpu error is held to)."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - whatever CPU raises is the reference
        return exc
    raise AssertionError("CPU accepts the call")


def _gather(x, idx):
    return torch.gather(x, 1, idx)


def _bad_index():
    x = torch.arange(6.0).reshape(2, 3)
    idx = torch.tensor([[0, 5], [1, 2]])
    return x, idx


class Heard:
    def __init__(self) -> None:
        self.infos: list[InvalidValueInfo] = []
        self.sites: dict[int, str] = {}

    def on_invalid_value(self, info):
        self.infos.append(info)

    def on_defer(self, name, index, site):
        self.sites[site] = name


@pytest.fixture
def heard():
    probe = Heard()
    probes.subscribe(probe)
    try:
        yield probe
    finally:
        probes.unsubscribe(probe)


@pytest.fixture
def checks(monkeypatch):
    """Set ``config.data_checks`` for one test."""
    def set_to(value):
        monkeypatch.setattr(config, "data_checks", value)

    return set_to


def test_an_eager_gather_raises_what_cpu_raises():
    x, idx = _bad_index()
    cpu = _cpu_error(_gather, x, idx)
    with pytest.raises(type(cpu), match=re.escape(str(cpu))) as caught:
        _gather(x.to(TPU), idx.to(TPU))
    assert isinstance(caught.value, OpArgumentError)
    # in range, the result is CPU's
    good = torch.tensor([[0, 2], [1, 2]])
    assert torch.equal(_gather(x.to(TPU), good.to(TPU)).cpu(), _gather(x, good))


def test_an_eager_scatter_refused_leaves_its_target_unwritten():
    x, idx = torch.zeros(2, 3), torch.tensor([[0, 5]])
    target = x.to(TPU)
    with pytest.raises(RuntimeError, match=MESSAGE):
        target.scatter_(1, idx.to(TPU), 1.0)
    assert torch.equal(target.cpu(), x)


def test_eager_checks_off_compute_what_xla_computes(checks):
    checks(False)
    x, idx = _bad_index()
    out = _gather(x.to(TPU), idx.to(TPU))
    assert out.shape == idx.shape  # no error: the value is XLA's (a clamped or filled index)


def test_lazy_programs_are_unchanged_without_the_switch():
    x, idx = _bad_index()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        out = _gather(x.to(TPU), idx.to(TPU))
        names = [tpl.name for tpl, _refs in lazy._state.graph.steps]
        assert names and not any(n.startswith("check:") for n in names), names
        assert out.cpu().shape == idx.shape


def test_the_switch_makes_a_lazy_op_raise_at_the_op(checks):
    checks(True)
    x, idx = _bad_index()
    target = torch.zeros(2, 3).to(TPU)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = target + 1  # pending
        with pytest.raises(RuntimeError, match=MESSAGE):
            y.scatter_(1, idx.to(TPU)[:1], 1.0)
        assert torch.equal(y.cpu(), torch.ones(2, 3))  # refused before it was recorded
        assert torch.equal(_gather(x.to(TPU), torch.tensor([[0, 2]]).to(TPU)).cpu(), torch.tensor([[0.0, 2.0]]))


def _compiled_gather():
    return torch.compile(_gather, backend="tpu_debug", dynamic=False)


def test_compiled_programs_raise_only_with_the_switch(checks):
    torch._dynamo.reset()
    x, idx = _bad_index()
    fn = _compiled_gather()
    assert fn(x.to(TPU), idx.to(TPU)).cpu().shape == idx.shape
    checks(True)
    with pytest.raises(RuntimeError, match=MESSAGE):
        fn(x.to(TPU), idx.to(TPU))
    good = torch.tensor([[0, 2], [1, 2]])
    assert torch.equal(fn(x.to(TPU), good.to(TPU)).cpu(), _gather(x, good))
    torch._dynamo.reset()


def test_a_probe_hears_an_eager_index_out_of_range(heard):
    x, idx = _bad_index()
    with pytest.raises(RuntimeError, match=MESSAGE):
        _gather(x.to(TPU), idx.to(TPU))
    (info,) = heard.infos
    assert (info.op, info.argument, info.value, info.low, info.high) == ("gather", "index", 5, 0, 3)
    assert (info.mode, info.raised, info.error, info.silent) == ("eager", True, "RuntimeError", "clamped")
    assert info.message == MESSAGE


def test_a_probe_hears_a_lazy_index_after_the_graph_ran(heard):
    x, idx = _bad_index()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        out = _gather(x.to(TPU), idx.to(TPU))
        assert not heard.infos  # nothing ran yet
        out.cpu()
    (info,) = heard.infos
    assert (info.op, info.value, info.mode, info.raised) == ("gather", 5, "lazy", False)
    assert heard.sites[info.site] == "check:gather"  # the site the recorder keeps the line of


def test_a_probe_hears_a_compiled_index_with_its_node(heard):
    """The report is read where the program is waited for anyway (here the result's copy
    to the host), never by waiting for the program just dispatched."""
    torch._dynamo.reset()
    x, idx = _bad_index()
    out = _compiled_gather()(x.to(TPU), idx.to(TPU))
    assert not heard.infos  # dispatched, not waited for
    out.cpu()
    (info,) = heard.infos
    assert (info.op, info.value, info.mode, info.raised) == ("gather", 5, "compiled", False)
    assert "test_value_checks.py" in info.node.stack_trace and "_gather" in info.node.stack_trace
    torch._dynamo.reset()


@pytest.mark.parametrize("end", ["synchronize", "unsubscribe"])
def test_compiled_reports_never_read_by_the_user_are_heard_at_a_sync_or_the_end(end):
    """A loop that never reads a value on the host: its reports reach the probe at
    ``torch.tpu.synchronize()``, or before the probe leaves (the end of a trace)."""
    torch._dynamo.reset()
    x, idx = _bad_index()
    fn = _compiled_gather()
    probe = Heard()
    probes.subscribe(probe)
    try:
        for _ in range(3):
            fn(x.to(TPU), idx.to(TPU))
        if end == "synchronize":
            torch.tpu.synchronize()
            assert len(probe.infos) == 3
    finally:
        probes.unsubscribe(probe)
        torch._dynamo.reset()
    assert [i.value for i in probe.infos] == [5, 5, 5]


def test_a_checked_graph_keeps_the_static_call(heard, monkeypatch):
    """A graph holding a checked op, called while a probe listens, takes the static call (a
    training step's inputs read without the general walk), its reports still heard."""
    from tpu_debug.runtime import compiled

    torch._dynamo.reset()
    calls = []
    static = compiled.CompiledGraph._call_static

    def counted(self, *args):
        out = static(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(compiled.CompiledGraph, "_call_static", counted)
    x, idx = _bad_index()
    fn = _compiled_gather()
    outs = [fn(x.to(TPU), idx.to(TPU)) for _ in range(3)]
    got = outs[-1].cpu()
    assert got[0, 0] == 0 and torch.equal(got[1], x[1, 1:])  # the indices in range, as CPU reads them
    for out in outs[:-1]:  # the static call computes what the general one did
        torch.testing.assert_close(out.cpu(), got, equal_nan=True)
    assert calls and all(calls)
    assert [i.value for i in heard.infos] == [5, 5, 5]
    torch._dynamo.reset()


def test_a_probe_hears_nothing_of_indices_in_range(heard):
    x = torch.arange(6.0).reshape(2, 3).to(TPU)
    good = torch.tensor([[0, 2], [1, 2]]).to(TPU)
    _gather(x, good)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _gather(x, good).cpu()
    assert heard.infos == []


@pytest.mark.parametrize(("probs", "replacement"), [
    ([0.5, -0.1, 0.6], False),
    ([0.5, float("nan"), 0.5], True),
    ([[1.0, 1.0], [0.0, 0.0]], True),
])
def test_an_invalid_distribution_raises_what_cpu_raises(probs, replacement, heard):
    p = torch.tensor(probs)
    cpu = _cpu_error(torch.multinomial, p, 2, replacement)
    with pytest.raises(RuntimeError, match=re.escape(str(cpu))):
        torch.multinomial(p.to(TPU), 2, replacement)
    (info,) = heard.infos
    assert (info.op, info.argument, info.silent, info.message) == ("multinomial", "self", "sampled", str(cpu))



class Lines(Heard):
    """Also keeps the test's line of each site on_defer announces (as the recorder does)."""

    def on_defer(self, name, index, site):
        super().on_defer(name, index, site)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != __file__:
            frame = frame.f_back
        self.sites[site] = frame.f_lineno if frame is not None else None


def _step(model, opt, x, idx):
    opt.zero_grad()
    loss = torch.gather(model(x), 1, idx).sum()  # the planted index
    loss.backward()
    opt.step()
    return loss


PLANTED = next(i for i, line in enumerate(open(__file__), 1) if "# the planted index" in line)


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_a_planted_index_in_a_training_loop_is_heard_at_its_line(mode):
    """The runtime side of an error finding at the user's line: every step's gather reports
    the offending index, and where its line is (lazy: the check's site; compiled: the node's
    stack trace); the program goes on (the checks do not raise there by default)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, idx = torch.randn(2, 4).to(TPU), torch.tensor([[0, 7], [1, 2]]).to(TPU)
    probe = Lines()
    probes.subscribe(probe)
    try:
        if mode == "lazy":
            with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                for _ in range(2):
                    _step(model, opt, x, idx).item()
        else:
            torch._dynamo.reset()
            step = torch.compile(_step, backend="tpu_debug", dynamic=False)
            for _ in range(2):
                step(model, opt, x, idx).item()
    finally:
        probes.unsubscribe(probe)
        torch._dynamo.reset()
    forward = [i for i in probe.infos if i.op == "gather"]
    assert len(forward) == 2 and {(i.value, i.high, i.mode, i.raised) for i in forward} == {(7, 3, mode, False)}
    if mode == "lazy":
        assert {probe.sites[i.site] for i in forward} == {PLANTED}
    else:
        assert all(f"line {PLANTED}" in i.node.stack_trace for i in forward)
