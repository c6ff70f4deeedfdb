"""What makes a step fit, and the plan search's activation-checkpointing axis.

References: each fix's answer equals a plain ``fit`` with that change (the fit itself is
checked against direct sharded compiles in test_fit.py and test_fit_loop.py), and each
verdict is the compiler's need against the compiler's usable HBM.
"""

from __future__ import annotations

import pytest

from tpu_debug.runtime.target._libtpu import _find_libtpu

transformers = pytest.importorskip("transformers",
                                   reason="builds Hugging Face models: pip install -e '.[models]'")
pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')

# six identical layers of a wide-ish Llama: 128 sequences of 512 per chip keep more
# activations than a v5e chip holds (about 19 GiB); checkpointing keeps each layer's input
# only (64 MiB), so with it, or with half as many sequences per chip, the step fits
CONFIG = dict(vocab_size=256, hidden_size=512, intermediate_size=2048, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
ARGS = dict(plan="fsdp", seq=512, optimization_level="O0")



def _config(**changes):
    return transformers.LlamaConfig(**{**CONFIG, **changes})


# a fit per fix (a minute of TPU compiles): the default tier keeps the advisor's compile-verified
# fixes below, the same answers through the finding
@pytest.mark.slow
def test_each_fix_is_the_answer_of_a_fit_with_that_change():
    import tpu_debug

    from tpu_debug.fit import fixes

    found = fixes(_config(), "v5e-4", batch=512, **ARGS)
    assert found.original.fits is False
    tried = dict(found.tried)
    # a 256-entry vocabulary: the logits are small, the chunked loss is not offered
    assert set(tried) == {"activation checkpointing (--remat)", "v5e-8 (fsdp over 8 chips)",
                          "batch 256 (half)", "activations offloaded to host memory (--remat-policy offload)",
                          "flash attention (--attention flash)",
                          "splash attention, MaxText's offload policy (--attention splash --remat-policy maxtext)"}
    direct = {
        "activation checkpointing (--remat)": tpu_debug.fit(_config(), "v5e-4", batch=512, remat=True, **ARGS),
        "activations offloaded to host memory (--remat-policy offload)": tpu_debug.fit(
            _config(), "v5e-4", batch=512, remat_policy="offload", **ARGS),
        "flash attention (--attention flash)": tpu_debug.fit(_config(), "v5e-4", batch=512, attention="flash",
                                                             **ARGS),
        "splash attention, MaxText's offload policy (--attention splash --remat-policy maxtext)": tpu_debug.fit(
            _config(), "v5e-4", batch=512, attention="splash", remat_policy="maxtext", **ARGS),
        "v5e-8 (fsdp over 8 chips)": tpu_debug.fit(_config(), "v5e-8", batch=512, **ARGS),
        "batch 256 (half)": tpu_debug.fit(_config(), "v5e-4", batch=256, **ARGS),
    }
    for what, report in tried.items():
        assert report.required == direct[what].required, what
        assert report.fits == (report.required <= report.capacity), what
    best = found.best
    # the recommendation is the first that fits in the order tried (cheapest first)
    fitting = [what for what, r in found.tried if r.fits]
    assert (best is None and not fitting) or best[0] == fitting[0]
    assert "each compiled" in found.render()
    # each change with its PyTorch code; the same-job changes that fit come first, fastest first
    code = dict(zip((what for what, _ in found.tried), found.code))
    assert "torch.utils.checkpoint" in code["activation checkpointing (--remat)"]
    assert "save_on_cpu" in code["activations offloaded to host memory (--remat-policy offload)"]
    same = [r.estimate.seconds for what, r in found.tried
            if r.fits and "chips" not in what and "half" not in what]
    assert same == sorted(same)


def test_a_slice_search_with_checkpointing_recommends_the_smallest_slice_that_fits():
    import tpu_debug
    from tpu_debug.fit import remat_of, search

    found = search(_config(), "slice", "v5e-1", batch=512, with_remat=True, **ARGS)
    assert found.best is not None and found.best.fits
    # every smaller candidate, with and without checkpointing, was compiled and did not fit
    for r in found.candidates[:-1]:
        assert r.fits is False and r.target.devices <= found.best.target.devices
        again = tpu_debug.fit(_config(), r.target, batch=512, remat=remat_of(r), **ARGS)
        assert again.required == r.required
    # the same slice without checkpointing was tried first
    same = [r for r in found.candidates if r.target.devices == found.best.target.devices]
    assert not remat_of(same[0])
    assert "remat" in found.render()


def test_the_advisor_names_the_fixes_a_compile_verified(tmp_path):
    import tpu_debug
    from tpu_debug.fit import fixes, record_fit

    # on the search's v5e-1 above: the original (512 sequences on one chip, 49 GiB) and its
    # checkpointing fix (15 GiB, fits) are that search's candidates, compiled once in this
    # module. MaxText's way fits too (14 GiB); the v5e-4 (16.1 GiB), half the batch (25 GiB),
    # offloading (16.0 GiB) and flash attention (46 GiB) do not. Most refusals come back from
    # the TPU compiler in seconds, where placing a step that fits takes it ten or more: on the
    # v5e-4 of the fit-per-fix test above, every fix fits
    found = fixes(_config(), "v5e-1", batch=512, **ARGS)
    run = tpu_debug.open_run(str(record_fit(found.original, logdir=tmp_path, name="fixes", fixes=found)))
    (event,) = run.events("fit")
    assert event.verified_fixes == found.lines()
    (finding,) = [f for f in run.findings() if f.kind == "fit_oom"]
    # every change compiled is in the finding's fix, with its figure; the first that fits leads
    for what, report in found.tried:
        assert what in finding.fix
        assert f"{what}: needs" in finding.fix
    best = found.best
    assert finding.fix.startswith(f"use {best[0]}" if best else "none of the changes compiled fits alone")
    assert "not verified" not in finding.fix
