"""Compile time explained: each compile split into its measured phases, which add up to its
wall time, and its HLO counted per source line of the user's code (compiled graphs, eager
ops, lazy fused graphs); the report's Compile time section, ``compiles.phases`` and
``compiles.lines`` in the JSON, the pprof profile, and the phases on TensorBoard's timeline.

The model is the unrolled-layers pitfall's transformer (``examples/pitfalls/``), tiny: six
layers of width 32 in a Python loop, compiled whole.
"""

from __future__ import annotations

import collections
import gzip
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import warm_python
from tpu_debug.core.hlo_text import parse_module
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers.events import COMPILE_PHASES, CompileEvent, CompileLinesEvent
from tpu_debug.tracers.reading.compile_profile import SAMPLE_TYPES, compile_profile, nanoseconds
from tpu_debug.tracers.reading.compile_time import compile_time

import tpu_debug
from tpu_debug.report import print_report, report_data

ROOT = Path(__file__).parents[2]
PITFALL = ROOT / "examples" / "pitfalls" / "unrolled_layers.py"
LAYERS = 6
EPS = 1e-6


def _pitfall():
    spec = importlib.util.spec_from_file_location("unrolled_layers_for_test", PITFALL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines_of(path: Path, text: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """One training step of the six-layer transformer, compiled whole (its loop unrolled),
    with its TensorBoard profile."""
    m = _pitfall()
    logdir = tmp_path_factory.mktemp("compile-time") / "runs"
    clear_cache()
    torch._dynamo.reset()
    with tpu_debug.trace(logdir=logdir, name="unrolled", tensorboard=True) as session:
        assert m.main(["--layers", str(LAYERS), "--steps", "1"]) == 0
    torch._dynamo.reset()
    return session


def _graph(session) -> str:
    """The compiled graph's name (``gN``): its number counts the graphs this process compiled
    before (other tests')."""
    (graph,) = {c.name.split("/")[0] for c in session.compiles() if c.name.endswith("/forward")}
    return graph


def _nested(units, outer):
    """The compiles that ran inside ``outer`` (a dynamo compile of a frame holds its graphs')."""
    end = outer.start + outer.wall
    return [u for u in units if u is not outer and u.start >= outer.start - EPS and u.start + u.wall <= end + EPS
            and u.kind == "program"]


def test_each_compiles_phases_add_up_to_its_wall_time(compiled_run):
    ct = compile_time(compiled_run)
    kinds = collections.Counter(u.kind for u in ct.units)
    assert kinds["frame"] == 1 and kinds["program"] >= 2, kinds
    for u in ct.units:
        assert set(dict(u.phases.items())) == set(COMPILE_PHASES)
        assert all(v >= 0 for _, v in u.phases.items())
        inner = sum(n.wall for n in _nested(ct.units, u)) if u.kind == "frame" else 0.0
        # a compile's own phases and the compiles nested in it make its measured span
        assert u.phases.total + inner == pytest.approx(u.wall, abs=EPS), u
    # the run's phases are its compiles' phases added up
    assert ct.total == pytest.approx(sum(u.phases.total for u in ct.units), abs=EPS)
    for name, seconds in ct.phases.items():
        assert seconds == pytest.approx(sum(getattr(u.phases, name) for u in ct.units), abs=EPS)

    (frame,) = [u for u in ct.units if u.kind == "frame"]
    # dynamo's and AOTAutograd's phases, as dynamo timed them (and the partition the runtime times)
    for phase in ("dynamo_trace", "dynamo_guards", "aot_graph", "aot_partition"):
        assert getattr(frame.phases, phase) > 0, phase
    assert frame.name == "forward" and frame.compile_id == "0/0"
    graphs = [u for u in ct.units if u.kind == "program" and u.mode == "compiled"]
    g = _graph(compiled_run)
    assert {u.name for u in graphs} == {f"{g}/forward", f"{g}/backward"}
    for u in graphs:
        assert u.phases.lowering > 0 and u.phases.xla_compile > 0 and u.phases.cache_read == 0
        assert u.compile_id == "0/0"
    # nothing here compiled for a TPU target, nor read anything back
    assert ct.phases.target_compile == 0 and ct.phases.cache_read == 0


def test_compile_events_measure_the_lowering_and_xlas_compile_inside_the_wall_time(compiled_run):
    for c in compiled_run.compiles():
        assert 0 < c.lower_seconds and 0 < c.xla_seconds and c.read_seconds == 0
        assert c.lower_seconds + c.xla_seconds == pytest.approx(c.seconds, abs=EPS)
        assert c.seconds <= c.wall_seconds


def _stablehlo_operations(text: str) -> int:
    """The operations of a StableHLO module's text, its nested regions' included, as MLIR
    parses the text (not as this tool counts them at compile time)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        count = 0

        def walk(op):
            nonlocal count
            for region in op.regions:
                for block in region.blocks:
                    for child in block.operations:
                        if child.operation.name not in ("func.func", "builtin.module"):
                            count += 1
                        walk(child.operation)

        walk(module.operation)
        return count


def test_hlo_counts_equal_the_programs_text_and_the_lines_add_up_to_them(compiled_run):
    lines = {e.compile_event: e for e in compiled_run.events(CompileLinesEvent.kind)}
    graphs = [c for c in compiled_run.compiles() if c.mode == "compiled"]
    assert graphs and all(c.id in lines for c in graphs)
    for c in compiled_run.compiles():
        text = compiled_run.programs.text(c.program)
        assert c.hlo_after == len(list(parse_module(text.hlo).instructions())), c.name
        assert c.hlo_before == _stablehlo_operations(text.stablehlo), c.name
        if c.id in lines:
            rows = lines[c.id].lines
            assert sum(x.hlo_before for x in rows) == c.hlo_before
            assert sum(x.hlo_after for x in rows) == c.hlo_after


def test_the_layers_lines_take_the_largest_share(compiled_run):
    ct = compile_time(compiled_run)
    block = set(range(_lines_of(PITFALL, "def forward(self, x: torch.Tensor)")[0], _lines_of(PITFALL, "class Transformer")[0]))
    (loop,) = _lines_of(PITFALL, "x = layer(x)")
    mine = [x for x in ct.lines if x.file == str(PITFALL)]
    top = [x for x in mine if x.seconds > 0][:3]
    assert top and all(x.line in block for x in top), [(x.line, x.seconds) for x in mine]
    assert all(x.instances == LAYERS and x.module == "Block" for x in top)
    layer_share = sum(x.seconds for x in mine if x.line in block) / ct.total
    assert layer_share > 0.5, layer_share
    # the lines' estimates share out the whole compile time
    assert sum(x.seconds for x in ct.lines) == pytest.approx(ct.total, rel=1e-9)
    # the graph's nodes name the loop that called the layer's lines
    forward = next(c for c in compiled_run.compiles() if c.name == f"{_graph(compiled_run)}/forward")
    (event,) = [e for e in compiled_run.events(CompileLinesEvent.kind) if e.compile_event == forward.id]
    called = {(x.caller_file, x.caller_line) for x in event.lines if x.line in block}
    assert called == {(str(PITFALL), loop)}


def test_the_unrolled_loop_finding_offers_one_compiled_layer(compiled_run):
    (finding,) = [f for f in compiled_run.findings() if f.kind == "unrolled_loop"]
    (loop,) = _lines_of(PITFALL, "x = layer(x)")
    assert finding.evidence.location.line == loop and finding.estimated
    assert f"{LAYERS} Block layers" in finding.title and f"{_graph(compiled_run)}/forward" in finding.title
    assert "compile one Block and reuse it" in finding.fix and "scan" in finding.fix
    assert finding.evidence.count("layers") == LAYERS


def test_the_report_and_json_hold_the_phases_and_the_lines(compiled_run):
    data = report_data(compiled_run)["compiles"]
    phases, lines = data["phases"], data["lines"]
    ct = compile_time(compiled_run)
    assert phases["total"] == pytest.approx(ct.total) and list(phases["run"]) == list(COMPILE_PHASES)
    assert sum(phases["run"].values()) == pytest.approx(phases["total"])
    g = _graph(compiled_run)
    assert {p["name"] for p in phases["programs"]} >= {"forward", f"{g}/forward", f"{g}/backward"}
    for p in phases["programs"]:
        assert sum(p["phases"].values()) == pytest.approx(p["seconds"])
    assert sum(x["seconds"] for x in lines) == pytest.approx(phases["total"])
    assert {"file", "line", "function", "hlo_before", "hlo_after", "seconds"} <= set(lines[0])
    assert "estimate" in data["lines_method"]

    out = io.StringIO()
    print_report(compiled_run, file=out, terminal=False, width=160)
    text = out.getvalue()
    section = text[text.index("Compile time\n"):]
    assert "measured phase by phase" in section and "XLA compile (this machine)" in section
    assert "AOTAutograd: joint graph" in section and f"{LAYERS} Block" in section
    assert "time per line is an estimate" in section


# -- pprof ----------------------------------------------------------------------------------


def _profile_message():
    """pprof's ``Profile`` message (github.com/google/pprof, proto/profile.proto), built here
    from its field numbers, parsed by the protobuf library as pprof's readers parse it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="profile_for_test.proto", package="perftools.profiles",
                                           syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    spec = {
        "Profile": [("sample_type", 1, "ValueType", True), ("sample", 2, "Sample", True),
                    ("location", 4, "Location", True), ("function", 5, "Function", True),
                    ("string_table", 6, T.TYPE_STRING, True), ("comment", 13, T.TYPE_INT64, True),
                    ("default_sample_type", 14, T.TYPE_INT64, False)],
        "ValueType": [("type", 1, T.TYPE_INT64, False), ("unit", 2, T.TYPE_INT64, False)],
        "Sample": [("location_id", 1, T.TYPE_UINT64, True), ("value", 2, T.TYPE_INT64, True)],
        "Location": [("id", 1, T.TYPE_UINT64, False), ("line", 4, "Line", True)],
        "Line": [("function_id", 1, T.TYPE_UINT64, False), ("line", 2, T.TYPE_INT64, False)],
        "Function": [("id", 1, T.TYPE_UINT64, False), ("name", 2, T.TYPE_INT64, False),
                     ("system_name", 3, T.TYPE_INT64, False), ("filename", 4, T.TYPE_INT64, False)],
    }
    for name, fields in spec.items():
        msg = f.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            d = msg.field.add(name=field, number=number,
                              label=T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL)
            if isinstance(kind, str):
                d.type, d.type_name = T.TYPE_MESSAGE, f".perftools.profiles.{kind}"
            else:
                d.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))


def test_the_compile_profile_parses_as_pprof_and_its_totals_equal_the_json(compiled_run, tmp_path, capsys):
    from tpu_debug.cli import main

    path = tmp_path / "compile.pb.gz"
    capsys.readouterr()
    assert main(["report", "--json", "--compile-profile", str(path), str(compiled_run.run_dir)]) == 0
    data = json.loads(capsys.readouterr().out)["compiles"]
    profile = _profile_message()()
    profile.ParseFromString(gzip.decompress(path.read_bytes()))
    strings = profile.string_table
    assert strings[0] == ""
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == list(SAMPLE_TYPES)
    totals = [sum(s.value[i] for s in profile.sample) for i in range(len(SAMPLE_TYPES))]
    lines = data["lines"]
    assert totals[0] == sum(round(x["seconds"] * 1e9) for x in lines)
    assert totals[1] == sum(x["hlo_before"] for x in lines) and totals[2] == sum(x["hlo_after"] for x in lines)
    assert totals[0] == pytest.approx(data["phases"]["total"] * 1e9, abs=len(lines))
    # each sample is one line of the user's code: its file and line, its function's name
    functions = {fn.id: fn for fn in profile.function}
    where = {}
    for loc in profile.location:
        (line,) = loc.line
        fn = functions[line.function_id]
        where[loc.id] = (strings[fn.filename], line.line, strings[fn.name])
    heaviest = max(profile.sample, key=lambda s: s.value[0])
    file, line, function = where[heaviest.location_id[0]]
    assert (file, function) == (str(PITFALL), "forward") and line == lines[0]["line"]
    assert "estimated" in strings[profile.comment[0]]
    assert nanoseconds(compile_time(compiled_run).lines[0]) == heaviest.value[0]
    assert compile_profile(compile_time(compiled_run)) == gzip.compress(gzip.decompress(path.read_bytes()), mtime=0)


# -- eager and lazy modes ----------------------------------------------------------------------


def test_eager_ops_are_each_a_compile_of_their_own_line(tmp_path):
    clear_cache()
    with tpu_debug.trace(logdir=tmp_path / "runs") as session:
        x = torch.randn(4, 8).to("tpu")
        y = torch.tanh(x) * 3  # the eager line
        y.cpu()
    line = _lines_of(Path(__file__), "# the eager line")[0]
    ct = compile_time(session)
    here = [u for u in ct.units if u.kind == "program" and u.location is not None and u.location.line == line]
    assert {u.name for u in here} == {"tanh", "mul.Tensor"}
    for u in here:
        assert u.mode == "eager" and u.phases.lowering > 0 and u.phases.xla_compile > 0
        assert u.phases.total == pytest.approx(u.wall, abs=EPS)
    (row,) = [x for x in ct.lines if x.line == line and x.file == __file__]
    assert row.programs == 2 and row.hlo_before > 0 and row.hlo_after > 0
    assert row.seconds == pytest.approx(sum(u.phases.total for u in here))


def test_a_lazy_fused_graph_is_counted_by_the_lines_that_recorded_its_ops(tmp_path):
    clear_cache()
    with tpu_debug.trace(logdir=tmp_path / "runs", eager_mode="defer_and_fuse") as session:
        x = torch.randn(4, 8).to("tpu")
        y = torch.tanh(x) * 3  # first fused line
        z = (y @ y.T).relu()  # second fused line
        z.cpu()
    first, second = _lines_of(Path(__file__), "# first fused line")[0], _lines_of(Path(__file__), "# second fused line")[0]
    (fused,) = [c for c in session.compiles() if c.mode == "lazy"]
    (event,) = [e for e in session.events(CompileLinesEvent.kind) if e.compile_event == fused.id]
    rows = {x.line: x for x in event.lines if x.file == __file__}
    assert {first, second} <= set(rows)
    assert rows[first].nodes == 2 and rows[second].nodes >= 2
    assert sum(x.hlo_before for x in event.lines) == fused.hlo_before
    ct = compile_time(session)
    (unit,) = [u for u in ct.units if u.event == fused.id]
    assert unit.mode == "lazy" and unit.phases.xla_compile > 0
    shares = {x.line: x.seconds for x in ct.lines if x.file == __file__}
    # the fused graph's time shared by its lines' operations
    assert shares[first] + shares[second] == pytest.approx(
        unit.phases.total * (rows[first].hlo_before + rows[second].hlo_before) / fused.hlo_before, rel=1e-6)


# -- the compile cache warm ---------------------------------------------------------------------


def _run(tmp_path: Path, cache: Path, name: str) -> dict:
    # each run is a process of its own (warm_python: a fork that has initialized no JAX backend
    # and read no cache), so the warm run reads back what the cold one wrote to disk
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_")}
    env.update(TPU_DEBUG_COMPILE_CACHE="1", TPU_DEBUG_COMPILE_CACHE_DIR=str(cache))
    logdir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "tpu_debug", "run", "--no-report", "--name", name, "--logdir", str(logdir),
           str(PITFALL), "--layers", "1", "--steps", "1"]
    proc = warm_python.run(cmd, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    session = tpu_debug.open_run(name, logdir=logdir)
    return report_data(session)["compiles"]["phases"]


def test_a_warm_cache_shows_the_read_back_and_nothing_else_grows(tmp_path):
    cache = tmp_path / "cache"
    cold, warm = _run(tmp_path, cache, "cold"), _run(tmp_path, cache, "warm")
    programs = [p for p in warm["programs"] if p["kind"] == "program"]
    assert programs and all(p["from_cache"] for p in programs)
    assert cold["run"]["cache_read"] == 0 and cold["run"]["xla_compile"] > 0
    # nothing compiled for this machine: XLA's part became the read-back
    assert warm["run"]["xla_compile"] == 0 and warm["run"]["cache_read"] > 0
    for p in programs:
        assert p["phases"]["xla_compile"] == 0 and p["phases"]["cache_read"] > 0
    # the same compiles, phase for phase: the warm run has no phase the cold one had not, but
    # the read-back (their times are this machine's, not compared)
    assert [(p["kind"], p["name"]) for p in warm["programs"]] == [(p["kind"], p["name"]) for p in cold["programs"]]
    measured = {name for name, s in warm["run"].items() if s > 0}
    assert measured - {name for name, s in cold["run"].items() if s > 0} == {"cache_read"}


# -- TensorBoard ---------------------------------------------------------------------------------


def _trace_events(tb_dir: Path) -> list[dict]:
    """The complete ("X") events of the profile in ``tb_dir``, through xprof's own conversion."""
    from tpu_debug.tracers.xplane import profile_files
    from xprof.convert import raw_to_tool_data

    (file,) = profile_files(tb_dir)
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(file)], "trace_viewer", {})
    return [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"]


def test_tensorboard_draws_each_compile_and_its_phases(compiled_run):
    session = compiled_run
    events = _trace_events(session.run_dir / "tensorboard")
    by_name = collections.defaultdict(list)
    for e in events:
        by_name[e["name"]].append(e)
    assert by_name["dynamo compile forward"], sorted(by_name)[:40]
    g = _graph(session)
    (graph,) = by_name[f"graph {g}/forward (compiled)"]
    for phase in ("dynamo trace", "dynamo guards", "AOTAutograd joint graph", "AOTAutograd partition",
                  "lowering to XLA", "XLA compile"):
        assert by_name[phase], phase
    # the graph's lowering and XLA compile lie inside its compile's span
    inside = [e for e in by_name["lowering to XLA"] + by_name["XLA compile"]
              if graph["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= graph["ts"] + graph["dur"] + 1]
    assert len(inside) == 2
    (stored,) = [c for c in session.compiles() if c.name == f"{g}/forward"]
    assert isinstance(stored, CompileEvent)
    assert graph["dur"] == pytest.approx(stored.wall_seconds * 1e6, rel=1e-3, abs=1)


# -- the TPU target's compile ------------------------------------------------------------------


def _libtpu() -> bool:
    from tpu_debug.runtime.target import _libtpu as libtpu

    return bool(libtpu._find_libtpu())


@pytest.mark.skipif(not _libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')
def test_the_targets_compile_is_a_phase_of_its_own_at_the_level_asked_for(tmp_path, monkeypatch):
    level = "O0"
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", "off")  # each compile made here, none read back
    # TorchTPU's variable: the TPU compile's level on a TPU, here the target compile's too
    monkeypatch.setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", f"xla_optimization_level={level}")
    clear_cache()
    torch._dynamo.reset()
    with tpu_debug.trace(logdir=tmp_path / "runs", target="v5e") as session:
        f = tpu_debug.compile(lambda x: (x @ x.T).relu().sum(dim=0))
        f(torch.randn(64, 128).to("tpu")).cpu()
    torch._dynamo.reset()
    ct = compile_time(session)
    targets = [u for u in ct.units if u.kind == "target"]
    (graph,) = [u for u in targets if u.mode == "compiled"]  # the graph's program (no grad: inference)
    assert graph.phases.target_compile > 0 and graph.phases.total == pytest.approx(graph.wall, abs=EPS)
    assert ct.phases.target_compile == pytest.approx(sum(u.phases.total for u in targets), abs=EPS)
    assert ct.total == pytest.approx(sum(u.phases.total for u in ct.units), abs=EPS)
    (event,) = [e for e in session.events("target_compile") if e.name == graph.name]
    assert event.optimization_level == level
    # the target's compile was timed on the target compiler's thread: its span is its own
    assert event.seconds == pytest.approx(graph.wall, abs=EPS)
