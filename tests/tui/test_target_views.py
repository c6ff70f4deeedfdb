"""The TUI with a run's TPU compiles (``target_compile`` events): in the HLO viewer ``t`` puts
this machine's optimized HLO beside the TPU compiler's for the same program, and the ops view
gains the roofline's estimate and bound per op; a run without them shows neither."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import synthetic_run
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.hlo import make_program
from textual.widgets import DataTable
from tpu_debug.tui.screens.hlo import HloDiffScreen, HloScreen
from tui_helpers import drive, press, screen_text, settle

import tpu_debug

TPU_HLO = (
    "HloModule jit_mul, is_scheduled=true, entry_computation_layout={(f32[8,128]{1,0:T(8,128)}, f32[])->"
    "f32[8,128]{1,0:T(8,128)}}\n\nENTRY %main.4 (Arg_0.1: f32[8,128], Arg_1.2: f32[]) -> f32[8,128] {\n"
    "  %Arg_0.1 = f32[8,128]{1,0:T(8,128)} parameter(0)\n  %Arg_1.2 = f32[] parameter(1)\n"
    "  ROOT %multiply_fusion = f32[8,128]{1,0:T(8,128)} fusion(%Arg_0.1, %Arg_1.2), kind=kLoop\n}\n"
)


@dataclasses.dataclass(frozen=True, slots=True)
class _TargetCompile(ev.Event):
    """The fields of the target tracer's kind the viewer reads (declared here when the build
    does not declare the kind itself)."""

    kind: ClassVar[str] = "target_compile"
    stored: ClassVar[ev.Stored] = ev.Stored("target_compiles", name="name", program="program")

    name: str
    target: str
    program: str | None = None
    tpu_program: str | None = None
    estimated_seconds: float | None = None
    bound: str | None = None


@pytest.fixture
def target_kind():
    declared = "target_compile" not in ev.EVENT_TYPES
    if declared:
        ev.register_event(_TargetCompile)
    yield ev.EVENT_TYPES["target_compile"]
    if declared:
        del ev.EVENT_TYPES["target_compile"]


def _event(cls, writer, **fields):
    """An event of ``cls`` with ``fields`` and a neutral value for any other required field."""
    neutral = {"signature": "", "args": (), "seconds": 0.0, "status": "ok"}
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**neutral, **fields}.items() if k in names}
    return cls(id=writer.new_id(), ts=1.0, mode="eager", thread=1, location=None, **values)


def test_t_shows_the_tpu_hlo_beside_the_local(make_app, tmp_path, target_kind):
    run_dir = tmp_path / "20260131T120000.000Z-target"
    _db, writer = synthetic_run.write_synthetic_run(run_dir, close=False)
    local = make_program("eager", "mul.Tensor", *synthetic_run.mul_hlo(synthetic_run.LENGTHS[0]))
    tpu = writer.add_program(make_program("eager", "mul.Tensor", "", TPU_HLO))
    writer.put(_event(target_kind, writer, name="mul.Tensor", target="v5e", program=local.hash, tpu_program=tpu))
    writer.close(synthetic_run.FINAL)
    assert writer.error is None, writer.error
    app = make_app(run_dir)

    async def scenario(pilot):
        app.push_screen(HloScreen(local.hash, name="mul.Tensor", mode="eager"))
        await settle(pilot)
        assert "TPU HLO for v5e beside it (t)" in screen_text(app)
        await press(pilot, "t")
        assert isinstance(app.screen, HloDiffScreen)
        text = screen_text(app)
        assert "TPU compiler, v5e" in text and "multiply_fusion" in text and "%broadcast.3" in text, text

    drive(app, scenario)


def test_without_tpu_compiles_t_says_so(make_app, synthetic_run):
    session = tpu_debug.open_run(synthetic_run)
    program = session.programs(name="mul.Tensor")[0].hash
    session.close()
    app = make_app()

    async def scenario(pilot):
        app.push_screen(HloScreen(program, name="mul.Tensor", mode="eager"))
        await settle(pilot)
        assert "TPU HLO" not in screen_text(app).split("\n")[1]
        await press(pilot, "t")
        assert isinstance(app.screen, HloScreen)

    drive(app, scenario)


def test_the_ops_view_shows_the_roofline_per_op(make_app, tmp_path, target_kind):
    run_dir = tmp_path / "20260131T120000.000Z-roofline"
    _db, writer = synthetic_run.write_synthetic_run(run_dir, close=False)
    # two programs of mul: the slower one's estimate and bound stand for the op
    for est, bound in ((2e-6, "memory"), (7.5e-6, "compute")):
        writer.put(_event(target_kind, writer, name="mul.Tensor", target="v5e", estimated_seconds=est, bound=bound))
    writer.close(synthetic_run.FINAL)
    assert writer.error is None, writer.error
    app = make_app(run_dir)

    async def scenario(pilot):
        await press(pilot, "3")
        table = app.screen.query_one("#ops", DataTable)
        assert {"tpu_est", "bound"} <= {str(k.value) for k in table.columns}
        rows = {r.name: r for r in app.screen.rows}
        assert (rows["mul.Tensor"].tpu_seconds, rows["mul.Tensor"].bound) == (7.5e-6, "compute")
        assert rows["add.Tensor"].tpu_seconds is None
        cells = [c.plain for c in table.get_row("eager\0mul.Tensor")]
        assert cells[-2:] == ["7.5 µs", "compute"], cells

    drive(app, scenario)


def test_without_tpu_compiles_the_ops_view_has_no_roofline_columns(make_app):
    app = make_app()

    async def scenario(pilot):
        await press(pilot, "3")
        table = app.screen.query_one("#ops", DataTable)
        assert "tpu_est" not in {str(k.value) for k in table.columns}

    drive(app, scenario)
