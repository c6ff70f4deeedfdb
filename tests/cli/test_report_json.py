"""``tpu-debug report --json``: the report as data under the documented schema tpu_debug.report/1.

Every report section is in it, docs/report_schema.md describes every field at every depth,
a multi-process run gives its ranks' data, and plain text keeps every cell's text whatever
the width. Besides a recorded run, the tests read runs written with the run store's writer
(the TUI's synthetic run, plus the records of the tracers that need a TPU target, several
devices or lazy mode), so every figure they expect is one they wrote.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import re

import pytest
import torch
from tpu_debug.runtime import clear_cache
from tpu_debug.core.records import InvalidValueInfo
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.advisor import Count, Evidence, Finding

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.core.collectives import Collective
from tpu_debug.ranks import new_group
from tpu_debug.report import SECTIONS

TESTS = pathlib.Path(__file__).resolve().parents[1]
SCHEMA_DOC = TESTS.parent / "docs" / "report_schema.md"
_spec = importlib.util.spec_from_file_location("synthetic_run", TESTS / "tui" / "synthetic_run.py")
synthetic_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic_run)

GiB = 1 << 30
# fields whose keys are data (a mode, an opcode, an option's name), not names of the schema
MAPS = {"options", "by_mode", "by_opcode", "tolerances"}


def _documented() -> set[str]:
    """The names the schema document writes as code: `name`, and each name of `{a, b, c}`."""
    text = SCHEMA_DOC.read_text()
    names = set(re.findall(r"`([A-Za-z_]\w*)`", text))
    for span in re.findall(r"`\{([\w,\s]+)\}`", text):
        names |= set(re.findall(r"\w+", span))
    return names


def _undocumented(data, documented: set[str], path: str = "") -> set[str]:
    """Every key, at any depth, that the schema document does not write as code."""
    missing: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else key
            if key not in documented:
                missing.add(where)
            if key not in MAPS:
                missing |= _undocumented(value, documented, where)
    elif isinstance(data, list):
        for item in data:
            missing |= _undocumented(item, documented, path)
    return missing


def _record(logdir, *, sync: bool) -> str:
    clear_cache()
    x = torch.arange(8, dtype=torch.float32, device="tpu")
    with tpu_debug.trace(logdir=logdir, name="loop") as session:
        total = torch.zeros((), device="tpu")
        for _ in range(6):
            loss = (x * 2.0).sum()
            if sync:
                total += loss.item()  # a sync in every step
            else:
                total = total + loss
            tpu_debug.step()
        result = float(total.cpu())
    assert result == 6 * 56.0  # sum(2 * arange(8)) per step, exact in float32
    return str(session.run_dir)


@pytest.fixture(scope="module")
def synced_run(tmp_path_factory) -> str:
    """The loop recorded with an ``.item()`` in every step (read-only: the tests that read it share it)."""
    return _record(tmp_path_factory.mktemp("synced") / "runs", sync=True)


def _report_json(run_dir, capsys) -> dict:
    capsys.readouterr()
    assert main(["report", "--json", run_dir]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.quick
def test_report_json_has_the_schema_steps_and_the_advisors_findings(synced_run, capsys):
    run_dir = synced_run
    data = _report_json(run_dir, capsys)
    assert data["schema"] == "tpu_debug.report/1"
    assert data["findings_schema"] == "tpu_debug.findings/1"
    assert data["run"]["name"] == "loop" and data["run"]["status"] == "finished"
    assert data["run"]["modes"] == ["eager"]

    steps = data["steps"]
    assert (steps["count"], steps["detected"]) == (6, "explicit")
    assert [s["index"] for s in steps["per_step"]] == list(range(6))
    assert all(s["detected"] == "explicit" for s in steps["per_step"])
    # the first step compiles the loop's programs; once the sequence of programs repeats,
    # nothing compiles: every compile of the run is in the warm-up
    assert steps["per_step"][0]["phase"] == "warm-up" and steps["per_step"][0]["compiles"] > 0
    assert steps["per_step"][-1]["phase"] == "steady"
    assert steps["steady"] == sum(s["phase"] == "steady" for s in steps["per_step"]) >= 3
    assert steps["compiles"]["steady"] == {"compiles": 0, "recompiles": 0, "seconds": 0.0, "read_backs": 0,
                                         "read_back_seconds": 0.0}
    assert all(s["compiles"] == 0 for s in steps["per_step"] if s["phase"] == "steady")
    # every step ran the same three ops (mul, sum, the add into the total); the first step
    # begins with the trace, so it also holds the zeros made before the loop
    assert [s["eager_ops"] for s in steps["per_step"]] == [4, 3, 3, 3, 3, 3]
    assert all(s["end"] >= s["start"] for s in steps["per_step"])

    (finding,) = data["findings"]
    assert (finding["kind"], finding["cause"], finding["severity"]) == ("implicit_sync", "item", "warning")
    assert finding["evidence"]["location"]["file"] == __file__
    # the JSON form reads back to the finding the session's advisor makes
    (made,) = tpu_debug.open_run(run_dir).findings()
    assert Finding.from_dict(finding) == made

    sync_sites = [s for s in data["transfers"]["sites"] if s["implicit"]]
    assert [(s["cause"], s["count"]) for s in sync_sites] == [("item", 6)]
    assert data["divergence"] is None
    assert {o["name"] for o in data["ops"]} >= {"mul.Tensor", "sum"}


def test_a_run_without_a_problem_has_no_findings(logdir, capsys):
    data = _report_json(_record(logdir, sync=False), capsys)
    assert data["findings"] == [] and data["advisor_errors"] == []
    assert data["steps"]["count"] == 6


def test_every_field_of_the_report_is_documented(synced_run, capsys):
    data = _report_json(synced_run, capsys)
    missing = _undocumented(data, _documented())
    assert not missing, f"docs/report_schema.md does not describe {sorted(missing)}"


def test_a_finding_reads_back_ignoring_fields_it_does_not_know():
    finding = Finding(
        kind="recompile",
        severity="warning",
        title="t",
        fix="f",
        cost_seconds=1.5,
        evidence=Evidence(None, (Count("compile time", 1.5, "s"), Count("ratio", math.inf)), ("a fact",)),
        steps=(2, 9),
        cause="dtype",
        subject="mul.Tensor dtype",
        targets=("mul.Tensor",),
    )
    data = json.loads(json.dumps(finding.to_dict()))  # JSON has no infinity: it is written as null
    assert data["evidence"]["counts"][1] == {"name": "ratio", "value": None, "unit": ""}
    data["added_in_a_later_version"] = {"x": 1}
    back = Finding.from_dict(data)
    assert back.evidence.counts[0] == Count("compile time", 1.5, "s")
    assert math.isnan(back.evidence.count("ratio"))
    assert (back.kind, back.steps, back.cause, back.subject, back.targets) == (
        "recompile", (2, 9), "dtype", "mul.Tensor dtype", ("mul.Tensor",)
    )
    del data["fix"]
    try:
        Finding.from_dict(data)
    except ValueError as exc:
        assert "not a finding" in str(exc)
    else:
        raise AssertionError("a finding without a fix was read")


CUT_FUNCTION = "a_function_with_a_rather_long_name_that_reads_the_loss"
HOLDER = ev.MemoryHolder(str(synthetic_run.SOURCE), 11, "main", "forward", 3 * GiB, 4, (64, 1024, 1024), "float32")
FIX = ev.MemoryFix("bfloat16", 9 * GiB, 0.5, True)


def _put(writer, cls, **fields):
    writer.put(cls(id=writer.new_id(), ts=fields.pop("ts", 8.5), mode=fields.pop("mode", None), thread=1,
                   location=fields.pop("location", None), **fields))


def _loc(line: int, function: str = "main") -> ev.SourceLocation:
    return ev.SourceLocation(str(synthetic_run.SOURCE), line, function)


def _collective(line: int) -> Collective:
    return Collective("all-reduce", "all-reduce.1", "f32[8,128]", 4096, 6144, 4, 1, "{{0,1,2,3}}", "", "", "aten::mm",
                      file=str(synthetic_run.SOURCE), line=line, function="main")


def _write_tracer_records(writer) -> None:
    """Memory, TPU target, collectives and lazy graphs records, and a TensorBoard summary."""
    for step, peak in enumerate((10 * GiB, 12 * GiB)):
        _put(writer, ev.MemoryStepEvent, step=step, live_bytes=8 * GiB, peak_bytes=peak, peak_ts=step + 0.5,
             tensors=9, holders=(HOLDER,) if step else ())
    _put(writer, ev.MemorySummaryEvent, peak_bytes=12 * GiB, peak_step=1, end_bytes=8 * GiB, steps=2,
         persistent_bytes=8 * GiB, activation_bytes=3 * GiB, float32_bytes=12 * GiB, temp_bytes=GiB,
         required_bytes=13 * GiB, dry_run=False, programs=0, oom_programs=0, temp_program="g3/forward",
         temp_source="target", target="v5e", capacity_bytes=16 * GiB, fits=True, holders=(HOLDER,))
    _put(writer, ev.MemoryFindingEvent, finding="does_not_fit", target="v5e", required_bytes=20 * GiB,
         capacity_bytes=16 * GiB, holders=(HOLDER,), fixes=(FIX,))
    _put(writer, ev.TargetSummaryEvent, target="v5e", topology="1x1", chips=1, hbm_bytes=16 * GiB,
         peak_flops=197e12, hbm_bandwidth=819e9, libtpu="0.0.1", programs=2, compiled=2, cached=0, refused=1,
         failed=0, unfinished=0, compile_seconds=0.5, waited_seconds=0.0, wait_limit=60.0)
    common = {"target": "v5e", "args": (), "seconds": 0.25, "location": _loc(11)}
    _put(writer, ev.TargetCompileEvent, name="mul.Tensor", signature="mul.Tensor(float32[8,128], other=2.0)",
         status="ok", argument_bytes=4096, output_bytes=4096, alias_bytes=0, temp_bytes=512, code_bytes=1024, flops=1024.0,
         bytes_accessed=8192.0, intensity=0.125, bound="memory", estimated_seconds=1e-8, **common)
    _put(writer, ev.TargetCompileEvent, name="g3/forward", signature="g3/forward(float32[10,128])",
         status="hbm_oom", required_bytes=20 * GiB, available_bytes=16 * GiB, **common)
    _put(writer, ev.TargetStepEvent, target="v5e", step=1, executions=3, estimated=3, estimated_seconds=2e-8,
         flops=2048.0, bytes_accessed=16384.0, mfu=0.01)
    for target, line in (("", 21), ("v5e", 21)):
        _put(writer, ev.CollectivesEvent, name="g3/forward", program=None, devices=4, target=target,
             collectives=(_collective(line),), argument_bytes=4096, output_bytes=4096, temp_bytes=0)
    for step, trigger in enumerate(("read", "optimizer_step", "optimizer_step")):
        _put(writer, ev.MaterializationEvent, mode="eager", location=_loc(48, CUT_FUNCTION), trigger=trigger,
             graph=f"lazy{step}", ops=20, outputs=1, inputs=2, compiled=step == 0, seconds=0.01, step=1)
    _put(writer, ev.CompileEvent, mode="eager", location=_loc(30), name="sum", signature="sum(float64[8])",
         args=(ev.ArgInfo("self", (8,), "float64"),), seconds=0.01, program=None, previous=None, diffs=())
    _put(writer, ev.InvalidValueEvent, mode="lazy", location=_loc(44), check=InvalidValueInfo(
        "gather", "index", 7.0, 0.0, 3.0, "index 7 is out of bounds for dimension 1 with size 3", "RuntimeError",
        "clamped", "lazy", False))
    writer.put(synthetic_run.peak_program(writer.new_id()))
    _put(writer, ev.TensorBoardSummaryEvent, status="finished", profile=("plugins/profile/run.xplane.pb",),
         spans=40, max_events=1000, steps=8, capped=False, notes=("a note",))
    _put(writer, ev.FitEvent, model="LlamaConfig", target="v5e-8", chips=8, device_kind="TPU v5 lite", plan="fsdp=8",
         job="train", batch=8, seq=32, parameters=106816, fits=True, capacity_bytes=16 * GiB,
         capacity_source="compiler", required_bytes=4 << 20, seconds=2.5, compile_seconds=2.0, total_bytes=4 << 20,
         parameter_bytes=26704, activation_bytes=0, step_seconds=3e-5, compute_seconds=1e-6, memory_seconds=2e-5,
         comm_seconds=8e-6, overlapped_seconds=2e-5, tokens_per_second=9e6, model_flops=1.5e8, mfu=0.003,
         mfu_overlapped=0.005, collectives=(ev.FitCollective("all-gather", 109, 1044480, 913920, 4.6e-6),),
         location=_loc(60))


@pytest.fixture(scope="module")
def every_section_run(tmp_path_factory) -> pathlib.Path:
    run_dir = tmp_path_factory.mktemp("report-sections") / "20260131T120000.000Z-synthetic"
    _db, writer = synthetic_run.write_synthetic_run(run_dir, close=False)
    _write_tracer_records(writer)
    writer.close(synthetic_run.FINAL)
    assert writer.error is None, writer.error
    return run_dir


def _text(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["report", "--plain", *args]) == 0
    return capsys.readouterr().out


def test_every_section_is_in_the_json_and_the_text_shows_the_same(every_section_run, capsys):
    data = _report_json(str(every_section_run), capsys)
    for sec in SECTIONS:
        # a healthy run has no damaged rows: test_one_damaged_row_costs_that_row_not_the_report fills it
        if sec.key is not None and sec.key != "damaged_rows":
            assert data[sec.key] is not None and data[sec.key] != [], sec.title
    text = _text(capsys, str(every_section_run))
    headings = {line for line in text.splitlines()}
    assert {"Memory", "TPU target (v5e)", "Collectives", "Lazy graphs", "TensorBoard", "Invalid values"} <= headings

    memory = data["memory"]
    assert (memory["summary"]["peak_bytes"], memory["summary"]["fits"]) == (12 * GiB, True)
    assert memory["steps"] == [{"step": 0, "peak_bytes": 10 * GiB}, {"step": 1, "peak_bytes": 12 * GiB}]
    assert memory["holders"][0]["shape"] == [64, 1024, 1024]
    (fix,) = memory["findings"][0]["fixes"]
    assert (fix["remedy"], fix["estimate_bytes"], fix["fits"]) == ("bfloat16", 9 * GiB, True)

    target = data["target"]
    assert target["target"] == "v5e" and target["summary"]["refused"] == 1
    # a refused program comes first, whatever its estimate
    assert [(p["name"], p["ok"]) for p in target["programs"]] == [("g3/forward", False), ("mul.Tensor", True)]
    # arguments + outputs - aliased + temporaries + code
    assert target["programs"][1]["memory_bytes"] == 4096 + 4096 - 0 + 512 + 1024
    assert target["step"]["median_seconds"] == 2e-8

    collectives = data["collectives"]
    # this test's all-reduce (6144 bytes sent) plus the synthetic run's step graph: an all-reduce
    # (768) and an all-gather (75497472), see tests/tui/synthetic_run.py
    assert collectives["local"]["by_opcode"] == {
        "all-reduce": {"count": 2, "bytes": 6144 + 768}, "all-gather": {"count": 1, "bytes": 75497472}
    }
    assert [t["target"] for t in collectives["targets"]] == ["v5e"]
    programs = {p["name"]: p for p in collectives["local"]["programs"]}
    assert programs["g3/forward"]["collectives"][0]["line"] == 21

    lazy = data["lazy_graphs"]
    assert (lazy["graphs"], lazy["compiles"], lazy["steps"]) == (3, 1, 2)
    (cut,) = [c for c in lazy["cuts"] if c["trigger"] == "read"]
    assert cut["location"] == {"file": str(synthetic_run.SOURCE), "line": 48, "function": CUT_FUNCTION}

    assert data["tensorboard"]["spans"] == 40 and data["tensorboard"]["profile"] == ["plugins/profile/run.xplane.pb"]
    assert data["fallbacks"][0]["name"] == "nonzero"
    (invalid,) = data["invalid_values"]
    assert (invalid["op"], invalid["value"], invalid["high"], invalid["count"]) == ("gather", 7.0, 3.0, 1)
    assert "gather index 7 out of range [0, 3)" in text
    assert data["recompiles"]["graph_breaks"][0]["reason"] == "call to Tensor.item() inside the compiled region"
    assert data["divergence"]["first"]["name"] == "add.Tensor"

    (peak,) = data["peak_buffers"]
    assert (peak["name"], peak["status"], peak["total_bytes"]) == ("g3/forward", "hbm_oom", 20 * GiB)
    assert sum(b["nbytes"] for b in peak["buffers"]) == peak["total_bytes"] == sum(peak["by_kind"].values())
    assert peak["buffers"][0]["where"] == "train.py:12" and peak["buffers"][0]["kind"] == "activation"
    assert "Peak buffers" in headings


def test_every_field_of_every_section_is_documented(every_section_run, capsys):
    data = _report_json(str(every_section_run), capsys)
    missing = _undocumented(data, _documented())
    assert not missing, f"docs/report_schema.md does not describe {sorted(missing)}"


def _rank_group(tmp_path: pathlib.Path) -> pathlib.Path:
    group = new_group(tmp_path / "runs", "pair", 2, ["train.py"])
    for rank in range(2):
        _db, writer = synthetic_run.write_synthetic_run(group.path / f"20260131T120000.000Z-rank{rank}", close=False,
                                                        collectives=False)
        _put(writer, ev.ProcessEvent, rank=rank, world_size=2, devices=4, local_devices=2, coordinator=None)
        _put(writer, ev.CollectivesEvent, name="g3/forward", program=None, devices=4, target="",
             collectives=(_collective(21),))
        writer.close(synthetic_run.FINAL)
        assert writer.error is None, writer.error
    group.write(status="finished", exit_status=[0, 0])
    group.close()
    return group.path


def test_a_multi_process_run_gives_each_ranks_report_as_json(tmp_path, capsys):
    path = _rank_group(tmp_path)
    data = _report_json(str(path), capsys)
    assert (data["schema"], data["nproc"], data["status"], data["missing"]) == ("tpu_debug.ranks/1", 2, "finished", [])
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["agreement"] == {"stopped": [], "difference": None, "compiled_difference": None, "same_programs": 1,
                                 "failed": []}
    for r in data["ranks"]:
        assert r["report"]["schema"] == "tpu_debug.report/1"
        assert r["report"]["collectives"]["local"]["programs"][0]["name"] == "g3/forward"
        # the synthetic run's graph compiled for lengths 8, 9 and 10: its third program (g3/forward)
        # ran in the six steps of length 10 and up, each run sending the all-reduce's 6144 bytes
        assert r["figures"]["multi_device_programs"] == 1 and r["figures"]["sent_bytes"] == 6144 * 6
    assert not _undocumented(data, _documented())
    text = _text(capsys, str(path))
    assert "every rank compiled the same 1 multi-device program(s)" in text


def _columns(text: str) -> list[str]:
    """The cells of every plain-text table, column by column, each column's lines joined
    without spaces (a wrapped cell reads whole again)."""
    out: list[str] = []
    table: list[list[str]] = []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
        elif not line.startswith("+") and table:
            out += ["".join(row[i] for row in table if i < len(row)).replace(" ", "") for i in range(len(table[0]))]
            table = []
    return out


@pytest.mark.parametrize("width", [60, 100])
def test_plain_text_keeps_every_cell_whole_at_any_width(every_section_run, capsys, width):
    capsys.readouterr()
    assert main(["report", "--plain", "--width", str(width), str(every_section_run)]) == 0
    text = capsys.readouterr().out
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    columns = "\n".join(_columns(text))
    expected = [
        f"train.py:48in{CUT_FUNCTION}",  # the lazy graph cut's line and function
        "train.py:11",  # a recompile's "at"
        "mul.Tensor(float32[16,128],other=2.0)",  # a program's signature
        "dim0ofarg0'self'(grows):8,9,10,11,12,16",  # what changed between the recompiles
        "mul(aten.mul.default,g3/forward)",  # a divergence site
    ]
    for cell in expected:
        assert cell in columns, cell


def test_plain_text_takes_its_width_from_columns(every_section_run, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    text = _text(capsys, str(every_section_run))
    assert max(len(line) for line in text.splitlines()) <= 72
    monkeypatch.delenv("COLUMNS")
    text = _text(capsys, str(every_section_run))
    # the wide default: the longest lines (the notes) are longer than a terminal's 80
    assert 80 < max(len(line) for line in text.splitlines()) <= 160


def test_a_width_below_twenty_is_refused(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["report", "--width", "5"])
    assert "no line width" in capsys.readouterr().err


def test_a_recorded_runs_plain_report_keeps_its_source_lines_whole(synced_run, capsys):
    run_dir = synced_run
    capsys.readouterr()
    assert main(["report", "--plain", "--width", "60", run_dir]) == 0
    text = capsys.readouterr().out
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 60
    # the Transfers table's "where": the line of the loop's .item(), with its function
    source = pathlib.Path(__file__).read_text().splitlines()
    line = 1 + next(i for i, src in enumerate(source) if src.endswith("# a sync in every step"))
    assert f"test_report_json.py:{line}in_record" in "\n".join(_columns(text))


@pytest.mark.parametrize("width", [60, 72, 80])
def test_report_at_80_columns_drops_no_column_of_the_steps_table(every_section_run, capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    text = _text(capsys, str(every_section_run))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    # every table row keeps its right border: no column was cropped
    assert all(line.endswith(("|", "+")) for line in lines if line.startswith(("|", "+")))
    steps = text[text.index("\nSteps\n"):text.index("\nTop ops by time\n")]
    for header in ("step", "phase", "time", "dispatch", "compiles", "transfers", "bytes"):
        assert re.search(rf"\| +{header} +\|", steps) or header in steps, header
    cells = "\n".join(_columns(steps))
    # step 0's split: its compiles a third of its second, its batch's wait a quarter
    for cell in ("warm-up", "compile33%", "input25%", "8.00KiB", "11.00KiB"):
        assert cell in cells, cell


@pytest.mark.parametrize("width", [60, 80])
def test_a_location_is_never_split_across_lines(every_section_run, capsys, width):
    text = _text(capsys, "--width", str(width), str(every_section_run))
    for line in text.splitlines():
        for cell in line.strip("|").split("|"):
            # a cell that ends a line inside a location: "train.py" here, ":48" on the next
            assert not re.search(r"\.py$|^:\d", cell.strip()), line


def test_one_damaged_row_costs_that_row_not_the_report(every_section_run, tmp_path, capsys):
    import shutil
    import sqlite3

    run_dir = tmp_path / every_section_run.name
    shutil.copytree(every_section_run, run_dir)
    with sqlite3.connect(run_dir / "run.db") as db:
        (event_id,) = db.execute("SELECT min(event_id) FROM compiles").fetchone()
        db.execute("UPDATE compiles SET args = '{broken' WHERE event_id = ?", (event_id,))
    db.close()
    text = _text(capsys, "--width", "100", str(run_dir))
    assert "not a readable tpu_debug run" not in text
    for heading in ("Steps", "Findings", "Recompiles", "Memory", "TPU target (v5e)", "Damaged rows"):
        assert heading in text.splitlines(), heading
    assert re.search(rf"\| compiles +\| +{event_id} \| compile +\| JSONDecodeError", text)
    data = _report_json(str(run_dir), capsys)
    (damaged,) = data["damaged_rows"]
    assert (damaged["kind"], damaged["table"], damaged["event_id"]) == ("compile", "compiles", event_id)
    assert data["compiles"] and data["steps"]["per_step"]
    assert not _undocumented(data, _documented())


def test_each_steps_split_adds_up_and_its_mfu_is_the_targets_estimate(every_section_run, capsys):
    data = _report_json(str(every_section_run), capsys)["steps"]
    session = tpu_debug.open_run(every_section_run)
    targets = {e.step: e.mfu for e in session.events("target_step") if not e.unfinished}
    assert targets and data["per_step"]
    for s in data["per_step"]:
        assert sum(s["split"].values()) == pytest.approx(s["seconds"])
        assert s["mfu"] == targets.get(s["index"])
        assert s["mfu_measured"] is None  # the run's platform is XLA CPU: no measured MFU
    assert data["verdict"]["part"] in data["split"]["parts"]
    g = data["goodput"]
    assert g["goodput_seconds"] + sum(b["seconds"] for b in g["badput"]) == pytest.approx(g["total_seconds"])
