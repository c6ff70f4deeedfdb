"""The advisor on the examples: each pitfall makes the finding of its rule (and nothing else),
its ``--fixed`` variant makes none, and every clean example makes none at all.

Each example runs under ``tpu-debug run`` in its own process (advise_example.py),
as a user would run it, with few steps.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import warm_python
from tpu_debug.tracers.advisor import RULES

ROOT = pathlib.Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
DRIVER = pathlib.Path(__file__).parent / "advise_example.py"

# pitfall -> (run options, script arguments, the findings' kinds it makes, the arguments that fix it)
PITFALLS: dict[str, tuple[list[str], list[str], set[str], list[str]]] = {
    "recompile_storm.py": ([], ["--steps", "4"], {"dynamic_shape"}, ["--bucket", "32"]),
    # the recompile limit it hits is a consequence under the recompile finding
    "python_scalar.py": ([], ["--steps", "12"], {"recompile", "recompile_limit"}, ["--fixed"]),
    "hidden_sync.py": ([], ["--steps", "5"], {"implicit_sync"}, ["--fixed"]),
    # the .item() that splits the graph is also a sync in every step: both are true
    "graph_break.py": ([], ["--steps", "4"], {"graph_break", "implicit_sync"}, ["--fixed"]),
    "cpu_fallback.py": ([], ["--steps", "4"], {"cpu_fallback"}, ["--fixed"]),
    "float64.py": ([], ["--steps", "3"], {"float64"}, ["--fixed"]),
    "tiny_ops.py": ([], ["--steps", "3"], {"eager_tiny_ops"}, ["--fixed"]),
    # a compiled model, its optimizer over 64 parameters one by one after it
    "split_step.py": ([], ["--steps", "8"], {"split_step"}, ["--fixed"]),
    "h2d_every_step.py": ([], ["--steps", "4"], {"h2d_every_step"}, ["--fixed"]),
    "d2h_every_step.py": ([], ["--steps", "4"], {"d2h_every_step"}, ["--fixed"]),
    # lazy by default: eager mode raises PyTorch's error at the gather (the run would fail)
    "out_of_range_index.py": ([], ["--steps", "3"], {"invalid_value"}, ["--fixed"]),
    # its loader's workers read the next batches while the step runs in the fixed variant
    "slow_input.py": ([], ["--steps", "8"], {"step_bound"}, ["--fixed"]),
    "bf16_drift.py": (["--divergence", "--numerics", "tpu"], [], {"divergence"}, ["--highest"]),
    "sharding_remat.py": (["--devices", "8"], ["--steps", "3"], {"sharding_remat"}, ["--fixed"]),
    # compiled for a real TPU (needs libtpu, as the target tests do)
    "tpu_padding.py": (["--target", "v5e"], ["--steps", "3"], {"tpu_padding"}, ["--fixed"]),
    "over_hbm.py": (["--dry-run", "--target", "v5e"], [], {"memory_fit", "hbm_oom", "dry_run_stopped"}, ["--fixed"]),
    # tpu_debug.fit compiles for a slice inside the script
    "fit_oom.py": ([], [], {"fit_oom"}, ["--fixed"]),
    # compile time: a transformer's layers unrolled into one graph (six tiny layers), a compiled step
    # called with the layer's index, a cache folder made for each run (the script starts the
    # job's previous run itself), a TPU compile of wide layers (needs libtpu)
    "unrolled_layers.py": ([], ["--layers", "6", "--steps", "1"], {"unrolled_loop"}, ["--fixed"]),
    # (a repeated program is told by its HLO: recorded here, as it is by default)
    "compile_per_layer.py": (["--hlo"], ["--steps", "1"], {"compile_per_layer"}, ["--fixed"]),
    "compile_cache_per_run.py": (["--compile-cache"], ["--steps", "2"], {"compile_cache_miss"}, ["--fixed"]),
    # (its TPU compiles take a minute on a busy machine: waited for, not left unfinished)
    "target_compile_bound.py": (["--target", "v5e", "--target-wait", "900"], ["--steps", "1"], {"target_compile_bound"},
                                ["--fixed"]),
    # starts its second rank itself; rank 0 (traced) raises at the collective only it calls
    "collective_desync.py": ([], ["--steps", "2"], {"collective_desync"}, ["--fixed"]),
    # rank 1 sleeps before each step's all-reduce; rank 0 (traced) waits for it there, except in the
    # first steps, where rank 0 compiles (the rule asks for 3 of 4 collectives: 10 steps leave room)
    "collective_straggler.py": ([], ["--steps", "10"], {"collective_straggler"}, ["--fixed"]),
}
# pitfalls that compile for a TPU without a run option saying so
COMPILE_FOR_TPU = {"fit_oom.py"}
# pitfalls run in the slow tier: two processes each, for a rule the default tier checks
# elsewhere: collective_straggler in test_desync_live.py's planted slow rank; the others in the
# findings corpus's default tier, where scripts written apart from the rules plant each of
# their kinds (test_a_slow_pitfalls_rule_is_planted_by_the_default_corpus holds that)
SLOW = {"collective_straggler.py", "recompile_storm.py", "python_scalar.py", "hidden_sync.py", "graph_break.py",
        "cpu_fallback.py", "float64.py", "tiny_ops.py", "h2d_every_step.py", "d2h_every_step.py", "bf16_drift.py"}

# examples written as ordinary, correct programs: the advisor must find nothing in them
# the model examples (examples/models/) run traced in tests/examples/test_models.py, which
# checks them against CPU and for findings in the same run
CLEAN: dict[str, list[str]] = {"mlp_train.py": ["--steps", "4"]}


def _pitfalls() -> list:
    # a pitfall compiled for a TPU target needs XLA's TPU compiler (libtpu)
    from tpu_debug.runtime.target._libtpu import _find_libtpu

    skip = pytest.mark.skipif(not _find_libtpu(), reason='needs libtpu: pip install -e ".[tpu]"; CI installs it')
    tpu = {s for s in PITFALLS if "--target" in PITFALLS[s][0]} | COMPILE_FOR_TPU
    return [pytest.param(s, marks=skip) if s in tpu else pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s
            for s in sorted(PITFALLS)]


def _findings(tmp_path, script: str, options: list[str], args: list[str]) -> list[dict]:
    proc = warm_python.run(
        [sys.executable, str(DRIVER), str(tmp_path / "runs"), *options, "--", str(EXAMPLES / script), *args],
        timeout=600,
        cwd=tmp_path,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FINDINGS ")]
    assert proc.returncode == 0 and len(lines) == 1, (
        f"{script} {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return json.loads(lines[0].removeprefix("FINDINGS "))


def _brief(findings: list[dict]) -> list[tuple[str, str]]:
    return [(f["kind"], f["title"]) for f in findings]


def test_every_rule_has_a_pitfall():
    covered = set().union(*(kinds for _, _, kinds, _ in PITFALLS.values()))
    assert covered == set(RULES), f"rules without a pitfall: {sorted(set(RULES) - covered)}"
    # rank_divergence.py is the runtime's error, not a finding (tests/distributed runs it)
    assert {p.name for p in (EXAMPLES / "pitfalls").glob("*.py")} == set(PITFALLS) | {"rank_divergence.py"}


def test_a_slow_pitfalls_rule_is_planted_by_the_default_corpus():
    sys.path.insert(0, str(ROOT / "tests" / "corpus"))
    import score
    from test_corpus import SLOW_TIER

    planted = {k for p in score.scripts() if p.name not in SLOW_TIER for k in score.expected(p).kinds}
    # a recompile limit is a consequence under its cause's finding, which the corpus scores; the
    # default tier's p_compiled_module_growing_batch.py holds one (tests/cli/test_cause_first.py)
    planted |= {"recompile_limit"}
    unplanted = {s: PITFALLS[s][2] - planted for s in SLOW - {"collective_straggler.py"}}
    assert {s: kinds for s, kinds in unplanted.items() if kinds} == {}


@pytest.mark.parametrize("script", _pitfalls())
def test_a_pitfall_makes_its_findings(tmp_path, script):
    options, args, kinds, _ = PITFALLS[script]
    findings = _findings(tmp_path, f"pitfalls/{script}", options, args)
    # a rule's finding, or a consequence under the finding of its cause (a recompile limit hit
    # because a Python value changed is under that value's recompile finding)
    made = {f["kind"] for f in findings} | {c["kind"] for f in findings for c in f.get("consequences") or []}
    assert made == kinds, _brief(findings)
    for f in findings:
        # each says what to do and names a line of the script (a whole-step finding, like a
        # step of tiny ops, the line in the step that issues the most distinct ops)
        assert f["fix"], f
        loc = f["evidence"]["location"]
        assert loc is not None and os.path.basename(loc["file"]) == script, f


@pytest.mark.parametrize("script", _pitfalls())
def test_a_fixed_pitfall_makes_no_finding(tmp_path, script):
    options, args, _, fixed = PITFALLS[script]
    findings = _findings(tmp_path, f"pitfalls/{script}", options, [*args, *fixed])
    assert findings == [], _brief(findings)


@pytest.mark.parametrize("script", sorted(CLEAN))
def test_a_clean_example_makes_no_finding(tmp_path, script):
    findings = _findings(tmp_path, script, [], CLEAN[script])
    assert findings == [], _brief(findings)
