"""Recompile analysis: first compile vs recompile, structured diffs, storms, guards."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from tpu_debug.runtime import probes
from tpu_debug.runtime.eager import clear_cache
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import CompileInfo, DynamoOrigin, GraphInfo
from tpu_debug.tracers.events import ArgInfo, CompileEvent, KeyDiff, SourceLocation
from tpu_debug.tracers.reading.recompile_analysis import Change, explain, summarize
from tpu_debug.tracers.recording.recompile_tracker import RecompileTracker

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError, RecompileError
from tpu_debug.guards import _RecompileGuard

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pitfalls"


def _info(name, *args, key=None, mode="eager", **fields):
    return CompileInfo(
        mode, name, key if key is not None else (name, args, tuple(fields.items())), args, 0.01, **fields
    )


def _graph(kind, *, grad_mode=True):
    """A compiled-mode graph that dynamo captured from no known frame."""
    return GraphInfo(kind, (), "", DynamoOrigin(grad_mode))


def _t(name, shape, dtype="float32", **kw):
    return ArgSpec(name, shape, dtype, **kw)


def _diffs(tracker, info):
    return [d.render() for d in tracker.observe(info).diffs]


# -- the tracker on synthetic keys: each kind of difference ------------------------------


def test_first_compile_then_shape_recompile():
    tracker = RecompileTracker()
    first = tracker.observe(_info("mul.Tensor", _t("self", (8, 128)), _t("other", (8, 128))))
    assert (first.recompile, first.diffs, first.compiles, first.identity) == (False, (), 1, "mul.Tensor")
    first.bind(7)
    seen = tracker.observe(_info("mul.Tensor", _t("self", (8, 128)), _t("other", (9, 128))))
    assert seen.recompile and seen.previous_event == 7 and seen.compiles == 2
    assert seen.diffs == (
        KeyDiff("shape", "f32[8,128]", "f32[9,128]", arg_index=1, arg_name="other", dims=(0,)),
    )
    # another op is a first compile, whatever its shapes
    assert not tracker.observe(_info("add.Tensor", _t("self", (9, 128)))).recompile


def test_dtype_static_scalar_and_layout_diffs():
    tracker = RecompileTracker()
    tracker.observe(_info("sum.dim_IntList", _t("self", (4, 4)), ArgSpec("dim", static=[1])))
    assert _diffs(
        tracker, _info("sum.dim_IntList", _t("self", (4, 4), "bfloat16"), ArgSpec("dim", static=[1]))
    ) == ["arg 0 'self' dtype: f32 -> bf16"]
    assert _diffs(tracker, _info("sum.dim_IntList", _t("self", (4, 4)), ArgSpec("dim", static=[0]))) == [
        "static arg 'dim': [1] -> [0]"
    ]
    tracker.observe(_info("pow.Tensor_Scalar", _t("self", (4,)), ArgSpec("exponent", static=2, scalar=True)))
    assert _diffs(
        tracker, _info("pow.Tensor_Scalar", _t("self", (4,)), ArgSpec("exponent", static=3, scalar=True))
    ) == ["python scalar baked in 'exponent': 2 -> 3"]
    # 2 and 2.0 are different keys (and programs), not the same value
    # 2.0 is not 2 (another key, another program); 2 and 3 are equally close: the latest wins
    assert _diffs(
        tracker, _info("pow.Tensor_Scalar", _t("self", (4,)), ArgSpec("exponent", static=2.0, scalar=True))
    ) == ["python scalar baked in 'exponent': 3 -> 2.0"]
    view = (("storage", (32,)), ("view", "slice"))
    tracker.observe(_info("add.Tensor", _t("self", (4, 3), layout=view)))
    strided = (("storage", (32,)), ("view", "strided (8, 1)"))
    assert _diffs(tracker, _info("add.Tensor", _t("self", (4, 3), layout=strided))) == [
        "arg 0 'self' view: slice -> strided (8, 1)"
    ]
    assert _diffs(tracker, _info("add.Tensor", _t("self", (4, 3)))) == [
        "arg 0 'self' storage: (32,) -> contiguous",
        "arg 0 'self' view: strided (8, 1) -> contiguous",
    ]


def test_config_and_compiled_facts():
    tracker = RecompileTracker()
    tracker.observe(_info("mm", _t("self", (4, 4)), settings=(("matmul precision", "highest"),)))
    assert _diffs(tracker, _info("mm", _t("self", (4, 4)), settings=(("matmul precision", "high"),))) == [
        "matmul precision: highest -> high"
    ]
    tracker.observe(
        _info("g1/forward", _t("arg0", (4,)), key=("g1/forward", "d1", 1), mode="compiled", graph=_graph("forward"))
    )
    info = _info(
        "g1/forward",
        _t("arg0", (4,)),
        key=("g1/forward", "d1", 2),
        mode="compiled",
        graph=_graph("inference", grad_mode=False),
    )
    assert _diffs(tracker, info) == ["grad mode: enabled -> disabled", "graph kind: forward -> inference"]


def test_closest_key_has_fewest_mismatches_latest_on_a_tie():
    tracker = RecompileTracker()
    for i, shape in enumerate([(8, 16), (9, 32), (9, 16)]):
        tracker.observe(_info("relu", _t("self", shape))).bind(i + 1)
    seen = tracker.observe(_info("relu", _t("self", (8, 32))))
    # (9, 16) differs in two dims; (9, 32) and (8, 16) in one each, and (9, 32) is the later
    assert seen.previous_event == 2 and [d.render() for d in seen.diffs] == [
        "arg 0 'self': f32[9,32] -> f32[8,32]"
    ]


def test_replayed_compiles_are_history_not_recompiles():
    tracker = RecompileTracker()
    replayed = _info("relu", _t("self", (8,)), replayed=True)
    assert not tracker.observe(replayed).recompile
    seen = tracker.observe(_info("relu", _t("self", (9,))))
    assert seen.recompile and seen.previous_event is None and seen.diffs


def test_explain_is_jax_style_prose():
    diff = KeyDiff("shape", "f32[8]", "f32[9]", arg_index=0, arg_name="self", dims=(0,))
    text = explain("mul.Tensor", [diff], compiles=2)
    assert text == (
        "mul.Tensor recompiled (compile 2 of it): the closest earlier key has 1 mismatch:\n"
        "  arg 0 'self': f32[8] -> f32[9]"
    )


# -- the real runtime, recorded in a run ------------------------------------------------


@pytest.mark.quick
def test_eager_recompiles_recorded_with_diffs_and_lines(logdir, cold_cache):
    with tpu_debug.trace(logdir=logdir) as session:
        for n in (8, 9):
            x = torch.ones(4, n, device="tpu")
            x * x  # the line the recompile is blamed on
        s0, s1 = torch.sum(x, dim=0), torch.sum(x, dim=1)
        _, p3 = x.pow(2), x.pow(3)
        _, b = torch.add(x, x, alpha=0.5), torch.add(x, x, alpha=0.25)  # a float alpha is an operand
        # same shape: another offset into the storage is an operand of the same program;
        # a view with other strides is read by another program
        _, v1, v2 = x[:, :3] + 1, x[:, 1:4] + 1, x[:, ::3] + 1
    assert (s0.shape, s1.shape, p3.cpu()[0, 0].item(), b.cpu()[0, 0].item(), v1.shape, v2.shape) == (
        (9,),
        (4,),
        1.0,
        1.25,
        (4, 3),
        (4, 3),
    )
    by_name = {}
    for c in session.compiles():
        by_name.setdefault(c.name, []).append(c)
    first, second = by_name["mul.Tensor"]
    assert (first.diffs, first.previous, first.identity) == ((), None, "mul.Tensor")
    assert second.previous == first.id and second.identity == "mul.Tensor"
    assert [d.render() for d in second.diffs] == [
        "arg 0 'self': f32[4,8] -> f32[4,9]",
        "arg 1 'other': f32[4,8] -> f32[4,9]",
    ]
    assert second.location.file == __file__ and second.location.line == first.location.line
    assert [d.render() for d in by_name["sum.dim_IntList"][1].diffs] == ["static arg 'dim': [0] -> [1]"]
    assert [d.render() for d in by_name["pow.Tensor_Scalar"][1].diffs] == [
        "python scalar baked in 'exponent': 2 -> 3"
    ]
    adds = [[d.render() for d in c.diffs] for c in by_name["add.Tensor"]]
    # a new alpha runs the same program; x[:, :3] + 1 is a new key, then a view with other strides
    assert adds[1] == ["inputs: (f32[4,9], f32[4,9], runtime value) -> (f32[4,3], 1)"]
    assert adds[2:] == [["arg 0 'self' view: strided (9, 1) -> strided (9, 3)"]]
    assert {c.name for c in session.recompiles()} >= {"mul.Tensor", "sum.dim_IntList", "pow.Tensor_Scalar"}


def test_matmul_precision_is_part_of_the_key(logdir, cold_cache):
    a = torch.randn(8, 8, device="tpu")
    saved = torch.get_float32_matmul_precision()
    try:
        with tpu_debug.trace(logdir=logdir) as session:
            a @ a
            torch.set_float32_matmul_precision("high")
            a @ a
    finally:
        torch.set_float32_matmul_precision(saved)
    (mm,) = session.recompiles(name="mm")
    assert [d.render() for d in mm.diffs] == [f"matmul precision: {saved} -> high"]


def test_storm_names_the_changing_dimension_with_advice(logdir, cold_cache):
    with tpu_debug.trace(logdir=logdir, storm_threshold=3) as session:
        for seq in (5, 7, 6, 9, 8):
            torch.relu(torch.ones(2, seq, 4, device="tpu"))
    groups = {g.identity: g for g in session.recompiles.groups()}
    relu = groups["relu"]
    assert (relu.compiles, relu.recompiles, relu.storm) == (5, 4, True)
    assert relu.changing.what == "dim 1 of arg 0 'self'" and relu.changing.values == ("5", "7", "6", "9", "8")
    assert relu.advice[0].startswith("pad or bucket dim 1 of arg 0 'self' (it took 5 values)")
    assert relu.locations[0][0].file == __file__
    # the threshold is the run's: a stricter one read back later makes no storm
    assert not {g.identity: g for g in session.recompiles.groups(storm_threshold=4)}["relu"].storm
    text = session.summary(width=200)
    assert "dim 1 of arg 0 'self': 5, 7, 6, 9, 8" in text
    # the loop's iterations are its steps; after the first, every one compiles again: the
    # advisor's finding, with a fix that pads the dimension
    (finding,) = [f for f in session.findings() if f.kind == "dynamic_shape"]
    assert finding.title.startswith("dim 1 of arg 0 'self' of relu takes a new size in steady state (5, 6, 7, 8, 9)")
    assert finding.fix.startswith("dim 1 of arg 0 'self' of relu takes 5 sizes: pad it up to a multiple of 8")
    assert finding.title in text


def test_summarize_scalar_storm_advises_hoisting():
    events = []
    for i, v in enumerate((2, 3, 4)):
        args = (ArgInfo("self", (4,), "float32"), ArgInfo("exponent", static=repr(v)))
        diffs = (KeyDiff("scalar", str(v - 1), str(v), arg_index=1, arg_name="exponent"),) if i else ()
        events.append(
            CompileEvent(i, 0.0, "eager", 0, None, "pow", "sig", args, 0.1, None, None, diffs, "pow")
        )
    (group,) = summarize(events, storm_threshold=1)
    assert (
        group.storm and group.changing.what == "python scalar 'exponent'" and group.changing.kind == "scalar"
    )
    assert group.advice[0].startswith("hoist the python scalar 'exponent' into a tensor on the device")


def _compile_at(i, line, length, *, contiguous=True, diffs=()):
    """A `clone` compiled at ``line`` for a key of ``length`` tokens."""
    layout = () if contiguous else (("offset", 0),)
    args = (ArgInfo("self", (2, 4, length, 8), "float32", layout=layout),)
    where = SourceLocation("model.py", line, "attend")
    return CompileEvent(i, 0.0, "eager", 0, where, "clone", "sig", args, 0.1, None, None, diffs, "clone")


def _grew(a, b):
    return (KeyDiff("shape", f"f32[2,4,{a},8]", f"f32[2,4,{b},8]", arg_index=0, arg_name="self", dims=(2,)),)


def test_summarize_reads_changes_per_line_and_names_a_growing_size():
    layout = (KeyDiff("layout", "contiguous", "0", arg_index=0, arg_name="self", detail="offset"),)
    # a KV cache growing 5..9 at line 10, each length compiled for the key (contiguous) and the
    # value (a view): the layout shows in many diffs but is one difference; line 20 meets one
    # other fixed length, which is no change
    events, i = [], 0
    for n in range(5, 10):
        for contiguous in (True, False):
            diffs = () if i == 0 else (layout if not contiguous else _grew(n - 1, n))
            events.append(_compile_at(i, 10, n, contiguous=contiguous, diffs=diffs))
            i += 1
    events.append(_compile_at(i, 20, 64, diffs=_grew(9, 64)))
    (group,) = summarize(events, storm_threshold=5)
    assert group.storm and group.changing.what == "dim 2 of arg 0 'self'"
    assert group.changing.values == ("5", "6", "7", "8", "9") and group.changing.grows
    assert group.changing.location.line == 10
    assert group.advice[0].startswith("dim 2 of arg 0 'self' grows at every call (5 -> 9)")
    assert not Change("d", "shape", 2, ("5", "7", "6")).grows  # a size that varies but does not grow
    # the same op meeting one shape per line (a model's layers) is no storm
    per_layer = [_compile_at(j, 100 + j, 8 + j, diffs=_grew(7 + j, 8 + j) if j else ()) for j in range(8)]
    (layers,) = summarize(per_layer, storm_threshold=5)
    assert layers.recompiles == 7 and not layers.storm


# -- guards --------------------------------------------------------------------------------


def test_fail_on_recompile_raises_with_the_diff(logdir, cold_cache):
    three, five = torch.ones(3, device="tpu"), torch.ones(5, device="tpu")
    with (
        pytest.raises(RecompileError, match="forbids recompiles here") as info,
        tpu_debug.trace(logdir=logdir, fail_on_recompile=True) as session,
    ):
        # step 0 compiles neg, step 1 repeats it (warm-up is over), step 2 meets a new shape
        for t in (three, three, five):
            t.neg()
            tpu_debug.step()
    message = str(info.value)
    assert message.startswith(f"neg recompiled at {__file__}:")
    assert "the closest earlier key has 1 mismatch:\n  arg 0 'self': f32[3] -> f32[5]\n" in message
    assert message.endswith(
        "trace(fail_on_recompile=True) forbids recompiles here: make the changing input constant (pad or "
        "bucket shapes, hoist Python scalars into tensors), or compile it before this block."
    )
    assert session.metadata().status == "failed"
    assert [len(c.diffs) for c in session.compiles(name="neg")] == [0, 1]  # recorded before raising


def test_expect_no_recompiles_allows_warm_up_and_first_compiles(cold_cache):
    x, y, z = torch.ones(6, device="tpu"), torch.ones(2, device="tpu"), torch.ones(3, device="tpu")
    x.exp()
    with tpu_debug.expect_no_recompiles():
        x.exp()  # cached
        x.sin()  # a first compile: fine
    pattern = (
        rf"(?s)^exp recompiled at {__file__}:\d+ in .*"
        r"arg 0 'self': f32\[6\] -> f32\[2\]\nexpect_no_recompiles\(\) forbids recompiles here"
    )
    with pytest.raises(RecompileError, match=pattern), tpu_debug.expect_no_recompiles():
        y.exp()
    assert not any(isinstance(p, _RecompileGuard) for p in probes.active())
    z.exp()  # the guard is gone after the block


def test_expect_no_recompiles_as_a_decorator(cold_cache):
    @tpu_debug.expect_no_recompiles()
    def step(t):
        return t.cos()

    a, b = torch.ones(4, device="tpu"), torch.ones(5, device="tpu")
    step(a)
    with pytest.raises(RecompileError, match=r"^cos recompiled"):
        step(b)


def test_options_from_environment_and_cli(monkeypatch, tmp_path):
    cfg = TraceConfig.from_env({"TPU_DEBUG_STORM_THRESHOLD": "3", "TPU_DEBUG_FAIL_ON_RECOMPILE": "yes"})
    assert (cfg.storm_threshold, cfg.fail_on_recompile) == (3, True)
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_STORM_THRESHOLD='many' is not a positive integer"):
        TraceConfig.from_env({"TPU_DEBUG_STORM_THRESHOLD": "many"})
    with pytest.raises(ConfigError, match=r"^fail_on_recompile='yes': expected True or False$"):
        tpu_debug.trace(fail_on_recompile="yes")
    script = tmp_path / "recompiles.py"
    script.write_text(
        "import torch, tpu_debug\nfor n in (3, 3, 4):\n    torch.ones(n).to('tpu').tanh()\n    tpu_debug.step()\n"
    )
    code = main(
        ["run", "--no-report", "--logdir", str(tmp_path / "runs"), "--fail-on-recompile", str(script)]
    )
    assert code == 1
    run = tpu_debug.open_run(logdir=tmp_path / "runs")
    assert run.metadata().options["fail_on_recompile"] is True
    assert run.metadata().error.startswith(f"RecompileError: tanh recompiled at {script}:3 in <module>")


# -- the example: a loop fed varying sequence lengths ------------------------------------


def test_recompile_storm_example_names_the_sequence_length(tmp_path, cold_cache, capsys):
    logdir = tmp_path / "runs"
    argv = [
        "run",
        "--no-hlo",
        "--logdir",
        str(logdir),
        "--storm-threshold",
        "2",
        str(EXAMPLES / "recompile_storm.py"),
        "--steps",
        "4",
    ]
    assert main(argv) == 0
    run = tpu_debug.open_run(logdir=logdir)
    groups = {g.identity: g for g in run.recompiles.groups()}
    lengths = ("12", "17", "9", "23")  # recompile_storm.LENGTHS[:4]
    embedding = groups["embedding"]
    assert embedding.storm and embedding.recompiles == 3
    assert (embedding.changing.what, embedding.changing.values) == ("dim 1 of arg 1 'indices'", lengths)
    assert os.path.basename(embedding.locations[0][0].file) == "recompile_storm.py"
    relu = groups["relu"]
    assert relu.storm and relu.changing.what == "dim 1 of arg 0 'self'" and relu.changing.values == lengths
    assert relu.advice[0].startswith("pad or bucket dim 1 of arg 0 'self'")
    storms = [g for g in groups.values() if g.storm]
    assert len(storms) >= 8
    assert all(g.changing.kind == "shape" for g in storms)
    report = capsys.readouterr().err
    # one finding for the one size that drives every op's recompiles: the sequence length
    (finding,) = run.findings()
    assert finding.kind == "dynamic_shape" and finding.steps == (1, 3)
    assert finding.title.startswith("dim 1 of arg 1 'indices' of embedding takes a new size in steady state (9, 12, 17, 23)")
    # relu's recompiles, with the other ops the length reached, are what the one cause led to
    assert any("relu" in c.targets and c.kind == "dynamic_shape" for c in finding.consequences)
    assert not [f for f in run.findings() if f is not finding and f.kind in ("dynamic_shape", "recompile")]
    assert "indices' of embedding takes a new size in steady state (9, 12, 17, 23)" in report
    # padding to a bucket of 32 leaves one shape: nothing recompiles
    clear_cache()
    assert main(argv[:-2] + ["--steps", "4", "--bucket", "32"]) == 0
    bucketed = tpu_debug.open_run(logdir=logdir)
    assert bucketed.run_dir != run.run_dir
    assert not [g for g in bucketed.recompiles.groups() if g.identity == "embedding" and g.recompiles]
    assert bucketed.findings() == []
