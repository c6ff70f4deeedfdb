from __future__ import annotations

import importlib.util
import textwrap

import pytest
from synthetic_run import write_synthetic_run
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter
from tpu_debug.tui import TpuDebugApp

import tpu_debug

RUN_DIR_NAME = "20260131T120000.000Z-synthetic"


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory):
    """The deterministic synthetic run (read-only: tests share it)."""
    run_dir = tmp_path_factory.mktemp("tui") / RUN_DIR_NAME
    write_synthetic_run(run_dir)
    return run_dir


@pytest.fixture
def make_app(synthetic_run):
    """``make_app(run_dir=None, **options)``: a TpuDebugApp on a run (default: the synthetic one)."""
    sessions = []

    def make(run_dir=None, **options):
        session = tpu_debug.open_run(run_dir or synthetic_run)
        sessions.append(session)
        return TpuDebugApp(session, **options)

    yield make
    for session in sessions:
        session.close()


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory):
    """A real run recorded with tpu_debug.trace(): an eager loop whose input length changes
    (so its ops recompile), .item() syncs, and a compiled graph called at every step."""
    import torch

    logdir = tmp_path_factory.mktemp("recorded")
    script = logdir / "loop.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch


            def loss_of(x, w):
                y = x * w + 1.0
                return (y * y).mean()


            def loop(lengths, graph):
                total = 0.0
                for n in lengths:
                    x = torch.ones(n, 8, device="tpu")
                    w = torch.full((n, 8), 0.5, device="tpu")
                    total += loss_of(x, w).item()
                    total += graph(x, w).item()
                return total
            """
        )
    )
    from tpu_debug.runtime import clear_cache

    clear_cache()  # compiles of earlier tests in this process would be cache hits here
    spec = importlib.util.spec_from_file_location("recorded_loop", script)
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    graph = torch.compile(loop.loss_of, backend="tpu_debug", dynamic=False)
    with tpu_debug.trace(logdir=logdir, name="recorded") as session:
        loop.loop((4, 5, 6, 6), graph)
    return session.run_dir


@pytest.fixture(scope="session")
def fallback_run(tmp_path_factory):
    """A real run with an op that has no lowering, run by CPU fallback
    (``runtime.config.cpu_fallback``), beside ops the device runs (mul, add)."""
    import torch
    from tpu_debug.runtime import config as runtime_config

    lib = torch.library.Library("tpu_debug_tui_test", "DEF")
    saved = runtime_config.cpu_fallback
    try:
        lib.define("squash(Tensor x) -> Tensor")
        lib.impl("squash", lambda x: x / (1 + x.abs()), "CPU")
        runtime_config.cpu_fallback = True
        with tpu_debug.trace(logdir=tmp_path_factory.mktemp("fallback"), name="fallback") as session:
            x = torch.linspace(-2, 2, 8, device="tpu")
            for _ in range(3):
                x = torch.ops.tpu_debug_tui_test.squash(x * 2 + 1)
    finally:
        runtime_config.cpu_fallback = saved
        lib._destroy()
    return session.run_dir


@pytest.fixture(scope="session")
def storm_run(tmp_path_factory):
    """One op compiled 450 times (more than two pages of compile history)."""
    run_dir = tmp_path_factory.mktemp("storm") / "20260131T120000.000Z-storm"
    run_dir.mkdir()
    writer = RunWriter(run_dir / DB_NAME, {"name": "storm", "platform": "cpu"})
    loc = ev.SourceLocation("/nowhere/storm.py", 3, "step")
    previous = None
    for n in range(1, 451):
        eid = writer.new_id()
        diffs = (ev.KeyDiff("shape", f"float32[{n - 1}]", f"float32[{n}]", arg_index=0, dims=(0,)),) if previous else ()
        writer.put(
            ev.CompileEvent(
                eid,
                n * 0.01,
                "eager",
                1,
                loc,
                "mul.Tensor",
                f"mul.Tensor(float32[{n}])",
                (ev.ArgInfo("self", (n,), "float32"),),
                0.01,
                None,
                previous,
                diffs,
            )
        )
        previous = eid
    writer.close({"status": "finished", "exit_status": 0, "duration": 5.0})
    return run_dir
