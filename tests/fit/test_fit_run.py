"""A fit answer kept as a run: what the run store, ``report --json``, the text report, the
advisor, the TUI's fit view and ``tpu-debug diff`` show of it.

Reference: the ``FitReport`` the same fit returned in the same test (its figures are checked
against a direct compile in test_fit.py); here what is stored and shown must equal it, figure
for figure (integers exactly; floats go through SQLite's REAL, an IEEE double, so exactly too).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import re

import pytest
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tpu_debug.runtime.target.results import parse_compile_error

import tpu_debug
from tpu_debug.cli import main

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")
pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
# a 262,144-token vocabulary at width 4096: 2.2 B parameters, whose bfloat16 weights and AdamW
# moments alone (13 GB) leave no room on one v5e chip (15.75 GiB) for the step's gradients
# and float32 logits
OVER = dict(SIZES, vocab_size=262144, hidden_size=4096, num_hidden_layers=1, num_attention_heads=32,
            num_key_value_heads=32, max_position_embeddings=512)


@pytest.fixture(scope="module")
def reports(fit_target_cache):
    """Three answers: a tiny Llama under FSDP and under DP on a v5e-8, and a model over one v5e chip."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPU_DEBUG_TARGET_CACHE", str(fit_target_cache))
        config = transformers.LlamaConfig(**SIZES)
        fsdp = tpu_debug.fit(config, "v5e-8", plan="fsdp", batch=8, seq=32)
        dp = tpu_debug.fit(config, "v5e-8", plan="dp", batch=8, seq=32)
        over = tpu_debug.fit(transformers.LlamaConfig(**OVER), "v5e-1", plan="dp", batch=8, seq=512)
    assert (fsdp.fits, dp.fits, over.fits) == (True, True, False)
    return {"fsdp": fsdp, "dp": dp, "over": over}


def _report_json(run_dir, capsys) -> dict:
    capsys.readouterr()
    assert main(["report", "--json", str(run_dir)]) == 0
    return json.loads(capsys.readouterr().out)


def _check_section(f: dict, report) -> None:
    """The report's fit entry against the FitReport, field for field."""
    assert (f["target"], f["chips"], f["plan"], f["job"], f["batch"], f["seq"], f["parameters"]) == (
        report.target.name, report.target.devices, str(report.plan), report.job, report.batch, report.seq,
        report.parameters)
    assert (f["fits"], f["verdict"]) == (report.fits, {True: "fits", False: "does not fit"}[report.fits])
    chip = f["per_chip"]
    assert (chip["required"], chip["capacity"], chip["capacity_source"], chip["headroom"]) == (
        report.required, report.capacity, report.capacity_source, report.headroom)
    m = report.memory
    if m is None:
        assert chip["compiler"] is None and chip["breakdown"] is None
    else:
        assert chip["compiler"] == {"arguments": m.arguments, "outputs": m.outputs, "aliased": m.aliased,
                                    "temporaries": m.temporaries, "code": m.code, "total": m.total,
                                    "host": m.host}
        assert chip["breakdown"] == {"parameters": m.parameters, "optimizer_state": m.optimizer_state,
                                     "batch": m.batch, "gradients": m.gradients, "activations": m.activations,
                                     "kv_cache": m.kv_cache or None}
    assert f["collectives"] == [{"kind": c.kind, "count": c.count, "data_bytes": c.bytes,
                                 "wire_bytes": c.wire_bytes, "seconds": c.seconds} for c in report.collectives]
    assert f["communication"] == [{"kind": b.kind, "compiled_bytes": b.compiled, "bound_bytes": b.bound,
                                   "basis": b.basis, "reasons": list(b.reasons()), "ratio": b.ratio}
                                  for b in report.communication]
    e = report.estimate
    if e is None:
        assert f["estimate"] is None
    else:
        assert f["estimate"] == {
            "compute_seconds": e.compute_seconds, "memory_seconds": e.memory_seconds,
            "comm_seconds": e.comm_seconds, "step_seconds": e.seconds, "overlapped_seconds": e.overlapped_seconds,
            "tokens_per_second": e.tokens_per_second, "model_flops": e.model_flops, "mfu": e.mfu,
            "mfu_overlapped": e.mfu_overlapped, "op_by_op_seconds": e.op_by_op_seconds,
            "mfu_op_by_op": e.mfu_op_by_op}
        assert f["assumptions"] == list(e.assumptions)
    assert (f["error"], f["unsharded"], f["caveats"]) == (report.error, list(report.unsharded), list(report.caveats))


def test_the_cli_keeps_the_answer_as_a_run(reports, tmp_path, monkeypatch, capsys):
    """``tpu-debug fit`` saves a run under TPU_DEBUG_LOGDIR holding the answer it printed."""
    answered = []
    import tpu_debug.fit as fit_package

    fit = fit_package.fit  # the function (the package's own attribute)

    def fit_and_keep(*args, **kwargs):
        answered.append(fit(*args, **kwargs))
        return answered[-1]

    # the verb takes the function from the package (importing a submodule binds the package's
    # name on tpu_debug, so the package's own attribute is the one to replace)
    monkeypatch.setattr(fit_package, "fit", fit_and_keep)
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", str(tmp_path / "runs"))
    code = main(["fit", "tiny-llama", "--target", "v5e-8", "--plan", "fsdp", "--batch", "8", "--seq", "32"])
    out, err = capsys.readouterr()
    (report,) = answered
    assert code == 0 and report.fits
    saved = re.search(r"run saved in (\S+) \(tpu-debug report", err)
    assert saved, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert saved.group(1) == str(run_dir)
    (event,) = tpu_debug.open_run(str(run_dir)).events("fit")
    assert (event.model, event.required_bytes, event.capacity_bytes, event.step_seconds) == (
        report.model, report.required, report.capacity, report.estimate.seconds)
    assert event.location is None  # asked from the command line
    (section,) = _report_json(run_dir, capsys)["fit"]
    _check_section(section, report)


def test_no_record_keeps_no_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", str(tmp_path / "runs"))
    assert main(["fit", "tiny-llama", "--target", "v5e-8", "--batch", "8", "--seq", "32", "--no-record"]) == 0
    assert "run saved in" not in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_search_is_kept_as_one_run_with_the_recommended_plan_last(reports, tmp_path, capsys):
    """Every candidate a search compiled is kept, field for field, the recommended one last
    (what the TUI's fit view shows); from the command line too."""
    from tpu_debug.fit import PlanSearch, record_search

    fsdp, dp, over = reports["fsdp"], reports["dp"], reports["over"]
    found = PlanSearch("largest batch", (fsdp, over, dp), best=fsdp)
    run_dir = record_search(found, logdir=tmp_path, name="search")
    sections = _report_json(run_dir, capsys)["fit"]
    assert len(sections) == 3
    for section, report in zip(sections, (over, dp, fsdp)):
        _check_section(section, report)
    # the candidates the search passed on the way are marked; a step that did not fit among
    # them is not a finding (the search's answer fits)
    assert [s["candidate_of"] for s in sections] == ["largest batch", "largest batch", None]
    assert not [f for f in tpu_debug.open_run(str(run_dir)).findings() if f.kind == "fit_oom"]
    none_fits = PlanSearch("smallest slice", (over,), best=None)
    none_dir = record_search(none_fits, logdir=tmp_path, name="none")
    (section,) = _report_json(none_dir, capsys)["fit"]
    _check_section(section, over)
    assert section["candidate_of"] is None  # the search's answer: judged
    assert [f.kind for f in tpu_debug.open_run(str(none_dir)).findings() if f.kind == "fit_oom"] == ["fit_oom"]
    with pytest.raises(tpu_debug.TpuDebugError, match=r"no candidate was compiled, nothing to keep"):
        record_search(PlanSearch("largest batch", (), best=None), logdir=tmp_path)


def test_the_cli_keeps_a_search_as_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", str(tmp_path / "runs"))
    assert main(["fit", "tiny-llama", "--target", "v5e-8", "--plan", "fsdp", "--batch", "8", "--seq", "32",
                 "--search", "slice"]) == 0
    out, err = capsys.readouterr()
    saved = re.search(r"run saved in (\S+) \(tpu-debug report", err)
    assert saved, err
    (event,) = tpu_debug.open_run(saved.group(1)).events("fit")  # a v5e-1 holds the tiny model: one candidate
    assert (event.target, event.fits) == ("v5e-1", True)
    assert out.startswith("smallest slice: v5e-1, plan single, batch 8")  # one chip: nothing to split


@pytest.mark.parametrize("which", ["fsdp", "over"])
def test_report_json_and_text_show_the_answer(reports, which, tmp_path, capsys):
    from tpu_debug.core.format import format_bytes
    from tpu_debug.fit import record_fit

    report = reports[which]
    run_dir = record_fit(report, logdir=tmp_path, name=which)
    data = _report_json(run_dir, capsys)
    (section,) = data["fit"]
    _check_section(section, report)

    capsys.readouterr()
    assert main(["report", "--plain", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert f"needs {format_bytes(report.required)} of {format_bytes(report.capacity)} usable" in text
    for c in report.collectives:
        assert re.search(rf"\| {c.kind}\s+\|\s+{c.count:,} \|", text), text
    assert report.communication or which == "over"  # the refused step has no compiled collectives
    for b in report.communication:  # each kind beside the plan's bound, and how the bound is counted
        assert f"{b.kind} bound: {b.basis}" in " ".join(text.split()), text
        assert re.search(rf"\| {re.escape(b.kind)}\s+\|\s+{re.escape(format_bytes(b.compiled))} \|\s+"
                         rf"{re.escape(format_bytes(b.bound))} \|\s+"
                         + (f"{b.ratio:.2f}x" if b.bound else "none needed") + r" \|", text), text


def test_the_advisor_finds_a_step_that_does_not_fit(reports, tmp_path):
    """Inside a trace the answer joins the trace's run, at the line that asked; the finding
    gives the need and the capacity the fit answered, and the largest part."""
    from tpu_debug.fit import record_fit

    over, fits = reports["over"], reports["fsdp"]
    with tpu_debug.trace(logdir=tmp_path, name="asked") as session:
        record_fit(fits)
        line = inspect.currentframe().f_lineno + 1
        record_fit(over)
    run = tpu_debug.open_run(str(session.run_dir))
    events = run.events("fit")
    assert [e.fits for e in events] == [True, False]
    assert (events[1].location.file, events[1].location.line) == (__file__, line)
    (finding,) = [f for f in run.findings() if f.kind == "fit_oom"]
    assert finding.severity == "error"
    assert finding.evidence.count("needs per chip") == over.required
    assert finding.evidence.count("usable per chip") == over.capacity
    assert finding.evidence.count("short per chip") == over.required - over.capacity
    # the refused compile's "total memory required for HLO temporaries" is its whole buffer
    # assignment, the state included (the peak's buffers add up to it): the need is that figure,
    # not that plus the state again; the parameters and AdamW's two moments at two bytes each, on
    # the one chip, are the largest part of it
    state = over.parameters * 2 * 3
    assert over.at_least == () and over.error and "HLO temporaries" in over.error
    assert over.required == parse_compile_error(over.error).required_bytes
    assert state <= over.required
    if over.peak is not None:  # the compiler's assignment of the refused step, read from its dump
        assert over.peak.total_bytes == pytest.approx(over.required, rel=0.005)  # the message rounds to 10 MiB
    assert finding.evidence.count("largest part: parameters and AdamW state (at least, at bfloat16)") == state
    assert finding.cause == "state" and "more chips" in finding.fix and "not verified" in finding.fix
    assert finding.evidence.location.line == line


def test_the_tui_fit_view_shows_memory_and_collectives(reports, tmp_path):
    from rich.console import Console
    from tpu_debug.fit import record_fit
    from tpu_debug.tui.app import TpuDebugApp
    from tpu_debug.tui.format import format_bytes

    report = reports["fsdp"]
    session = tpu_debug.open_run(str(record_fit(report, logdir=tmp_path, name="tui")))
    app = TpuDebugApp(session)
    shown = {}

    async def scenario() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.pause()
            await pilot.press("9")
            for _ in range(100):
                await app.workers.wait_for_complete()
                await pilot.pause()
                table = app.screen.query_one("#fit-collectives")
                if table.row_count:
                    break
            console = Console(width=400, color_system=None, record=True, file=io.StringIO())
            console.print(app.screen.query_one("#fit-summary").content)
            shown["summary"] = console.export_text()
            shown["rows"] = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

    try:
        asyncio.run(scenario())
    finally:
        session.close()
    summary = shown["summary"]
    assert "FITS" in summary
    assert f"needs {format_bytes(report.required)} of {format_bytes(report.capacity)} usable" in summary
    m = report.memory
    assert f"parameters {format_bytes(m.parameters)}" in summary
    assert f"activations {format_bytes(m.activations)}" in summary
    assert [(r[0], r[1], r[2], r[3]) for r in shown["rows"]] == [
        (c.kind, f"{c.count:,}", format_bytes(c.bytes), format_bytes(c.wire_bytes)) for c in report.collectives]
    # each kind beside the plan's bound and the compiled bytes' multiple of it, as the answer computed them
    assert report.communication, "an FSDP step has bounds"
    for b in report.communication:
        ratio = f"{b.ratio:.2f}x the bound" if b.bound else "the plan needs none"
        assert (f"{b.kind}: {format_bytes(b.compiled)} compiled, bound {format_bytes(b.bound)}: {ratio} "
                f"({b.basis})") in " ".join(summary.split()), summary


def test_diff_shows_two_plans_side_by_side(reports, tmp_path, capsys):
    from tpu_debug.core.format import format_bytes
    from tpu_debug.fit import record_fit

    from tpu_debug.diff import diff_data

    a, b = reports["fsdp"], reports["dp"]
    dir_a, dir_b = record_fit(a, logdir=tmp_path, name="fsdp"), record_fit(b, logdir=tmp_path, name="dp")
    data = diff_data(tpu_debug.open_run(str(dir_a)), tpu_debug.open_run(str(dir_b)))
    for side, report in (("a", a), ("b", b)):
        fit = data["fit"][side]
        assert (fit["plan"], fit["required"], fit["capacity"], fit["headroom"], fit["step_seconds"], fit["mfu"]) == (
            str(report.plan), report.required, report.capacity, report.headroom, report.estimate.seconds,
            report.estimate.mfu)
        assert data["figures"]["fit_memory_per_chip"][side] == report.required
        assert data["figures"]["fit_step_seconds"][side] == report.estimate.seconds
        assert data["figures"]["fit_wire_bytes_per_chip"][side] == sum(c.wire_bytes for c in report.collectives)
    assert data["figures"]["fit_memory_per_chip"]["change"] == b.required - a.required

    capsys.readouterr()
    assert main(["diff", "--plain", str(dir_a), str(dir_b)]) == 0
    out = capsys.readouterr().out
    assert "Fit (A | B)" in out
    assert re.search(rf"\| plan\s+\|\s+{re.escape(str(a.plan))} \|\s+{re.escape(str(b.plan))} \|", out), out
    assert re.search(rf"\| HBM needed per chip\s+\|\s+{format_bytes(a.required)} \|\s+{format_bytes(b.required)} \|",
                     out), out


def test_a_fit_kept_before_bounds_were_still_opens_without_them(reports, tmp_path, capsys):
    """A run whose store has no ``fit_communication`` table (kept by a version without bounds)
    shows its answer with no bounds, not no answer."""
    import sqlite3

    from tpu_debug.fit import record_fit

    report = reports["fsdp"]
    run_dir = record_fit(report, logdir=tmp_path, name="old")
    with sqlite3.connect(run_dir / "run.db") as db:
        db.execute("DROP TABLE fit_communication")
    (event,) = tpu_debug.open_run(str(run_dir)).events("fit")
    assert (event.required_bytes, event.communication) == (report.required, ())
    assert len(event.collectives) == len(report.collectives)
    (section,) = _report_json(run_dir, capsys)["fit"]
    assert section["communication"] == [] and section["per_chip"]["required"] == report.required
