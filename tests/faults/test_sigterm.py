"""SIGTERM inside ``trace()``: it ends the run like Ctrl-C, unless the program handles SIGTERM itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import tpu_debug
from tpu_debug.trace_signals import Terminated, _raise_terminated

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM handlers are POSIX")


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default for the test, whatever the test runner set; put back after."""
    saved = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, saved)


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "runs"


@pytest.mark.quick
def test_sigterm_ends_the_run_as_terminated(logdir, default_sigterm):
    x = torch.ones(4).to("tpu")
    steps = 0
    with pytest.raises(Terminated, match=r"^143$") as info, tpu_debug.trace(logdir=logdir) as session:
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
        for steps in range(1, 1000):
            x = x * 1.0
            x.sum().item()
            if steps == 3:
                signal.raise_signal(signal.SIGTERM)
    assert info.value.code == 143  # uncaught, Python exits with it: 128 + SIGTERM
    assert steps == 3
    meta = session.metadata()
    assert (meta.status, meta.exit_status, meta.error) == ("terminated", 143, "SIGTERM")
    assert len(session.transfers(op="item")) == 3  # nothing recorded before the signal is lost
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the default is back


def test_a_programs_own_sigterm_handler_is_left_alone(logdir, default_sigterm):
    calls = []

    def mine(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGTERM, mine)
    with tpu_debug.trace(logdir=logdir) as session:
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.raise_signal(signal.SIGTERM)
        torch.ones(2).to("tpu").cpu()
    assert calls == [signal.SIGTERM]
    assert session.metadata().status == "finished"
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_handler_set_during_the_run_stays(logdir, default_sigterm):
    def mine(signum, frame):
        pass

    with tpu_debug.trace(logdir=logdir):
        signal.signal(signal.SIGTERM, mine)
    assert signal.getsignal(signal.SIGTERM) is mine


def test_sigterm_while_the_run_is_set_up_is_held_until_it_is_started(logdir, default_sigterm, monkeypatch):
    from tpu_debug import tracing

    start_all = tracing.Trace._start_all

    def signalled_half_way(self, origin):
        signal.raise_signal(signal.SIGTERM)  # arrives with the run half made
        start_all(self, origin)

    monkeypatch.setattr(tracing.Trace, "_start_all", signalled_half_way)
    with pytest.raises(Terminated, match=r"^143$"), tpu_debug.trace(logdir=logdir):
        pytest.fail("the block ran although SIGTERM came first")
    (run,) = tpu_debug.list_runs(logdir)
    session = tpu_debug.open_run(run)
    assert session.metadata().status == "terminated"
    session.close()
    assert tracing.active_trace() is None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_gets_the_default_handlers(tmp_path):
    script = tmp_path / "forks.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal
            import tpu_debug

            with tpu_debug.trace(logdir="runs"):
                assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
                pid = os.fork()
                if pid == 0:  # the child: Python's own handlers, as without tpu_debug
                    ok = (signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
                          and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
                    os._exit(0 if ok else 3)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0, status
                assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the parent keeps its own
            print("ok")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") or k == "TPU_DEBUG_COMPILE_CACHE"}
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_sigterm_dropped_in_a_weakref_callback_still_ends_the_run(logdir, default_sigterm):
    import time
    import weakref

    class Payload:
        pass

    def freed(ref):
        # the handler runs here, and Python drops what a weakref callback raises
        signal.raise_signal(signal.SIGTERM)

    steps = 0
    hook = sys.unraisablehook
    with pytest.raises(Terminated, match=r"^143$"), tpu_debug.trace(logdir=logdir) as session:
        payload = Payload()
        ref = weakref.ref(payload, freed)
        del payload
        assert ref() is None
        for steps in range(1, 3001):  # the signal, sent again, ends this loop
            time.sleep(0.01)
    assert steps < 3000
    assert session.metadata().status == "terminated"
    assert sys.unraisablehook is hook  # put back
