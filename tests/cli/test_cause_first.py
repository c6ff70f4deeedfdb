"""One cause, one finding, shown cause first wherever findings are shown: the text report, the
JSON report, ``diff`` (text and JSON) and the TUI's findings list.

The run: a compiled function called with a batch that grows at every step, which recompiles it
until dynamo's recompile limit stops compiling it, and then recompiles its ops eagerly. That is
one cause (the size of its input ``x``) reaching three kinds of event; every view shows one
finding at the line that calls the function, with the limit it hit and the eager ops it
recompiled under it as what it led to, and no finding of their own.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo
from tpu_debug.runtime import clear_cache

import tpu_debug
from tpu_debug.cli import main

STEPS = 6
LIMIT = 2  # dynamo's recompile limit for the run: reached at the third size, in few compiles


def _record(logdir, *, grow: bool, name: str) -> str:
    clear_cache()
    torch._dynamo.reset()
    w = torch.ones(4, device="tpu")

    def scaled_sum(x):
        return (x * w).sum()

    compiled = torch.compile(scaled_sum, backend="tpu_debug", dynamic=False)
    data = torch.ones(STEPS, 8, 4)
    with torch._dynamo.config.patch(recompile_limit=LIMIT), tpu_debug.trace(logdir=logdir, name=name) as session:
        for step in range(STEPS):
            x = torch.ones(8 * (step + 1), 4).to("tpu") if grow else data[step].to("tpu")
            total = compiled(x)  # the line the finding is at
            tpu_debug.step()
        assert float(total.cpu()) == 4.0 * x.shape[0]  # ones times ones: one per element of x
    return str(session.run_dir)


CALL_LINE = _record.__code__.co_firstlineno + 13


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("runs")
    return _record(logdir, grow=True, name="grows"), _record(logdir, grow=False, name="fixed")


def _out(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _serious(findings):
    return [f for f in findings if f["severity"] in ("warning", "error")]


def test_json_report_has_one_finding_with_its_consequences(runs, capsys):
    data = json.loads(_out(capsys, "report", "--json", runs[0]))
    (finding,) = _serious(data["findings"])
    assert finding["kind"] == "dynamic_shape" and finding["severity"] == "error"
    assert finding["evidence"]["location"]["line"] == CALL_LINE
    assert finding["title"].startswith("dim 0 of input 'x' of scaled_sum")
    kinds = [c["kind"] for c in finding["consequences"]]
    assert "recompile_limit" in kinds and "dynamic_shape" in kinds  # the limit, the eager ops after it
    limit = next(c for c in finding["consequences"] if c["kind"] == "recompile_limit")
    assert f"hit dynamo's recompile_limit ({LIMIT})" in limit["text"]
    assert limit["location"]["line"] == CALL_LINE
    # no graph node, AOTAutograd or dynamo wrapper name where the user's names are
    for text in [finding["title"], finding["fix"], *(c["text"] for c in finding["consequences"])]:
        for internal in ("external_utils", "_call_impl", "inner", "L['x']", "tangents", "arg0_1"):
            assert internal not in text, (internal, text)


def test_text_report_shows_the_cause_then_what_it_led_to(runs, capsys):
    text = _out(capsys, "report", "--plain", "--width", "400", runs[0])
    findings = text.split("\nFindings\n", 1)[1].split("\n\n", 1)[0].splitlines()
    heads = [line for line in findings if line.startswith(("ERROR ", "WARN ", "INFO "))]
    assert len(heads) == 1 and heads[0].startswith("ERROR dim 0 of input 'x' of scaled_sum"), heads
    led = [i for i, line in enumerate(findings) if line.startswith("  led to: ")]
    fix = next(i for i, line in enumerate(findings) if line.startswith("  fix: "))
    assert len(led) >= 2 and all(0 < i < fix for i in led)
    assert any("recompile_limit" in findings[i] for i in led)


def test_diff_shows_the_fixed_cause_with_its_consequences(runs, capsys):
    text = _out(capsys, "diff", "--plain", "--width", "400", *runs)
    fixed = text.split("Findings fixed (", 1)[1].split("Findings introduced", 1)[0]
    assert fixed.startswith("1)") and "ERROR dim 0 of input 'x' of scaled_sum" in fixed
    assert "  led to: " in fixed and "recompile_limit" in fixed
    data = json.loads(_out(capsys, "diff", "--json", *runs))
    (gone,) = [f for f in data["findings"]["fixed"] if f["severity"] != "info"]
    assert gone["kind"] == "dynamic_shape"
    assert "recompile_limit" not in {f["kind"] for f in data["findings"]["fixed"]}


def test_tui_lists_the_cause_and_details_its_consequences(runs):
    from tpu_debug.tui.screens.overview import finding_lines

    session = tpu_debug.open_run(runs[0])
    try:
        lines = [line for line in finding_lines(session, None) if line.severity in ("warning", "error")]
    finally:
        session.close()
    (line,) = lines
    assert str(line.text).startswith("dim 0 of input 'x' of scaled_sum")
    assert "consequences)" in str(line.text)
    detail = str(line.detail)
    assert "led to: " in detail and "recompile_limit" in detail
