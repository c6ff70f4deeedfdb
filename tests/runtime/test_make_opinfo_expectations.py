"""The OpInfo expectation generator keeps hand-judged kinds."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_opinfo_expectations as gen  # noqa: E402



def _ci_samples(mode: str, dtype: str) -> int:  # the CI tier's samples: two eagerly in float32, else one
    return 2 if (mode, dtype) == ("eager", "float32") else 1


def _row(op, outcome, error=None, dtype="bool", mode="eager", tier="full", sample=0):
    return {"op": op, "variant": "", "dtype": dtype, "mode": mode, "tier": tier, "outcome": outcome,
            "error": error, "failed_sample": sample, "failed_check": "op"}


def test_flaky_entries_stay_flaky_whether_the_sweep_passed_or_failed_them():
    old = {
        ("argsort", "", "bool", "eager"): ("flaky", "op: values differ from CPU (tie order)"),
        ("sort", "", "bool", "eager"): ("flaky", "op: values differ from CPU (tie order)"),
        ("topk", "", "bool", "eager"): ("xfail", "op: values differ from CPU"),
        ("mode", "", "bool", "eager"): ("skip", "hangs"),
        ("linspace", "", "bool", "eager"): ("flaky_full", "op: values differ from CPU (SIMD rounding)"),
    }
    rows = [
        _row("argsort", "failed", "op: values differ from CPU, 3 / 8 elements"),
        _row("sort", "passed"),
        _row("topk", "passed"),
        _row("kthvalue", "failed", "op: values differ from CPU, 1 / 8 elements"),
        _row("linspace", "failed", "op: values differ from CPU, 7 / 50 elements", sample=5),
    ]
    expect, _ = gen.build(rows, old, {}, _ci_samples)
    assert expect[("argsort", "", "bool", "eager")] == ("flaky", "op: values differ from CPU, 3 / 8 elements")
    assert expect[("sort", "", "bool", "eager")] == old[("sort", "", "bool", "eager")]  # a pass keeps it
    assert ("topk", "", "bool", "eager") not in expect  # a strict xfail that passed is fixed
    assert expect[("kthvalue", "", "bool", "eager")] == ("xfail", "op: values differ from CPU, 1 / 8 elements")
    assert expect[("mode", "", "bool", "eager")] == ("skip", "hangs")
    assert expect[("linspace", "", "bool", "eager")] == ("flaky_full", "op: values differ from CPU, 7 / 50 elements")


def test_a_failure_beyond_the_ci_samples_of_its_dtype_is_xfail_full():
    """A bfloat16 failure at the second sample is beyond the CI tier (one sample outside
    float32): strict in the full sweep only; the same failure in float32 is seen by CI."""
    rows = [
        _row("atan2", "failed", "op: values differ from CPU, 1 / 8 elements", dtype="bfloat16", sample=1),
        _row("atan2", "failed", "op: values differ from CPU, 1 / 8 elements", dtype="float32", sample=1),
    ]
    expect, _ = gen.build(rows, {}, {}, _ci_samples)
    assert expect[("atan2", "", "bfloat16", "eager")][0] == "xfail_full"
    assert expect[("atan2", "", "float32", "eager")][0] == "xfail"
