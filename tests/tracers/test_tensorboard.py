"""TensorBoard export: our events on the JAX profile timeline, read back by xprof."""

from __future__ import annotations

import gzip
import json
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from tpu_debug.runtime import clear_cache
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import CompileInfo
from tpu_debug.tracers.events import CompileEvent, DivergenceEvent, KeyDiff, SourceLocation
from tpu_debug.tracers.recording.tensorboard_exporter import SCALAR_TAGS, TensorBoardExporter
from tpu_debug.tracers.xplane import profile_files

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError

THIS_FILE = Path(__file__).name


def _trace_events(tb_dir: Path) -> list[dict]:
    """The complete ("X") events of the profile in ``tb_dir``, through xprof's own conversion."""
    from xprof.convert import raw_to_tool_data

    files = profile_files(tb_dir)
    assert len(files) == 1, files
    data, content_type = raw_to_tool_data.xspace_to_tool_data([str(files[0])], "trace_viewer", {})
    assert content_type == "application/json"
    return [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"]


def _named(events: list[dict], name: str) -> list[dict]:
    return sorted((e for e in events if e["name"] == name), key=lambda e: e["ts"])


def _train(batches: list[int]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in batches:
        x = torch.randn(n, 8).to("tpu")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One run with tensorboard=True: three optimizer steps, the batch grows in the third."""
    logdir = tmp_path_factory.mktemp("tb") / "runs"
    clear_cache()  # the ops compile inside the run, whatever ran before
    with tpu_debug.trace(logdir=logdir, name="tb", tensorboard=True) as session:
        _train([2, 2, 3])
    return session


def test_trace_viewer_shows_ops_compiles_transfers_and_steps(recorded):
    events = _trace_events(recorded.run_dir / "tensorboard")

    addmm = _named(events, "aten::addmm")
    assert [e["args"]["inputs"] for e in addmm] == [
        "(float32[4], float32[2,8], float32[8,4])",
        "(float32[4], float32[2,8], float32[8,4])",
        "(float32[4], float32[3,8], float32[8,4])",
    ]
    assert all(e["dur"] > 0 for e in addmm)

    (compile_,) = _named(events, "compile aten::addmm")
    args = compile_["args"]
    assert args["signature"] == "addmm(float32[4], float32[2,8], float32[8,4])"
    assert float(args["seconds"]) > 0 and args["line"].startswith(str(Path(__file__)))
    (recompile,) = _named(events, "recompile aten::addmm")
    assert recompile["args"]["signature"] == "addmm(float32[4], float32[3,8], float32[8,4])"
    # the reason is the recorded compile's key diffs (what the recompile tracer recorded)
    (stored,) = [c for c in recorded.compiles(name="addmm") if c.diffs]
    assert recompile["args"]["recompile"] == "; ".join(d.render() for d in stored.diffs)
    assert "f32[2,8] -> f32[3,8]" in recompile["args"]["recompile"]
    # the span covers the compile itself: its op runs after it ends
    assert compile_["ts"] + compile_["dur"] <= addmm[0]["ts"]

    h2d = _named(events, "transfer h2d")
    assert [(e["args"]["bytes"], e["args"]["shape"]) for e in h2d] == [
        ("128", "float32[4,8]"),  # model.to("tpu")
        ("16", "float32[4]"),
        ("64", "float32[2,8]"),
        ("64", "float32[2,8]"),
        ("96", "float32[3,8]"),
    ]
    d2h = _named(events, "transfer d2h")
    assert [(e["args"]["bytes"], e["args"]["op"], e["args"]["implicit"]) for e in d2h] == [
        ("4", "item", "1")
    ] * 3
    # cause and line are the recorded transfer's, as the run store has them
    for direction, spans in (("h2d", h2d), ("d2h", d2h)):
        recorded_ = recorded.transfers(direction=direction)
        assert [(e["args"]["op"], e["args"]["implicit"], e["args"]["line"]) for e in spans] == [
            (t.op, str(int(t.implicit)), str(t.location)) for t in recorded_
        ]
    assert all(THIS_FILE in e["args"]["line"] for e in h2d + d2h)

    steps = sorted((e for e in events if e["name"].startswith("step ")), key=lambda e: e["ts"])
    assert [(e["name"], e["args"]["step_num"]) for e in steps] == [
        ("step 0", "0"),
        ("step 1", "1"),
        ("step 2", "2"),
    ]
    # xprof groups what ran in a step with it
    assert addmm[1]["args"]["group_id"] == steps[1]["args"]["group_id"]


def test_scalars_per_step(recorded):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(recorded.run_dir / "tensorboard"))
    acc.Reload()
    scalars = {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    # divergence was not checked, and no program ran over several devices
    assert set(scalars) == set(SCALAR_TAGS) - {"tpu_debug/max_divergence", "tpu_debug/collective_bytes"}
    assert [step for step, _ in scalars["tpu_debug/eager_ops"]] == [0, 1, 2]
    ops = dict(scalars["tpu_debug/eager_ops"])
    assert ops[0] == ops[1] == ops[2] > 0
    compiles = dict(scalars["tpu_debug/compiles"])
    assert compiles[0] > 0 and compiles[1] == 0 and compiles[2] > 0  # the new batch size recompiles
    assert dict(scalars["tpu_debug/recompiles"])[2] == compiles[2]
    assert dict(scalars["tpu_debug/compile_seconds"])[1] == 0
    # step 0: the model and the first batch in (the .item() of step 0 comes after its
    # optimizer step, so it counts in step 1)
    assert dict(scalars["tpu_debug/transfer_bytes"]) == {0: 128.0 + 16 + 64, 1: 4.0 + 64, 2: 4.0 + 96}
    # one step record: the scalars are the recorded steps' counts, at their indexes
    assert [(s.index, s.eager_ops, s.compiles, s.recompiles) for s in recorded.steps()] == [
        (n, ops[n], compiles[n], dict(scalars["tpu_debug/recompiles"])[n]) for n in (0, 1, 2)
    ]


def test_run_metadata_and_report_describe_the_capture(recorded):
    tb = recorded.tensorboard_summary()
    assert tb.status == "finished" and not tb.capped and tb.dropped_spans == 0
    assert tb.steps == 3 and tb.spans > 30 and tb.max_events == 100_000
    assert tb.profile == (str(profile_files(recorded.run_dir / "tensorboard")[0].relative_to(tb.dir)),)
    assert recorded.metadata().options["tensorboard"] is True
    report = recorded.summary()
    assert "TensorBoard" in report and f"tpu-debug tensorboard {recorded.run_dir.name}" in report
    assert "CAPPED" not in report


def test_capture_is_bounded_and_says_so(logdir):
    with tpu_debug.trace(logdir=logdir, tensorboard=True, tensorboard_max_events=12) as session:
        _train([2, 2])
    tb = session.tensorboard_summary()
    assert tb.status == "capped" and tb.capped and tb.spans == 12 and tb.dropped_spans > 0
    assert "capture stopped after 12 spans" in tb.notes[0]
    events = _trace_events(session.run_dir / "tensorboard")  # written at the cap, still readable
    # the compile phases plane, drawn when the capture ends, names each compile before the cap
    # "aten::<op> (compiled)": not one of the capture's spans
    ours = [e for e in events if e["name"].startswith(("aten::", "compile ", "recompile ", "transfer "))
            and not e["name"].endswith((" (compiled)", " (read back)"))]
    assert len(ours) == 12
    assert "CAPPED after" in session.summary()
    # the scalars still cover the whole run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(session.run_dir / "tensorboard"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("tpu_debug/eager_ops")] == [0, 1]


def test_explicit_step_marks_replace_the_optimizer_hook(logdir):
    tpu_debug.step()  # no trace: nothing to mark, no error
    with tpu_debug.trace(logdir=logdir, tensorboard=True) as session:
        x = torch.ones(4, device="tpu")
        for _ in range(2):
            x = x * 2
            tpu_debug.step()
        _train([2])  # its optimizer.step() no longer ends a step
    assert session.tensorboard_summary().steps == 2
    steps = [
        e["name"] for e in _trace_events(session.run_dir / "tensorboard") if e["name"].startswith("step")
    ]
    assert sorted(steps) == ["step 0", "step 1", "step 2"]  # the part after the last mark ran ops


def test_recompile_reason_and_divergence_from_recorded_events(tmp_path):
    """What other tracers record (key diffs, divergences) lands on the timeline."""
    errors: list = []
    exporter = TensorBoardExporter(tmp_path, record_error=lambda where, msg: errors.append((where, msg)))
    exporter.start()
    loc = SourceLocation("/work/model.py", 12, "forward")
    key = ("add.Tensor", "f32[9]")
    info = CompileInfo(
        "eager", "add.Tensor", key, (ArgSpec("self", (9,), "float32"), ArgSpec("alpha", static=1)), 0.01
    )
    exporter.on_compile(CompileInfo("eager", "add.Tensor", ("add.Tensor", "f32[8]"), info.args, 0.01))
    exporter.on_compile_begin("eager", "add.Tensor")
    diffs = (
        KeyDiff("shape", "f32[8]", "f32[9]", arg_index=0, dims=(0,)),
        KeyDiff("guard", "L['x'].size()[0] == 8", "failed, #1", source="guard"),
    )
    exporter.on_event(
        CompileEvent(1, 0.0, "eager", 1, loc, "add.Tensor", "add.Tensor(f32[9])", (), 0.01, None, 0, diffs)
    )
    exporter.on_compile(info)
    exporter.on_execute_begin("eager", "add.Tensor", key)
    exporter.on_execute("eager", "add.Tensor", key, 1e-5)
    exporter.on_event(
        DivergenceEvent(2, 0.0, "eager", 1, loc, "add.Tensor", "local", 0.5, 0.25, 3.0, 4, False, 1e-5, True)
    )
    exporter.on_event(
        DivergenceEvent(
            3, 0.0, "eager", 1, loc, "mul.Tensor", "local", 1e-9, 1e-9, 0.0, 0, False, 1e-5, False
        )
    )
    summary = exporter.stop()
    assert errors == [] and summary.spans == 3

    events = _trace_events(tmp_path)
    (recompile,) = _named(events, "recompile aten::add.Tensor")
    # a value with a bare comma is parenthesized and '#' escaped, or xprof would cut it there
    assert recompile["args"]["recompile"] == (
        "(arg 0: f32[8] -> f32[9]; dynamo guard: L['x'].size()[0] == 8 -> failed, %231)"
    )
    assert recompile["args"]["line"] == "/work/model.py:12 in forward"
    assert recompile["args"]["inputs"] == "(float32[9], alpha=1)"
    (op,) = _named(events, "aten::add.Tensor")
    assert op["args"]["inputs"] == "(float32[9], alpha=1)"
    (div,) = [e for e in events if e["name"].startswith("divergence")]  # only the one over tolerance
    assert div["name"] == "divergence aten::add.Tensor (local)"
    assert (div["args"]["max_abs"], div["args"]["tolerance"], div["args"]["first"]) == ("0.5", "1e-05", "1")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("tpu_debug/max_divergence")] == [(0, 0.5)]
    # the step counts are the step records' (a trace's StepTracker): this exporter has none
    assert "tpu_debug/recompiles" not in acc.Tags()["scalars"]


def test_divergence_over_tolerance_is_marked_where_it_happens(logdir):
    # TPU numerics hold a float32 matmul to the precision it emulates (one bfloat16 pass), not to
    # float32's tolerance. Operands near 1000 varying by 1 keep about one bit of that variation in
    # bfloat16 (its spacing there is 4): the product's rounding error (RMS ~1.2 * sqrt(32)) is
    # over half of what the result varies (sqrt(32)), a divergence at the emulated precision
    x, w = (torch.randn(32, 32) + 1000).to("tpu"), torch.randn(32, 32).to("tpu")
    with tpu_debug.trace(logdir=logdir, tensorboard=True, divergence=True, numerics="tpu") as session:
        (x @ w).sum().item()
    first = [d for d in session.events(kind="divergence") if d.first]
    assert {(d.name, d.measure) for d in first} == {("mm", "local"), ("mm", "drift")}
    events = _trace_events(session.run_dir / "tensorboard")
    marks = {e["name"]: e for e in events if e["name"].startswith("divergence ")}
    assert {"divergence aten::mm (local)", "divergence aten::mm (drift)"} <= set(marks)
    local = marks["divergence aten::mm (local)"]["args"]
    stored = next(d for d in first if d.measure == "local")
    assert float(local["max_abs"]) == pytest.approx(stored.max_abs, rel=1e-5) and local["first"] == "1"
    assert THIS_FILE in local["line"]
    (mm,) = _named(events, "aten::mm")
    assert marks["divergence aten::mm (local)"]["ts"] >= mm["ts"]  # marked after the op ran


def test_a_users_own_jax_profile_gets_the_spans(tmp_path, logdir):
    import jax

    # Python function tracing off: on, the profile holds an event for every Python call any
    # thread makes while it runs (tens of MB when the trace's start imports modules, tens of
    # seconds for xprof to convert); tpu_debug's spans are host TraceMe events, which that
    # option does not touch
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    jax.profiler.start_trace(str(tmp_path / "mine"), profiler_options=options)
    try:
        with tpu_debug.trace(logdir=logdir, tensorboard=True) as session:
            (torch.ones(3, device="tpu") + 1).cpu()
    finally:
        jax.profiler.stop_trace()
    tb = session.tensorboard_summary()
    assert "started outside tpu_debug" in tb.notes[0] and tb.profile == ()
    names = {e["name"] for e in _trace_events(tmp_path / "mine")}
    assert {"aten::add.Tensor", "transfer d2h"} <= names


def test_an_exporter_failure_does_not_break_the_program(logdir, monkeypatch):
    def broken(self):
        raise OSError("disk full")

    monkeypatch.setattr(TensorBoardExporter, "start", broken)
    with tpu_debug.trace(logdir=logdir, tensorboard=True) as session:
        y = (torch.ones(3, device="tpu") * 3).cpu()
    assert y.tolist() == [3.0, 3.0, 3.0]
    assert [(e.where, e.message) for e in session.internal_errors()] == [
        ("TensorBoardExporter.start", "OSError: disk full")
    ]
    assert session.tensorboard_summary().status == "failed"


def test_config_from_env_and_arguments():
    config = TraceConfig.from_env(
        {"TPU_DEBUG_TENSORBOARD": "yes", "TPU_DEBUG_TENSORBOARD_MAX_EVENTS": "5_000"}
    )
    assert (config.tensorboard, config.tensorboard_max_events) == (True, 5000)
    assert TraceConfig.from_env({}).tensorboard is False
    with pytest.raises(
        ConfigError, match=r"^TPU_DEBUG_TENSORBOARD_MAX_EVENTS='0' is not a positive integer; "
    ):
        TraceConfig.from_env({"TPU_DEBUG_TENSORBOARD_MAX_EVENTS": "0"})
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TENSORBOARD='maybe' is not a boolean"):
        TraceConfig.from_env({"TPU_DEBUG_TENSORBOARD": "maybe"})
    with pytest.raises(ConfigError, match=r"^tensorboard_max_events=-1: expected a positive integer$"):
        tpu_debug.trace(tensorboard_max_events=-1)
    with pytest.raises(ConfigError, match=r"^tensorboard='on': expected True or False$"):
        tpu_debug.trace(tensorboard="on")


def test_cli_prints_the_command(recorded, capsys):
    logdir = recorded.run_dir.parent
    assert main(["tensorboard", "--logdir", str(logdir), "--print"]) == 0
    command = shlex.split(capsys.readouterr().out)
    assert command[1:] == [
        "-m",
        "tensorboard.main",
        "--logdir",
        str((recorded.run_dir / "tensorboard").resolve()),
        "--host",
        "127.0.0.1",
    ]
    assert main(["tensorboard", str(recorded.run_dir), "--print", "--port", "7007"]) == 0
    assert shlex.split(capsys.readouterr().out)[-2:] == ["--port", "7007"]


def test_cli_run_records_tensorboard_on_request(tmp_path, logdir, monkeypatch, capsys):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nimport tpu_debug\nprint((torch.ones(3, device='tpu') * 2).sum().item())\n")
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--no-report", "--logdir", str(logdir), "--tensorboard", "--tensorboard-max-events", "50"]
    assert main([*argv, str(script)]) == 0
    assert capsys.readouterr().out == "6.0\n"
    with tpu_debug.open_run(logdir=logdir) as session:
        tb = session.tensorboard_summary()
        assert (tb.status, tb.max_events, len(tb.profile)) == ("finished", 50, 1)
        assert session.metadata().options["tensorboard_max_events"] == 50


def test_cli_explains_a_run_without_tensorboard(logdir, capsys):
    with tpu_debug.trace(logdir=logdir, name="plain"):
        torch.ones(2, device="tpu").cpu()
    assert main(["tensorboard", "--logdir", str(logdir)]) == 1
    err = capsys.readouterr().err
    assert "has no TensorBoard data" in err and "'tpu-debug run --tensorboard script.py'" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":  # TensorBoard compresses regardless
            body = gzip.decompress(body)
    return json.loads(body)


def test_tensorboard_serves_the_run_to_the_profile_plugin(recorded, capsys, tmp_path):
    port = _free_port()
    assert main(["tensorboard", str(recorded.run_dir), "--print", "--port", str(port)]) == 0
    command = shlex.split(capsys.readouterr().out)
    base = f"http://127.0.0.1:{port}/data/plugin/profile"
    with open(tmp_path / "tensorboard.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            runs, deadline = [], time.monotonic() + 60
            while not runs:
                assert process.poll() is None, (tmp_path / "tensorboard.log").read_text()
                assert time.monotonic() < deadline, "TensorBoard did not answer within 60 s"
                try:
                    runs = _get_json(f"{base}/runs")
                except OSError:
                    time.sleep(0.5)
            session = profile_files(recorded.run_dir / "tensorboard")[0].parent.name
            assert runs == [session]
            tools = _get_json(f"{base}/run_tools?run={session}")
            assert {"trace_viewer", "trace_viewer@"} & set(tools), tools
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
