"""What fit's answers say, on answers built here (no TPU compile): a refusal's need is a lower
bound and says so, a step that does not fit says how to find what does, a search's headline
names what its answer holds only under, and no figure is written as Python would print it."""

from __future__ import annotations

import dataclasses
import types

import pytest

from tpu_debug.fit import answer
from tpu_debug.fit.answer import FIXES_HINT, FitReport, Fixes, PlanSearch
from tpu_debug.fit.sharded import parse_plan
from tpu_debug.runtime.target import parse_target

GiB = 1 << 30
TARGET = parse_target("v5e-8")
PLAN = parse_plan("fsdp", 8)
OOM = types.SimpleNamespace(kind="hbm_oom", required_bytes=int(92.44 * GiB),
                            message="RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory")


def _answer(**fields) -> FitReport:
    base = FitReport("tiny-llama", TARGET, PLAN, "train", 8, 32, 106816, True, int(15.75 * GiB), "compiler",
                     4 << 20, None, (), None, (), None, 2.0, 2.5)
    return dataclasses.replace(base, **fields)


def _refused(monkeypatch, job: str = "train") -> FitReport:
    monkeypatch.setattr("tpu_debug.runtime.target.capacity.hbm_capacity", lambda tgt: (int(15.75 * GiB), "compiler"))
    measured = answer._Measure(PLAN, OOM, None, None, (), int(24.6 * GiB), int(24.7 * GiB), 0, (), 66.8, 0.0)
    return answer._report("llama3-70b", TARGET, job, 8, 2048, 70_553_706_496, measured, 0.0, "", 70.0, None)


def test_needs_92_gib_when_the_compiler_stopped_early_says_needs_at_least(monkeypatch):
    r = _refused(monkeypatch)
    assert r.fits is False
    assert r.required == OOM.required_bytes + int(24.6 * GiB) + int(24.7 * GiB)
    assert [what for what, _ in r.at_least] == [
        "the compiler's temporaries when it stopped", "parameters", "optimizer state"]
    text = r.render()
    assert "per chip: needs at least 141.74 GiB of 15.75 GiB" in text
    assert "at least 125.99 GiB short" in text
    assert ("the compiler's temporaries when it stopped 92.44 GiB + parameters 24.60 GiB + optimizer state "
            "24.70 GiB") in text
    assert "needs 92.44 GiB" not in text
    # inference has no optimizer state to add
    assert [what for what, _ in _refused(monkeypatch, "forward").at_least][-1] == "parameters"


def test_a_whole_compile_needs_what_it_says_not_at_least():
    assert "per chip: needs 4.00 MiB of" in _answer().render()
    assert "at least" not in _answer().render()


def test_a_does_not_fit_answer_prints_the_fixes_hint(monkeypatch):
    r = _refused(monkeypatch)
    assert FIXES_HINT in r.render()
    # the CLI prints the fixes themselves after the answer with --fixes: no hint then
    assert FIXES_HINT not in r.render(fixes_hint=False)
    assert FIXES_HINT not in _answer().render()
    fixes = Fixes(r, (("bfloat16", _answer()),))
    assert "fixes for llama3-70b on v5e-8 (needs at least 141.74 GiB of 15.75 GiB per chip)" in fixes.render()


def test_a_search_headline_names_activation_checkpointing():
    plain = _answer(fits=False, required=20 * GiB)
    remat = _answer(method="decoder layers as one loop with activation checkpointing (remat)")
    found = PlanSearch("smallest slice", (plain, remat), remat)
    text = found.render()
    assert text.splitlines()[0] == (
        "smallest slice: v5e-8, plan fsdp=8, batch 8, fits only with activation checkpointing (remat)")
    no_remat = PlanSearch("smallest slice", (_answer(),), _answer())
    assert no_remat.render().splitlines()[0] == "smallest slice: v5e-8, plan fsdp=8, batch 8"


def test_a_search_where_no_candidate_fits_says_why_and_what_next(monkeypatch):
    r = _refused(monkeypatch)
    text = PlanSearch("smallest slice", (r,), None).render()
    assert text.splitlines()[0] == (
        "smallest slice: no candidate fits (the last tried, v5e-8 batch 8, needs at least 141.74 GiB of "
        "15.75 GiB per chip)")
    assert "--with-remat" in text and FIXES_HINT in text


def test_a_cached_compile_is_said_cached_not_timed():
    text = _answer(compile_cached=True, compile_seconds=66.8, seconds=5.5).render()
    assert "answered in 5.5 s (TPU compile read from the cache; it took 66.8 s when compiled)" in text
    assert "answered in 2.5 s (TPU compile 2.0 s)" in _answer().render()


@pytest.mark.parametrize(("parameters", "shown"), [(106816, "107K"), (70_553_706_496, "70.6B"), (950, "950")])
def test_0_000107_b_parameters_is_a_readable_count(parameters, shown):
    assert _answer(parameters=parameters).render().startswith(f"tiny-llama ({shown} parameters), train")


def test_no_raw_true_or_false_in_the_search_table():
    found = PlanSearch("smallest slice", (_answer(fits=False, required=20 * GiB), _answer()), _answer())
    rows = found.render().splitlines()[2:]
    assert not [row for row in rows if "True" in row or "False" in row], rows
    assert rows[0].split()[3:5] == ["no", "no"] and rows[1].split()[3:5] == ["no", "yes"]
