"""The probe interface (runtime/probes.py): what a probe hears, and that a probe can never
break the program it watches. Every device result is checked against PyTorch on CPU."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from tpu_debug.runtime import clear_cache, probes
from tpu_debug.core.records import CompileInfo, TransferInfo
from tpu_debug.runtime.probes import Probe

from tpu_debug.core.hooks import DEFAULT_LIMIT, ErrorLog


@pytest.fixture(autouse=True)
def fresh_errors(monkeypatch):
    """A probe error log of this test's own (the module's is process-wide)."""
    log = ErrorLog()
    monkeypatch.setattr(probes, "probe_errors", log)
    assert not probes.active(), "a probe leaked from another test"
    return log


class Recording:
    """Records every notification it hears as (method, first argument)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, object]] = []

    def on_compile(self, info):
        self.heard.append(("on_compile", info))

    def on_execute(self, mode, name, key, seconds):
        self.heard.append(("on_execute", name))

    def on_execute_begin(self, mode, name, key):
        self.heard.append(("on_execute_begin", name))

    def on_compile_begin(self, mode, name):
        self.heard.append(("on_compile_begin", name))

    def on_transfer_begin(self, direction, op):
        self.heard.append(("on_transfer_begin", direction))

    def on_transfer(self, info):
        self.heard.append(("on_transfer", info.direction))

    def on_evict(self, mode, name, key):
        self.heard.append(("on_evict", (mode, name, key)))

    def methods(self) -> list[str]:
        return [m for m, _ in self.heard]


class subscribed:
    def __init__(self, *ps, replay=False):
        self.ps, self.replay = ps, replay

    def __enter__(self):
        for p in self.ps:
            probes.subscribe(p, replay=self.replay)
        return self.ps[0]

    def __exit__(self, *exc):
        for p in self.ps:
            probes.unsubscribe(p)


def test_a_probe_hears_each_activity_once_with_typed_reports():
    clear_cache()  # the add below compiles here
    x_cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with subscribed(Recording()) as p:
        y = (x_cpu.to("tpu") + 2.0).cpu()
    torch.testing.assert_close(y, x_cpu + 2.0)
    assert p.methods() == [
        "on_transfer_begin", "on_transfer",  # .to("tpu")
        "on_compile_begin", "on_compile",  # the add's executable
        "on_execute_begin", "on_execute",
        "on_transfer_begin", "on_transfer",  # .cpu()
    ]
    info = p.heard[3][1]
    assert isinstance(info, CompileInfo) and info.name == "add.Tensor" and not info.replayed
    assert info.graph is None and [a.shape for a in info.args if a.shape is not None] == [(2, 3)]
    assert [d for m, d in p.heard if m == "on_transfer"] == ["h2d", "d2h"]


def test_evicted_reaches_on_evict():
    with subscribed(Recording()) as p:
        probes.evicted("eager", "add.Tensor", ("key",))
    assert p.heard == [("on_evict", ("eager", "add.Tensor", ("key",)))]


class Raising:
    """A tracer with a bug: every execution report raises."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, str]] = []
        self.payloads: list[weakref.ref] = []

    def on_execute(self, mode, name, key, seconds):
        payload = torch.ones(256)  # held by this frame, i.e. by the exception's traceback
        self.payloads.append(weakref.ref(payload))
        raise ValueError(f"bad report for {name}")

    def on_internal_error(self, method, exc):
        self.handled.append((method, str(exc)))


def test_a_raising_probe_does_not_stop_the_op(fresh_errors):
    bad, good = Raising(), Recording()
    x_cpu = torch.randn(4, 4)
    x = x_cpu.to("tpu")
    with subscribed(bad, good):
        y = torch.relu(x)
    torch.testing.assert_close(y.cpu(), torch.relu(x_cpu))
    assert "on_execute" in good.methods()  # the probe after the raising one is still called
    assert bad.handled == [("on_execute", "bad report for relu")]
    (error,) = fresh_errors
    assert (error.where, error.type, error.message) == ("Raising.on_execute", "ValueError", "bad report for relu")
    assert error.raised_at.startswith("test_probes.py:") and error.raised_at.endswith(" in on_execute")
    assert fresh_errors.count == 1


def test_an_error_in_on_internal_error_is_recorded_too(fresh_errors):
    class Worse(Raising):
        def on_internal_error(self, method, exc):
            raise RuntimeError("cannot even report")

    x = torch.ones(3).to("tpu")
    with subscribed(Worse()):
        y = x * 3
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]
    assert [e.where for e in fresh_errors] == ["Worse.on_execute", "Worse.on_internal_error"]


def test_a_probe_raising_on_every_event_keeps_a_bounded_log(fresh_errors):
    """10k ops with a probe that raises on each: the program finishes with the CPU result,
    the log keeps the first DEFAULT_LIMIT errors and counts them all, and no traceback
    (with the frame's tensor) is kept alive."""
    n = 100 * DEFAULT_LIMIT  # a hundred times the log's bound: an unbounded log would hold them all
    bad = Raising()
    x = torch.zeros(2).to("tpu")
    with torch.no_grad(), subscribed(bad):
        for _ in range(n):
            x = x + 1.0
    # integers below 2**24 are exact in float32: the sum is exactly n on both devices
    assert x.cpu().tolist() == (torch.zeros(2) + float(n)).tolist()
    assert fresh_errors.count == n and len(bad.handled) == n
    assert len(fresh_errors) == DEFAULT_LIMIT
    assert {e.where for e in fresh_errors} == {"Raising.on_execute"}
    gc.collect()
    assert sum(ref() is not None for ref in bad.payloads) == 0


def test_an_error_that_stops_the_program_passes_through():
    class Forbidden(RuntimeError):
        stops_program = True  # what a guard raises on purpose (tpu_debug.core.errors.RecompileError)

    class Guard:
        def on_transfer(self, info):
            raise Forbidden("no transfers here")

    with subscribed(Guard()), pytest.raises(Forbidden, match="no transfers here"):
        torch.ones(2).to("tpu")


def test_quiet_work_is_neither_reported_nor_observed():
    heard, observed = Recording(), []

    class Observer:
        def on_op(self, op, args, kwargs, outputs):
            observed.append(str(op))

    x_cpu = torch.randn(3)
    with subscribed(heard, Observer()):
        with probes.quiet():
            with probes.quiet():  # nested: the outer block stays quiet after the inner one
                a = x_cpu.to("tpu")
            b = (a * 2).cpu()
        assert heard.heard == [] and observed == []
        c = (a * 2).cpu()
    torch.testing.assert_close(b, x_cpu * 2)
    torch.testing.assert_close(c, x_cpu * 2)
    assert "on_execute" in heard.methods() and "on_transfer" in heard.methods()
    assert "aten.mul.Tensor" in observed


def test_a_probes_own_device_work_is_quiet():
    """While a probe handles an observed op its thread is quiet: the copy it makes is not
    reported to the other probes, and not observed again."""
    heard, seen = Recording(), []

    class CopiesOutputs:
        def on_op(self, op, args, kwargs, outputs):
            seen.append((str(op), outputs.cpu()))

    x_cpu = torch.randn(5)
    x = x_cpu.to("tpu")
    with subscribed(heard, CopiesOutputs()):
        y = torch.exp(x)
    assert [op for op, _ in seen] == ["aten.exp.default"]
    torch.testing.assert_close(seen[0][1], torch.exp(x_cpu))
    torch.testing.assert_close(y.cpu(), torch.exp(x_cpu))
    assert "on_transfer" not in heard.methods()


def test_replay_tells_a_late_probe_what_was_compiled():
    x = torch.randn(7, 5).to("tpu")
    torch.sigmoid(x)  # compiled before anyone listens
    late, plain = Recording(), Recording()
    with subscribed(late, replay=True):
        pass
    with subscribed(plain):
        pass
    replayed = [info for m, info in late.heard if m == "on_compile"]
    assert all(info.replayed for info in replayed)
    assert any(info.name == "sigmoid" and info.args[0].shape == (7, 5) for info in replayed)
    assert plain.heard == []


def test_replay_errors_are_isolated(fresh_errors):
    torch.tanh(torch.randn(3).to("tpu"))

    class BadReplay:
        def on_compile(self, info):
            raise KeyError(info.name)

    with subscribed(BadReplay(), replay=True):
        y = torch.tanh(torch.zeros(3).to("tpu"))
    assert y.cpu().tolist() == [0.0, 0.0, 0.0]
    assert fresh_errors.count >= 1 and {e.where for e in fresh_errors} == {"BadReplay.on_compile"}


def test_subscribe_and_unsubscribe_are_idempotent():
    p = Recording()
    probes.subscribe(p)
    probes.subscribe(p)
    try:
        assert probes.active() == (p,)
        probes.transferred(TransferInfo("d2h", 4, (), "float32", "item", 0.0))
    finally:
        probes.unsubscribe(p)
        probes.unsubscribe(p)
    probes.unsubscribe(Recording())  # never subscribed: nothing to do
    assert probes.active() == ()
    probes.transferred(TransferInfo("d2h", 4, (), "float32", "item", 0.0))
    assert p.methods() == ["on_transfer"]


def test_protocol_stubs_are_not_subscriptions():
    """A probe subclassing Probe hears only the methods it overrides; one without
    on_op/on_graph does not turn op observation on."""

    class OnlyCompiles(Probe):
        def on_compile(self, info):
            pass

    p = OnlyCompiles()
    with subscribed(p):
        assert probes._op_probes == ()
        assert [r[0] for r in probes._routes.on_compile] == [p]
        assert probes._routes.on_execute == () and probes._routes.on_op == ()


_NOTIFICATIONS = ("compiling", "compiled", "executing", "executed", "transferring", "transferred", "fell_back")


def test_no_probe_no_notification(monkeypatch):
    """The fast path: with nothing subscribed the runtime calls no notification at all."""
    calls = []
    for name in _NOTIFICATIONS:
        monkeypatch.setattr(probes, name, lambda *a, _name=name: calls.append(_name))

    def work():
        x = torch.randn(3, 2)
        y = (x.to("tpu") @ torch.ones(2, 9).to("tpu")).cpu()  # a fresh shape: compiles too
        torch.testing.assert_close(y, x @ torch.ones(2, 9))

    clear_cache()
    work()
    assert calls == []
    # the same work with a probe subscribed does report (so the check above can fail)
    clear_cache()
    with subscribed(Recording()):
        work()
    assert {"compiling", "compiled", "executing", "executed", "transferring", "transferred"} <= set(calls)


def test_probes_fire_on_the_thread_that_does_the_work():
    threads = []

    class Where:
        def on_transfer(self, info):
            threads.append(threading.get_ident())

    x = torch.ones(2).to("tpu")
    with subscribed(Where()):
        worker = threading.Thread(target=x.cpu)
        worker.start()
        worker.join()
    assert threads == [worker.ident]


def test_error_log_is_bounded_and_thread_safe():
    log = ErrorLog(limit=5)

    def fail(i):
        try:
            raise OSError(f"disk {i}")
        except OSError as exc:
            log.record("T.on_transfer", exc)

    workers = [threading.Thread(target=lambda: [fail(i) for i in range(2000)]) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert log.count == 8000 and len(log) == 5
    assert all(e.type == "OSError" and e.message.startswith("disk ") for e in log)
    assert str(log[0]).startswith("T.on_transfer: OSError: disk ")
