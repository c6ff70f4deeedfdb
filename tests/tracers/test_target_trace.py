"""Tracing with a TPU target: every program the runtime compiles, compiled for a real TPU beside the run.

Target compiles need libtpu (XLA's TPU compiler; CI installs the ``tpu`` extra). The
figures compared here come from that compiler (its cost analysis, its buffer
assignment, its layouts) and from arithmetic on them, never from timing.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.runtime.target import LibtpuMissingError, _libtpu, default_compiler, parse_target
from tpu_debug.tracers.advisor.fit_rules import PADDING_FINDING_BYTES
from tpu_debug.tracers.reading.memory_view import memory_view
from tpu_debug.tracers.reading.target_findings import findings
from tpu_debug.tracers.xplane import PROGRAMS_FILE, profile_files
from tpu_debug.tracers.recording.tensorboard_exporter import TARGET_SCALAR_TAGS

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError
from tpu_debug.session import open_run

requires_libtpu = pytest.mark.skipif(
    not _libtpu._find_libtpu(),
    reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it',
)
GiB = 1024**3
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INSTALL = 'pip install "tpu-debug[tpu]" (from a clone: pip install -e ".[tpu]")'
# a float32 sum of 256 products added in another order than PyTorch's: its rounding error
# grows with the terms (about 256 x 2^-24 times their size, 1e-4 for these randn operands),
# not with the sum, so a result near zero needs an absolute allowance
MATMUL_TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module", autouse=True)
def target_cache(tmp_path_factory):
    """One target cache for the module: never the user's, and filled by these tests only."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path_factory.mktemp("target-cache")))
    yield
    mp.undo()


def _compiles(session, name: str) -> list:
    return [e for e in session.events("target_compile") if e.name == name]


def _line(marker: str) -> int:
    """The line of this file holding ``marker`` (a comment), where the traced op is called."""
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text)


# -- options ------------------------------------------------------------------------------


def test_target_spec_is_parsed_strictly(monkeypatch):
    with pytest.raises(ConfigError, match=r"^target='v9x': unknown TPU target 'v9x': use a generation "
                                          r"\(v4, v5e, v5p, v6e\) for one chip"):
        tpu_debug.trace(target="v9x")
    monkeypatch.setenv("TPU_DEBUG_TARGET", "v5e-3")
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TARGET='v5e-3': unknown TPU slice 'v5e-3': v5e-N "
                                          r"counts chips, N one of 1, 4, 8, 16"):
        tpu_debug.trace()
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TARGET_WAIT='soon' is not a number of seconds"):
        TraceConfig.from_env({"TPU_DEBUG_TARGET_WAIT": "soon"})
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TARGET is set but empty; set it to a TPU target, or unset it$"):
        TraceConfig.from_env({"TPU_DEBUG_TARGET": " "})
    config = TraceConfig.from_env({"TPU_DEBUG_TARGET": " V6E-8 ", "TPU_DEBUG_TARGET_WAIT": "2.5"})
    assert (config.target, config.target_wait, config.target_spec().topology) == ("v6e-8", 2.5, "v6e:2x4")
    assert config.override(target="v5p-8").target_spec().chips == 4  # v5p counts cores


def test_without_libtpu_a_target_fails_in_one_line_before_the_script_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_libtpu, "_find_libtpu", lambda: False)
    message = f"compiling for a TPU target needs libtpu, which is not installed: {INSTALL}"
    with pytest.raises(LibtpuMissingError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.") + "$"):
        tpu_debug.trace(target="v5e")
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').write('the script ran')\n")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--logdir", str(tmp_path / "runs"), "--target", "v5e", str(script)])
    assert code == 1
    assert capsys.readouterr().err.splitlines() == [f"tpu-debug run: {message}"]
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()
    monkeypatch.setenv("TPU_DEBUG_TARGET", "v6e-8")  # the environment asks the same
    with pytest.raises(LibtpuMissingError, match="needs libtpu"):
        tpu_debug.trace()


# -- what a target compile records --------------------------------------------------------


@requires_libtpu
def test_matmul_flops_are_2mnk_and_a_step_adds_up_its_programs(logdir, cold_cache):
    m, k, n = 64, 256, 384
    a, b = torch.randn(m, k).to("tpu"), torch.randn(k, n).to("tpu")
    with tpu_debug.trace(logdir=logdir, target="v5e") as session:
        c = a @ b  # the matmul
        d = a @ b
    torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu(), **MATMUL_TOL)
    torch.testing.assert_close(d.cpu(), c.cpu(), rtol=0, atol=0)
    (mm,) = _compiles(session, "mm")
    assert mm.ok and mm.target == "v5e" and not mm.cached
    assert mm.flops == 2 * m * n * k  # the TPU compiler's count, on logical shapes
    assert mm.location.file == __file__ and mm.location.line == _line("# the matmul")
    # per device: a, b and c in HBM at least (no padding: every dimension is a multiple of 128 or 8)
    assert mm.argument_bytes == (m * k + k * n) * 4 and mm.output_bytes == m * n * 4
    assert mm.memory_bytes >= (m * k + k * n + m * n) * 4
    (summary,) = session.events("target_summary")
    assert (summary.target, summary.programs, summary.compiled, summary.unfinished) == ("v5e", 1, 1, 0)
    compute, memory = mm.flops / summary.peak_flops, mm.bytes_accessed / summary.hbm_bandwidth
    assert mm.estimated_seconds == pytest.approx(max(compute, memory), rel=1e-12)
    assert mm.bound == ("compute" if compute >= memory else "memory")
    assert mm.intensity == pytest.approx(mm.flops / mm.bytes_accessed, rel=1e-12)
    # no step marks: step 0 is the whole run, the two runs of the one program
    (step,) = session.events("target_step")
    assert (step.step, step.whole_run, step.executions, step.estimated, step.unfinished) == (0, True, 2, 2, False)
    assert step.flops == 2 * mm.flops
    assert step.estimated_seconds == pytest.approx(2 * mm.estimated_seconds, rel=1e-12)
    assert step.mfu == pytest.approx(step.flops / (step.estimated_seconds * summary.peak_flops), rel=1e-12)
    # the TPU's HLO is stored once, beside the local program it was compiled from
    tpu = session.programs.text(mm.tpu_program)
    assert tpu.mode == "target" and "T(8,128)" in tpu.hlo and "convolution" in tpu.hlo
    (local,) = [p for p in session.programs(name="mm") if p.mode == "eager"]
    assert mm.program == local.hash and session.programs.text(local.hash).hlo != tpu.hlo
    # a second run of the same program is answered by the target cache
    with tpu_debug.trace(logdir=logdir, target="v5e") as again:
        a @ b
    (rerun,) = _compiles(again, "mm")
    assert rerun.cached and rerun.flops == mm.flops and rerun.tpu_program == mm.tpu_program


@requires_libtpu
def test_a_cpu_only_custom_call_is_lowered_again_for_the_tpu(logdir, cold_cache):
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)) + 4 * torch.eye(4)
    with tpu_debug.trace(logdir=logdir, target="v5e") as session:
        inverse = torch.linalg.inv(x.to("tpu"))
    torch.testing.assert_close(inverse.cpu(), torch.linalg.inv(x))
    (inv,) = _compiles(session, "linalg_inv_ex")
    local = session.programs.text(inv.program)
    assert "lapack" in local.stablehlo  # the CPU lowering calls LAPACK, which a TPU has not
    assert inv.ok and inv.relowered and "lapack" not in session.programs.text(inv.tpu_program).hlo


@requires_libtpu
def test_padding_waste_on_a_100_wide_layer_and_not_on_a_128_wide_one(logdir):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    found = {}
    for width in (100, 128):
        w, b = torch.randn(width, 256, generator=g), torch.randn(width, generator=g)
        with tpu_debug.trace(logdir=logdir, target="v5e", name=f"width{width}") as session:
            y = F.linear(x.to("tpu"), w.to("tpu"), b.to("tpu"))  # the layer
        torch.testing.assert_close(y.cpu(), F.linear(x, w, b), **MATMUL_TOL)
        found[width] = findings(session.events("target_compile"))
        # 7 KiB of padding: shown with the target's figures, too small to be one of the run's findings
        assert [f for f in session.findings() if f.kind == "tpu_padding"] == []
    assert found[128] == []
    (pad,) = found[100]
    assert (pad.kind, pad.target, pad.subject) == ("padding", "v5e", "f32[64,100]")
    # 100 of the 128 lanes of each (8, 128) tile: 28 padding columns of 64 float32 rows
    assert pad.figure("layout") == "{1,0:T(8,128)}" and pad.figure("padded_bytes") == 64 * 128 * 4
    assert pad.figure("wasted_bytes") == 64 * 28 * 4 and pad.figure("waste") == pytest.approx(28 / 128)
    # the matrix unit computes whole output tiles: 2 x 64 x 256 products for each padding column
    assert pad.figure("flops_wasted") == pytest.approx(2 * 64 * 256 * 28, rel=1e-9)
    assert pad.programs == ("addmm",) and pad.locations[0].line == _line("# the layer")
    assert pad.fix == "pad dimension 1 (size 100) to a multiple of 128"


@requires_libtpu
def test_a_megabyte_of_padding_in_one_array_is_one_of_the_runs_findings(logdir):
    # 96 images of 100 x 100: no dimension fills a 128-lane tile row
    images = torch.rand(96, 3, 100, 100, generator=torch.Generator().manual_seed(0))
    with tpu_debug.trace(logdir=logdir, target="v5e", hlo=False) as session:
        scaled = images.to("tpu") * 4.0  # the image batch
    torch.testing.assert_close(scaled.cpu(), images * 4.0, rtol=0, atol=0)
    (advice,) = [f for f in session.findings() if f.kind == "tpu_padding"]
    assert advice.severity == "warning" and advice.subject.startswith("v5e: f32[96,3,100,100]")
    # whichever way the compiler lays it out, one 100 sits on the lanes (padded to 128), and 96
    # (a multiple of 8) or the other 100 (to 104) on the sublanes: 28 of every 128 lanes at least
    wasted = advice.evidence.count("padding bytes")
    assert wasted >= 96 * 3 * 100 * 28 * 4 >= PADDING_FINDING_BYTES
    assert advice.evidence.location.line == _line("# the image batch")
    assert "pad dimension" in advice.fix and "(size 100) to a multiple of 128" in advice.fix


@requires_libtpu
def test_a_program_over_v5e_hbm_is_refused_there_and_fits_v6e(logdir):
    # a batch of 2x2 float32 matrix products: the TPU's matrix unit reads each 2x2 matrix
    # from a (2, 128) tile, so the compiler's operand copies take 128x the bytes of the
    # inputs (18 GiB for 144 MiB here), while the product runs here in the inputs' size
    batch = 9 * 2**20
    saved = runtime_config.matmul_precision, torch.get_float32_matmul_precision()
    torch.tpu.precision.set("medium")  # one bfloat16 pass: a smaller program, a faster compile
    try:
        a = torch.ones(batch, 2, 2, device="tpu")
        sessions = {}
        for target in ("v5e", "v6e"):
            with tpu_debug.trace(logdir=logdir, target=target, name=target) as session:
                c = torch.bmm(a, a)  # the batched product
            sessions[target] = session
        torch.testing.assert_close(c[:4].cpu(), torch.full((4, 2, 2), 2.0), rtol=0, atol=0)
        del a, c
    finally:
        runtime_config.matmul_precision = saved[0]
        torch.set_float32_matmul_precision(saved[1])
    v5e, v6e = sessions["v5e"], sessions["v6e"]
    (refused,) = _compiles(v5e, "bmm")
    assert refused.status == "hbm_oom" and refused.memory_bytes is None
    assert 15 * GiB < refused.available_bytes < 16 * GiB < refused.required_bytes
    assert "v6e" in refused.larger_targets and "v5e" not in refused.larger_targets
    (oom,) = findings(v5e.events("target_compile"))
    assert oom.kind == "hbm_oom" and oom.programs == (refused.signature,)
    assert oom.locations[0].file == __file__ and oom.locations[0].line == _line("# the batched product")
    assert v5e.metadata().status == "finished"  # the run went on here
    report = v5e.summary()
    assert "TPU target (v5e)" in report and "OOM" in report
    assert f"hbm_oom: bmm at test_target_trace.py:{_line('# the batched product')} needs" in report
    # one of the run's findings, an error, at the line, with a fix for its cause (HBM)
    (advice,) = [f for f in v5e.findings() if f.kind == "hbm_oom"]
    assert advice.severity == "error" and advice.cause == "hbm" and "v6e" in advice.fix
    assert advice.evidence.location.line == _line("# the batched product")
    assert advice.evidence.count("required") == refused.required_bytes
    assert "hbm_oom" not in {f.kind for f in v6e.findings()}
    # v6e: 32 GiB per chip; the same program fits, needing more than a v5e chip offers
    (fits,) = _compiles(v6e, "bmm")
    assert fits.ok and refused.available_bytes < fits.memory_bytes < v6e.events("target_summary")[0].hbm_bytes
    found = findings(v6e.events("target_compile"))
    assert "hbm_oom" not in {f.kind for f in found}
    # and why it is so big: the copies for the matrix unit are nearly all padding
    assert any(f.kind == "padding" and "T(2,128)" in f.figure("layout") and f.figure("waste") > 0.9
               for f in found)


@requires_libtpu
def test_compiles_still_queued_at_the_end_are_counted_not_waited_for(logdir, cold_cache):
    gate = threading.Event()

    def held(x):  # traced on the compiler's one worker: it holds the queue until the gate opens
        gate.wait(120)
        return x

    blocker = default_compiler().submit(held, (jax.ShapeDtypeStruct((1,), jnp.float32),), parse_target("v5e"), cache=False)
    try:
        with tpu_debug.trace(logdir=logdir, target="v5e", target_wait=0) as session:
            y = torch.ones(3, device="tpu") * 3
    finally:
        gate.set()
    blocker.result(timeout=600)
    torch.testing.assert_close(y.cpu(), torch.full((3,), 3.0))
    (summary,) = session.events("target_summary")
    compiled_here = len(session.compiles())
    assert compiled_here >= 2  # the ones and the product
    assert (summary.unfinished, summary.programs, summary.wait_limit) == (compiled_here, 0, 0.0)
    assert session.events("target_compile") == []
    assert f"{compiled_here} program(s) still compiling when the trace stopped waiting" in session.summary()


# -- the face: CLI, report, TensorBoard ---------------------------------------------------


# mlp_train.py trains on tpu with SGD, then Adam, and each again on CPU as the reference: the
# script's own loop makes 2 x --steps optimizer steps on tpu (and as many on CPU)
LOOP_STEPS = 4


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """``tpu-debug run --target v5e examples/mlp_train.py --steps 4``, its stderr and its run."""
    if not _libtpu._find_libtpu():
        pytest.skip('needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')
    tmp_path = tmp_path_factory.mktemp("cli-target")
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp_path)
    # the section shows the programs whose TPU compile ended: on a machine other tests load,
    # the default minute for the ones still compiling at the end may not be enough
    mp.setenv("TPU_DEBUG_TARGET_WAIT", "600")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = main(["run", "--logdir", str(tmp_path / "runs"), "--target", "v5e", str(EXAMPLES / "mlp_train.py"),
                         "--steps", str(LOOP_STEPS)])
    finally:
        mp.undo()
    assert code == 0, err.getvalue()
    return err.getvalue(), open_run(logdir=tmp_path / "runs")


@requires_libtpu
def test_cli_run_with_target_reports_tpu_hlo_memory_padding_and_roofline(cli_run):
    err, session = cli_run
    section = err[err.index("TPU target (v5e)"):]
    header = next(line for line in section.splitlines() if "| program" in line)
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "program", "HBM", "FLOP", "bytes", "FLOP/B", "bound", "est.", "pad", "HLO"
    ]
    events = session.events("target_compile")
    addmm = max((e for e in events if e.name == "addmm"), key=lambda e: e.flops)
    row = next(line for line in section.splitlines() if line.startswith(f"| {addmm.signature[:12]}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] in ("compute", "memory") and cells[7].endswith("%") and cells[2].endswith(("K", "M"))
    # the HLO column names the TPU program: its optimized HLO with TPU tile layouts
    assert "T(8,128)" in session.programs.hlo(int(cells[8])) and session.programs.text(int(cells[8])).mode == "target"
    assert all(e.ok and e.memory_bytes and e.estimated_seconds for e in events)
    (summary,) = session.events("target_summary")
    # every program that ran was compiled for the target
    ran = {p.hash for p in session.programs() if p.mode == "eager" and p.count}
    assert ran <= {e.program for e in events} and summary.programs == len(events)
    assert summary.unfinished == 0 and summary.failed == 0
    steps = session.events("target_step")
    assert [s.step for s in steps if not s.unfinished][:3] == [0, 1, 2]  # SGD's first three steps
    assert all(s.executions == s.estimated > 0 and 0 < s.mfu < 1 for s in steps)
    assert "step" in section and "MFU est." in section and "a model estimate, not a measurement" in section


@requires_libtpu
def test_steps_memory_and_target_count_the_traced_devices_steps_only(cli_run):
    _err, session = cli_run
    tpu_steps = 2 * LOOP_STEPS
    assert [s.index for s in session.steps()] == list(range(tpu_steps))
    memory = memory_view(session)
    assert memory.summary.steps == tpu_steps
    # one memory record per step, by the step's own index (and the work after the last step)
    assert [m.step for m in memory.steps][:tpu_steps] == list(range(tpu_steps))
    assert memory.summary.peak_step < len(memory.steps) <= tpu_steps + 1
    # numbered as the run's steps are
    finished = [s.step for s in session.events("target_step") if not s.unfinished]
    assert finished == list(range(tpu_steps))
    # a correct small program: its small padded arrays are target figures, not findings
    assert session.findings() == []


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(256, 128)
        self.out = torch.nn.Linear(128, 100)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))  # the compiled forward


@requires_libtpu
def test_compiled_graph_on_the_tensorboard_timeline_with_a_memory_track(logdir):
    from xprof.convert import raw_to_tool_data

    torch.manual_seed(0)
    net = _Net().to("tpu")
    forward = tpu_debug.compile(net)
    x = torch.randn(64, 256)
    with torch.no_grad(), tpu_debug.trace(logdir=logdir, target="v5e", tensorboard=True) as session:
        for _ in range(2):
            y = forward(x.to("tpu"))
            tpu_debug.step()
    with torch.no_grad():
        torch.testing.assert_close(y.cpu(), net.cpu()(x), **MATMUL_TOL)
    (graph,) = [e for e in session.events("target_compile") if e.mode == "compiled"]
    # the padded output is named by the FX node that made it and the line of the model
    (pad,) = [f for f in findings([graph]) if f.subject == "f32[64,100]"]
    assert pad.programs == ("addmm_1|aten.addmm.default",)
    assert pad.locations[0].line == _line("# the compiled forward")
    # the session holds the captured profile and, beside it, the programs for the memory viewer
    files = profile_files(session.run_dir / "tensorboard")
    (profile,) = [p for p in files if p.name != PROGRAMS_FILE]
    (programs,) = [p for p in files if p.name == PROGRAMS_FILE]
    assert programs.parent == profile.parent
    listed = raw_to_tool_data.xspace_to_tool_names([str(profile), str(programs)])
    protos = {f"{e.name}({e.program_id})" for e in session.events("program_proto")}
    assert protos and "memory_viewer" in listed
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(programs)], "memory_viewer",
                                                   {"module_name": min(protos)})
    assert json.loads(data)["moduleName"] == min(protos).rsplit("(", 1)[0]
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(profile)], "trace_viewer@", {})
    (track,) = [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "C"]
    memory = {e.memory_bytes for e in session.events("target_compile")}
    assert track["name"] == "TPU memory (v5e)" and {v for _, v in track["entries"]} <= memory
    assert graph.memory_bytes in {v for _, v in track["entries"]}
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(profile)], "trace_viewer", {})
    (mark,) = [e for e in json.loads(data)["traceEvents"] if e.get("name") == f"tpu target graph {graph.name}"]
    assert mark["args"]["status"] == "ok" and int(mark["args"]["memory_bytes"]) == graph.memory_bytes
    assert mark["args"]["bound"] == graph.bound
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(session.run_dir / "tensorboard"))
    acc.Reload()
    assert set(TARGET_SCALAR_TAGS) <= set(acc.Tags()["scalars"])
    steps = {s.step: s for s in session.events("target_step")}
    assert [(s.step, s.value) for s in acc.Scalars("tpu_debug/target_step_seconds")] == [
        (n, pytest.approx(steps[n].estimated_seconds, rel=1e-6)) for n in sorted(steps)
    ]
    # the estimate of a step is plotted at the measured step's number: both are its StepEvent index
    assert sorted(steps) == [s.index for s in session.steps()] == [0, 1]
    assert [s.step for s in acc.Scalars("tpu_debug/eager_ops")] == sorted(steps)
