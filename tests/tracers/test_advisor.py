"""The advisor: its rule registry, ranking, error isolation, and recompile findings whose fix fits
the cause (a rank or a dtype cannot be padded). Each rule is also run on its pitfall example and
that example's fixed variant in tests/examples/test_advisor_examples.py."""

from __future__ import annotations

import pytest
import torch
from tpu_debug.runtime import clear_cache
from tpu_debug.tracers import advisor
from tpu_debug.tracers import events as ev
from tpu_debug.tracers.advisor import Advice, Finding, advise, lookup, rank, rule

import tpu_debug


def _finding(kind="recompile", severity="warning", cost=1.0, subject="s") -> Finding:
    return Finding(kind=kind, severity=severity, title="t", fix="f", cost_seconds=cost, subject=subject)


@pytest.mark.quick
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


@pytest.mark.quick
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
    groups = {g.identity: g for g in session.recompiles.groups()}
    assert groups["zeros_like"].recompiles == 2
    assert session.findings() == []


# -- fitting a TPU: rules over the memory tracer's evidence -------------------------------------

GiB = 1024**3
_HOLDERS = (
    ev.MemoryHolder("", 0, "", "before trace", 2 * GiB, 1),
    ev.MemoryHolder("/src/train.py", 12, "main", "forward", 9 * GiB, 3, (1024, 2359296), "float32"),
)


class _Run:
    """A run as the fit rules read it: its memory events, by kind."""

    def __init__(self, *events) -> None:
        self._events = events

    def events(self, kind=None, **_):
        return [e for e in self._events if kind is None or e.kind == kind]


def _summary(persistent: int, required: int) -> ev.MemorySummaryEvent:
    return ev.MemorySummaryEvent(
        2, 4.0, None, 1, None, peak_bytes=required, peak_step=2, end_bytes=persistent, steps=4,
        persistent_bytes=persistent, activation_bytes=required - persistent, float32_bytes=required, temp_bytes=0,
        required_bytes=required, dry_run=False, programs=0, oom_programs=0, target="v5e",
        capacity_bytes=16 * GiB, fits=required <= 16 * GiB, holders=_HOLDERS)


def _record(finding: str, required: int, fixes=(), program=None) -> ev.MemoryFindingEvent:
    return ev.MemoryFindingEvent(3, 4.0, None, 1, None, finding, "v5e", required, 16 * GiB, program, _HOLDERS, fixes)


def _fit(run: _Run, kind: str = "memory_fit") -> list[Finding]:
    return list(lookup(kind).check(advisor.RunFacts(run)))


CHIPS = ev.MemoryFix("chips", 5 * GiB, 4.0, True, "v5e-4")
BF16 = ev.MemoryFix("bfloat16", 10 * GiB, 0.5, True)
CHECKPOINT = ev.MemoryFix("checkpointing", 12 * GiB, 0.0, True)


def test_a_need_over_one_device_is_an_error_whose_fix_fits_its_cause():
    # 20 GiB held between steps, over the 16: only what shrinks those bytes is a fix, and the
    # dtype comes before buying chips even though 4 chips leave more room
    run = _Run(_summary(20 * GiB, 21 * GiB), _record("estimate", 21 * GiB, (CHIPS, BF16)))
    (finding,) = _fit(run)
    assert (finding.kind, finding.severity, finding.cause, finding.subject) == ("memory_fit", "error", "state", "v5e")
    assert finding.fix.startswith("bfloat16") and finding.evidence.facts[-1].startswith("or: 4 chips")
    # the line is the biggest holder with a line of its own (not tensors made before the trace)
    assert (finding.evidence.location.file, finding.evidence.location.line) == ("/src/train.py", 12)
    assert finding.evidence.count("need per device") == 21 * GiB and finding.steps == (2, 2)


def test_a_peak_over_one_device_on_state_that_fits_is_fixed_by_what_the_step_keeps():
    run = _Run(_summary(8 * GiB, 18 * GiB), _record("estimate", 18 * GiB, (CHIPS, BF16, CHECKPOINT)))
    (finding,) = _fit(run)
    assert finding.cause == "peak" and finding.fix.startswith("activation checkpointing")


def test_a_run_that_fits_or_has_no_target_makes_no_fit_finding():
    assert _fit(_Run(_summary(8 * GiB, 12 * GiB), _record("estimate", 12 * GiB, (BF16,)))) == []
    assert _fit(_Run(_summary(8 * GiB, 12 * GiB))) == []


def test_a_run_recorded_with_its_verdict_gives_one_finding():
    # runs written before the advisor decided hold a "does_not_fit" record instead of the estimate
    (finding,) = _fit(_Run(_summary(20 * GiB, 21 * GiB), _record("does_not_fit", 21 * GiB, (BF16,))))
    assert finding.kind == "memory_fit"


def test_a_program_the_compiler_refused_in_a_dry_run_is_an_hbm_finding_about_that_program():
    run = _Run(_summary(8 * GiB, 12 * GiB), _record("estimate", 12 * GiB, (BF16,)),
               _record("program_oom", 48 * GiB, program="uniform_"))
    assert _fit(run) == []  # the run's estimate fits: only the program is refused
    (finding,) = _fit(run, "hbm_oom")
    assert (finding.severity, finding.subject, finding.targets) == ("error", "v5e: uniform_", ("uniform_",))
    assert finding.evidence.count("required") == 48 * GiB and "torch.device('meta')" in finding.fix
    # a computation refused (not a tensor being made): shard it or shrink what it holds
    run = _Run(_summary(8 * GiB, 12 * GiB), _record("program_oom", 18 * GiB, program="bmm"))
    (finding,) = _fit(run, "hbm_oom")
    assert "shard it over more chips" in finding.fix and "meta" not in finding.fix
