from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch
from tpu_debug.runtime import probes

import tpu_debug
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError, RunNotFoundError, TraceActiveError


def _step(x, w):
    return torch.relu(x * w + 1.0)


@pytest.mark.quick
def test_trace_records_ops_counts_and_matches_cpu(logdir, cold_cache):
    x_cpu, w_cpu = torch.randn(16, 16), torch.randn(16, 16)
    x, w = x_cpu.to("tpu"), w_cpu.to("tpu")
    with tpu_debug.trace(logdir=logdir, name="loop") as session:
        assert session.live
        for _ in range(7):
            y = _step(x, w)
        live_ops = {o.name: o.count for o in session.ops()}
    assert not session.live
    torch.testing.assert_close(y.cpu(), _step(x_cpu, w_cpu))
    assert live_ops == {"mul.Tensor": 7, "add.Tensor": 7, "relu": 7}
    ops = {o.name: o for o in session.ops()}
    assert {n: (o.count, o.compiles, o.mode) for n, o in ops.items()} == {
        "mul.Tensor": (7, 1, "eager"),
        "add.Tensor": (7, 1, "eager"),
        "relu": (7, 1, "eager"),
    }
    assert all(o.seconds > 0 for o in ops.values())
    assert session.run_dir.parent == logdir
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-loop", session.run_dir.name)
    meta = session.metadata()
    assert meta.status == "finished" and meta.exit_status is None
    assert meta.platform == "cpu" and meta.device_count >= 1
    assert meta.torch_version == torch.__version__ and meta.tpu_debug_version == tpu_debug.__version__
    # (other options, e.g. tensorboard, are recorded too; their own tests check them)
    assert {k: meta.options[k] for k in ("logdir", "name", "hlo", "op_events")} == {
        "logdir": str(logdir), "name": "loop", "hlo": True, "op_events": False
    }
    # no optimizer, no step marks: the loop's seven iterations are the steps
    assert session.counts() == {"compile": 3, "step": 7}
    assert [(s.index, s.detected, s.eager_ops) for s in session.steps()] == [(i, "loop", 3) for i in range(7)]
    assert session.modes() == ["eager"]


@pytest.mark.quick
def test_transfers_are_recorded_with_their_line(logdir):
    host = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with tpu_debug.trace(logdir=logdir) as session:
        dev = host.to("tpu")
        total = (dev * 2).sum().item()
    assert total == (host * 2).sum().item()
    h2d = session.transfers(direction="h2d")
    d2h = session.transfers(direction="d2h")
    assert [(t.op, t.nbytes, t.shape, t.dtype, t.implicit) for t in h2d] == [
        ("to", 24, (2, 3), "float32", False)  # op: what the user did (tracers/reading/transfer_causes.py)
    ]
    assert [(t.op, t.nbytes, t.shape, t.implicit) for t in d2h] == [("item", 4, (), True)]
    assert d2h[0].location.file == __file__
    assert d2h[0].location.line == h2d[0].location.line + 1


def test_op_events_when_asked(logdir):
    x = torch.ones(4).to("tpu")
    with tpu_debug.trace(logdir=logdir, op_events=True) as session:
        for _ in range(5):
            x = x + 1.0
    assert x.cpu().tolist() == [6.0] * 4
    events = session.events("op")
    assert [e.name for e in events] == ["add.Tensor"] * 5
    assert all(e.location.file == __file__ for e in events)
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert session.ops()[0].count == 5


def test_no_per_execution_events_by_default(logdir):
    x = torch.ones(4).to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        x = x + 1.0
    assert session.events("op") == []
    assert session.ops()[0].count == 1


def test_one_trace_at_a_time(logdir):
    with tpu_debug.trace(logdir=logdir):
        line = test_one_trace_at_a_time.__code__.co_firstlineno + 1
        with pytest.raises(
            TraceActiveError,
            match=re.escape(
                f"a trace is already recording (started at {__file__}:{line} in test_one_trace_at_a_time); "
                "tpu_debug records one trace at a time. End it before starting another."
            ),
        ):
            with tpu_debug.trace(logdir=logdir):
                pass
    with tpu_debug.trace(logdir=logdir):  # the first one ended: a new one may start
        pass


def test_flushed_and_released_when_the_block_raises(logdir):
    x = torch.ones(2).to("tpu")
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        with tpu_debug.trace(logdir=logdir) as session:
            x = x * 5.0
            _ = 1 / 0
    meta = session.metadata()
    assert (meta.status, meta.error) == ("failed", "ZeroDivisionError: division by zero")
    assert session.ops()[0].count == 1
    assert not probes.active()
    with tpu_debug.trace(logdir=logdir):
        pass


def test_keyboard_interrupt_is_recorded_as_interrupted(logdir):
    with pytest.raises(KeyboardInterrupt, match=r"^$"):
        with tpu_debug.trace(logdir=logdir) as session:
            raise KeyboardInterrupt
    assert session.metadata().status == "interrupted"


def test_as_a_decorator_each_call_is_a_run(logdir):
    @tpu_debug.trace(logdir=logdir, name="step")
    def step(x):
        return x * 2.0

    x = torch.ones(3).to("tpu")
    step(x)
    out = step(x)
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]
    runs = tpu_debug.list_runs(logdir)
    assert len(runs) == 2 and all(r.name.endswith("-step") or r.name.endswith("-step-2") for r in runs)
    for run in runs:
        with tpu_debug.open_run(run) as session:
            assert session.ops()[0].count == 1


def test_options_are_keyword_only():
    with pytest.raises(TypeError, match="positional argument"):
        tpu_debug.trace("somewhere")  # type: ignore[misc]


def test_environment_sets_options(monkeypatch, tmp_path):
    monkeypatch.delenv("TPU_DEBUG_COMPILE_CACHE")  # the suite's setting (conftest): only these variables here
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", str(tmp_path / "env_runs"))
    monkeypatch.setenv("TPU_DEBUG_HLO", "off")
    monkeypatch.setenv("TPU_DEBUG_OP_EVENTS", "yes")
    monkeypatch.setenv("TPU_DEBUG_NAME", "from-env")
    cfg = TraceConfig.from_env()
    assert cfg == TraceConfig(logdir=Path(tmp_path / "env_runs"), name="from-env", hlo=False, op_events=True)
    # an argument beats the environment
    assert tpu_debug.trace(hlo=True).config.hlo is True
    with tpu_debug.trace() as session:
        pass
    assert session.run_dir.parent == tmp_path / "env_runs"
    assert session.run_dir.name.endswith("-from-env")
    assert tpu_debug.open_run().run_dir == session.run_dir  # the latest run, from TPU_DEBUG_LOGDIR


@pytest.mark.parametrize(
    "var, value, message",
    [
        (
            "TPU_DEBUG_HLO",
            "maybe",
            "TPU_DEBUG_HLO='maybe' is not a boolean; use one of 1/0, true/false, yes/no, on/off",
        ),
        (
            "TPU_DEBUG_OP_EVENTS",
            "2",
            "TPU_DEBUG_OP_EVENTS='2' is not a boolean; use one of 1/0, true/false, yes/no, on/off",
        ),
        (
            "TPU_DEBUG_LOGDIR",
            " ",
            "TPU_DEBUG_LOGDIR is set but empty; set it to a directory for runs, or unset it",
        ),
        ("TPU_DEBUG_NAME", "", "TPU_DEBUG_NAME is set but empty; set it to a short run name, or unset it"),
    ],
)
def test_bad_environment_values(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        tpu_debug.trace()


def test_bad_argument_values():
    with pytest.raises(ConfigError, match=re.escape("hlo='yes': expected True or False")):
        tpu_debug.trace(hlo="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("name='': expected a non-empty string")):
        tpu_debug.trace(name="")


def test_unwritable_logdir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    # probes other tests of this process left on purpose (TorchTPU's compile-debug collector
    # listens for the life of the process) stay; the failed trace adds none
    before = probes.active()
    with pytest.raises(
        tpu_debug.TpuDebugError, match=re.escape(f"cannot create a run directory under {blocker / 'runs'}: ")
    ):
        with tpu_debug.trace(logdir=blocker / "runs"):
            pass
    assert probes.active() == before


def test_open_run_errors(tmp_path):
    with pytest.raises(
        RunNotFoundError,
        match=re.escape(
            f"no runs in {tmp_path}: record one with 'tpu-debug run script.py', or point "
            "--logdir / TPU_DEBUG_LOGDIR at the directory holding your runs."
        ),
    ):
        tpu_debug.open_run(logdir=tmp_path)
    with pytest.raises(
        RunNotFoundError,
        match=re.escape(
            f"{tmp_path}: not a run directory (no run.db inside). List recorded runs with 'tpu-debug runs'."
        ),
    ):
        tpu_debug.open_run(tmp_path)
    with pytest.raises(
        RunNotFoundError,
        match=re.escape(
            f"train: no such run (not a path, nor a run name in {tmp_path}). "
            "List recorded runs with 'tpu-debug runs'."
        ),
    ):
        tpu_debug.open_run("train", logdir=tmp_path)


def test_open_run_by_name_picks_the_latest(logdir):
    with tpu_debug.trace(logdir=logdir, name="train"):
        pass
    with tpu_debug.trace(logdir=logdir, name="train") as second:
        pass
    with tpu_debug.trace(logdir=logdir, name="eval"):
        pass
    assert tpu_debug.open_run("train", logdir=logdir).run_dir == second.run_dir
    assert tpu_debug.open_run(second.run_dir.name, logdir=logdir).run_dir == second.run_dir
    assert tpu_debug.open_run(second.db_path).run_dir == second.run_dir


def test_tracer_errors_are_recorded_not_raised(logdir):
    x = torch.ones(2).to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        probes.transferred(object())  # a malformed report: the recorder fails on it
        y = x + 1.0
    assert y.cpu().tolist() == [2.0, 2.0]
    # every probe that read the report failed on it, and said so; none broke the program
    errors = {e.where: e.message for e in session.internal_errors()}
    assert set(errors) == {"Recorder.on_transfer", "StepTracker.on_transfer"}
    assert all(message.startswith("AttributeError: ") for message in errors.values())
    assert "Tracer errors" in session.summary()


def test_events_from_other_threads(logdir):
    x = torch.ones(2).to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        t = threading.Thread(target=lambda: x.cpu())
        t.start()
        t.join()
        x.cpu()
    threads = {e.thread for e in session.transfers()}
    assert len(threads) == 2 and threading.get_native_id() in threads


def test_summary_sections(logdir):
    x = torch.ones(8).to("tpu")
    with tpu_debug.trace(logdir=logdir, name="rep") as session:
        for _ in range(3):
            x = x * 1.5
        x.sum().item()
    text = session.summary()
    for heading in (
        "tpu_debug report: rep",
        "Run",
        "Top ops by time",
        "Programs compiled",
        "Heaviest programs",
        "Recompiles",
        "Transfers",
        "Divergence",
    ):
        assert heading in text.splitlines(), heading
    assert "\x1b[" not in text  # plain text
    assert "XLA CPU" in text and "mode      eager" in text
    row = next(line for line in text.splitlines() if "mul.Tensor" in line and "eager" in line)
    assert re.search(r"\|\s*3\s*\|", row)


def test_ctrl_c_during_the_final_flush_is_held_until_the_run_is_closed():
    import signal

    from tpu_debug.trace_signals import HeldSignals as _HeldSignals

    reached_end = False
    # Python's own Ctrl-C handler, whatever this process inherited (a job started in the
    # background of a non-interactive shell has SIGINT ignored, which hold() leaves alone)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        held = _HeldSignals().hold()
        with pytest.raises(KeyboardInterrupt, match=r"^$"):
            try:
                signal.raise_signal(signal.SIGINT)
                reached_end = True
            finally:
                held.release()
        assert reached_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_ctrl_c_traceback_ends_in_raise_interrupt(logdir):
    # the trace's SIGINT handler is Python code; Python's own is C and adds no frame: the
    # traceback a user sees ends at the line Ctrl-C interrupted, as it does without a trace
    import signal
    import traceback

    def users_loop():
        signal.raise_signal(signal.SIGINT)
        return "not interrupted"

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt, match=r"^$") as caught, tpu_debug.trace(logdir=logdir):
            users_loop()
    finally:
        signal.signal(signal.SIGINT, inherited)
    last = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert (Path(last.filename).name, last.name) == ("test_trace.py", "users_loop")
