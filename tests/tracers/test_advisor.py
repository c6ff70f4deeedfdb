"""The advisor: its rule registry, ranking, error isolation, and recompile findings whose fix fits
the cause (a rank or a dtype cannot be padded). Each rule is also run on its pitfall example and
that example's fixed variant in tests/examples/test_advisor_examples.py."""

from __future__ import annotations

import pytest
import torch

import tpu_debug
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers import advisor
from tpu_debug.tracers.advisor import Advice, Finding, advise, lookup, rank, rule


def _finding(kind="recompile", severity="warning", cost=1.0, subject="s") -> Finding:
    return Finding(kind=kind, severity=severity, title="t", fix="f", cost_seconds=cost, subject=subject)


def test_findings_rank_errors_first_then_by_the_time_they_cost():
    cheap, dear = _finding(cost=0.5, subject="a"), _finding(cost=9.0, subject="b")
    wrong = _finding("divergence", "error", cost=0.0)
    assert rank([cheap, wrong, dear]) == [wrong, dear, cheap]


def test_a_finding_has_a_known_severity():
    with pytest.raises(ValueError, match="severity 'bad'"):
        _finding(severity="bad")


def test_a_rule_kind_is_registered_once_and_looked_up_by_kind():
    assert lookup("recompile").kind == "recompile"
    with pytest.raises(ValueError, match="no advisor rule 'nope'"):
        lookup("nope")
    with pytest.raises(ValueError, match="registered twice"):
        rule("recompile", about="again")(lambda facts: ())


def test_a_failing_rule_is_reported_and_the_others_still_run(monkeypatch, tmp_path):
    def broken(facts):
        raise RuntimeError("boom")
        yield  # a generator, like the real rules

    def found(facts):
        yield _finding("found", cost=2.0)

    monkeypatch.setitem(advisor.RULES, "broken", advisor.Rule("broken", "fails", broken))
    monkeypatch.setitem(advisor.RULES, "found", advisor.Rule("found", "finds", found))
    with tpu_debug.trace(logdir=tmp_path, name="empty") as session:
        pass
    advice = advise(session, kinds=["broken", "found"])
    assert isinstance(advice, Advice)
    assert [f.kind for f in advice.findings] == ["found"]
    assert advice.errors == ("advisor rule 'broken' failed: RuntimeError: boom",)


def _steps_each_recompiling(tmp_path, make) -> list[Finding]:
    """Six explicit steps, each running one op on the tensor ``make(step)``."""
    clear_cache()
    inputs = [make(i) for i in range(6)]
    with tpu_debug.trace(logdir=tmp_path, name="steps", hlo=False) as session:
        for x in inputs:
            (x * 2).sum()
            tpu_debug.step()
    assert [s.compiles > 0 for s in session.steps()] == [True] * 6
    return session.findings()


def test_a_rank_that_changes_every_step_is_a_recompile_padding_cannot_fix(tmp_path):
    findings = _steps_each_recompiling(tmp_path, lambda i: torch.ones((2,) * (i + 1)).to("tpu"))
    (finding,) = findings
    assert (finding.kind, finding.cause) == ("recompile", "rank")
    assert finding.title.startswith("the rank of arg 0 'self' changes between steps")
    assert "padding cannot change a rank" in finding.fix and "multiple of" not in finding.fix
    assert finding.evidence.location.file == __file__
    # the first step warms up; the other five each compile again
    assert finding.steps == (1, 5) and finding.evidence.count("steady steps with recompiles") == 5


def test_a_dtype_that_changes_every_step_is_a_recompile_fixed_by_a_cast(tmp_path):
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16, torch.int8]
    findings = _steps_each_recompiling(tmp_path, lambda i: torch.ones(4, dtype=dtypes[i]).to("tpu"))
    (finding,) = findings
    assert (finding.kind, finding.cause) == ("recompile", "dtype")
    assert finding.fix.startswith("cast arg 0 'self' once where it is made")
    assert "padding or bucketing cannot fix a dtype" in finding.fix


def test_one_op_compiled_for_several_shapes_while_warming_up_is_no_finding(tmp_path):
    # the mlp_train pattern: the same op on parameters of different shapes in the first step,
    # then the same programs every step
    clear_cache()
    shapes = [(2,), (2, 3), (4, 3, 2)]
    inputs = [torch.ones(s).to("tpu") for s in shapes]
    with tpu_debug.trace(logdir=tmp_path, name="warmup", hlo=False) as session:
        for _ in range(5):
            for x in inputs:
                torch.zeros_like(x)
            tpu_debug.step()
    groups = {g.identity: g for g in session.recompile_groups()}
    assert groups["zeros_like"].recompiles == 2
    assert session.findings() == []
