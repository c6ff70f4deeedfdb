"""``tpu-debug report --json``: the report as data under the documented schema tpu_debug.report/1."""

from __future__ import annotations

import json
import math
import pathlib
import re

import torch

import tpu_debug
from tpu_debug.cli import main
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers.advisor import Count, Evidence, Finding

SCHEMA_DOC = pathlib.Path(__file__).parents[2] / "docs" / "report_schema.md"


def _documented() -> set[str]:
    """Every name the schema document writes as code (`name`)."""
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", SCHEMA_DOC.read_text()))


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


def _report_json(run_dir, capsys) -> dict:
    capsys.readouterr()
    assert main(["report", "--json", run_dir]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_json_has_the_schema_steps_and_the_advisors_findings(logdir, capsys):
    run_dir = _record(logdir, sync=True)
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
    assert steps["compiles"]["steady"] == {"compiles": 0, "recompiles": 0, "seconds": 0.0}
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


def test_every_field_of_the_report_is_documented(logdir, capsys):
    data = _report_json(_record(logdir, sync=True), capsys)
    documented = _documented()
    missing = set(data) - documented
    missing |= {f"run.{k}" for k in data["run"] if k not in documented}
    missing |= {f"steps.{k}" for k in data["steps"] if k not in documented}
    missing |= {f"per_step.{k}" for k in data["steps"]["per_step"][0] if k not in documented}
    missing |= {f"findings.{k}" for k in data["findings"][0] if k not in documented}
    missing |= {f"ops.{k}" for k in data["ops"][0] if k not in documented}
    missing |= {f"compiles.{k}" for k in data["compiles"] if k not in documented}
    missing |= {f"transfers.{k}" for k in data["transfers"] if k not in documented}
    missing |= {f"transfers.sites.{k}" for k in data["transfers"]["sites"][0] if k not in documented}
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
