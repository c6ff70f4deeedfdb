"""The advisor on the findings corpus (see score.py): zero warnings on every correct program, and
every planted problem found at the user's line.

Each script runs under ``tpu-debug run`` in its own process, as a user runs it. A script the
tool does not yet get right is listed in KNOWN with the reason; it is expected to fail
(strictly: a fix that makes it pass turns the test red until it is taken off the list).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import score  # noqa: E402

# script -> why the tool does not get it right yet
KNOWN: dict[str, str] = {}
# Scripts run twice with one persistent compile cache, cold then warm, in the default run: the
# second run reads every program back instead of compiling it, and must get the same findings.
# One per way a program is compiled (lazy fused graphs, a dynamo graph, eager ops), each with
# shapes that change, the findings a cache could hide; test_the_cache_changes_no_finding (slow)
# runs every script so.
CACHED = ("p_lazy_unpadded_sentences.py", "p_compiled_changing_batch.py", "p_boolean_mask_select.py",
          # a compiled module whose batch grows until dynamo's limit, a DataLoader's batches that
          # are data, noise made on the host inside a model's forward: one finding (or none) at
          # the user's line, and the same verdict, cold and warm
          "p_compiled_module_growing_batch.py", "c_bert_dataloader_batches.py", "p_ddpm_p_losses_host_noise.py")
# Planted scripts run in the slow tier only: each plants a kind that at least two default-tier
# scripts plant too (test_the_default_tier_plants_every_kind_twice holds that), and each costs
# a process of 6-27 s. Every correct program stays in the default tier: a warning on a correct
# program is the failure that costs the most trust.
SLOW_TIER = frozenset({
    "p_variable_length_batches.py", "p_module_call_counter.py", "p_hf_generate_dynamic.py",
    "p_compiled_lr_float.py", "p_policy_distribution_checks.py", "p_gated_cell_time_loop.py",
    "p_numpy_mask_every_step.py", "p_print_every_step.py", "h_p04_growing_input.py",
    "p_greedy_decode_growing.py", "p_compiled_item_branch.py", "p_clip_error_if_nonfinite.py",
    "p_plateau_every_step.py", "p_compiled_step_backward.py", "p_default_dtype_float64.py",
    "h_p10_if_loss_nan.py", "p_item_every_step.py", "p_tensor_from_list.py", "h_p09_class_weights_list.py",
    # written as popular codebases write their loops (torchvision's references, timm, Hugging Face's
    # example scripts, diffusers' training scripts, Lightning-style modules); their correct twins
    # are in the default tier
    "p_tv_classification_metric_logger.py", "p_timm_normalize_float64.py", "p_hf_glue_pad_longest.py",
    "p_hf_clm_position_ids.py", "p_diffusers_host_timesteps.py", "p_lightning_class_weights.py",
    "p_lightning_grad_norm_check.py", "p_lightning_compiled_clamp_branch.py",
})


# the quick tier's scripts: a correct program and a planted sync
QUICK = ("c_log_every_n.py", "h_p02_item_every_step.py")


def _tiered(paths):
    return [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_TIER
            else pytest.param(p, marks=pytest.mark.quick) if p.name in QUICK else p for p in paths]


def _check(path, findings, error) -> None:
    result = score.score(path, findings, error)
    assert result.error is None, result.error
    assert not result.false, f"findings nobody expected: {result.false}"
    assert not result.split, f"one planted cause found as several findings: {result.split}"
    assert not result.missed, f"planted problems not found at their line: {result.missed} (found: " + \
        ", ".join(f"{f.severity} {f.kind}@{score._line(f, path) or score._elsewhere(f)}" for f in findings) + ")"


@pytest.mark.parametrize("path", _tiered(score.scripts()), ids=lambda p: p.stem)
def test_corpus_script(path, tmp_path, request):
    if path.name in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[path.name], strict=True))
    cache = tmp_path / "cache" if path.name in CACHED else None
    cold = score.run(path, tmp_path / "cold", cache=cache)
    _check(path, cold.findings, cold.error)
    if cache is not None:
        warm = score.run(path, tmp_path / "warm", cache=cache)
        _check(path, warm.findings, warm.error)
        assert score.identity(path, warm.findings, warm.bound) == score.identity(path, cold.findings, cold.bound), \
            "a warm compile cache changed the findings or the step verdict"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in score.scripts() if p.name not in CACHED], ids=lambda p: p.stem)
def test_the_cache_changes_no_finding(path, tmp_path):
    cold = score.run(path, tmp_path / "cold", cache=tmp_path / "cache")
    assert cold.error is None, cold.error
    warm = score.run(path, tmp_path / "warm", cache=tmp_path / "cache")
    assert warm.error is None, warm.error
    assert score.identity(path, warm.findings, warm.bound) == score.identity(path, cold.findings, cold.bound)


@pytest.mark.quick
def test_the_corpus_is_as_large_as_promised():
    expected = [score.expected(p) for p in score.scripts()]
    assert len(expected) >= 90
    assert sum(1 for e in expected if e.correct) >= 35


def test_the_default_tier_plants_every_kind_twice():
    expected = {p.name: score.expected(p) for p in score.scripts()}
    assert SLOW_TIER <= set(expected) and not SLOW_TIER & set(CACHED)
    assert not any(expected[name].correct for name in SLOW_TIER)
    planted: dict[str, list[str]] = {}  # kind -> the scripts that plant it
    for name, exp in expected.items():
        for kind in exp.kinds:
            planted.setdefault(kind.split("/")[0], []).append(name)
    # twice in the default tier, or the one script that plants it
    short = {kind: names for kind, names in planted.items()
             if len([n for n in names if n not in SLOW_TIER]) < min(2, len(names))}
    assert short == {}
