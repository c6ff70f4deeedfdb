"""The example models (examples/models/) at their tiny sizes: each trains one step on the
`tpu` device, eagerly and compiled, and agrees with CPU (forward, loss, gradients,
parameters after the step; tolerances in examples/models/_harness.py). Each runs traced,
and the advisor finds nothing to fix in it (the MoE expert loop aside: it is the pattern
the example shows against the grouped matmul)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

import tpu_debug

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models import _harness  # noqa: E402

# resnet last, and test_main_reports_each_mode right after test_model_matches_cpu: with xdist
# (tests/conftest.py sends a module's tests to a worker in eights of its collection order) the
# resnet-eager step that test reuses then runs on its worker, before it, and is not run again
CASES = [
    ("llama", {}),
    ("moe", {"experts": "loop"}),
    ("moe", {"experts": "grouped"}),
    ("dlrm", {}),
    ("mingpt", {}),
    ("unet", {}),
    ("resnet", {}),
]


# (name, experts, mode) -> the comparison test_model_matches_cpu made, for the command line's test
_results: dict[tuple, _harness.Comparison] = {}


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name,kwargs", CASES, ids=[n + "".join(f"-{v}" for v in k.values()) for n, k in CASES])
def test_model_matches_cpu(tmp_path, name, kwargs, mode):
    module = importlib.import_module(f"examples.models.{name}")
    with tpu_debug.trace(logdir=tmp_path, hlo=False) as session:
        result = _results[(name, kwargs.get("experts"), mode)] = module.run(mode, **kwargs)
    bad = {k: v for k, v in result.worst.items() if not v <= 1.0}
    assert not bad, f"{name} ({mode}) off tolerance (ratio to it): {bad}"
    if kwargs.get("experts") != "loop":
        findings = session.findings()
        assert findings == [], [(f.kind, f.title) for f in findings]


def test_main_reports_each_mode(capsys, monkeypatch):
    """``--mode eager`` runs the eager step alone and prints its comparison. The step is the one
    test_model_matches_cpu[resnet-eager] ran when it ran in this process: main's subject is
    which modes it runs and what it prints, the step's is that test's."""
    from examples.models import resnet

    real, modes = resnet.run, []

    def run(mode):
        modes.append(mode)
        key = ("resnet", None, mode)
        if key not in _results:
            _results[key] = real(mode)
        return _results[key]

    monkeypatch.setattr(resnet, "run", run)
    assert resnet.main(["--mode", "eager"]) == 0
    out = capsys.readouterr().out
    assert modes == ["eager"]
    assert "eager:" in out and "OK" in out and "compiled:" not in out


# slow tier: lazy mode is checked in CI by the OpInfo lazy tier and tests/runtime/test_lazy*.py
@pytest.mark.slow
@pytest.mark.parametrize("name,kwargs", [c for c in CASES if c[1].get("experts") != "loop"],
                         ids=[n + "".join(f"-{v}" for v in k.values()) for n, k in CASES if k.get("experts") != "loop"])
def test_model_matches_cpu_in_lazy_mode(name, kwargs):
    """The eager step with ops recorded and run as fused programs (DEFER_AND_FUSE)."""
    module = importlib.import_module(f"examples.models.{name}")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        result = module.run("eager", **kwargs)
    bad = {k: v for k, v in result.worst.items() if not v <= 1.0}
    assert not bad, f"{name} (lazy) off tolerance (ratio to it): {bad}"


@pytest.mark.quick
def test_harness_catches_a_wrong_result():
    """A device result off by 1e-3 relative (ten times the tolerance) fails the comparison."""
    from examples.models import dlrm

    def skewed(model, batch):
        out, loss = dlrm.loss_of(model, batch)
        if out.device.type == "tpu":
            out, loss = out * (1 + 1e-3), loss * (1 + 1e-3)
        return out, loss

    result = _harness.compare(dlrm.DLRM, dlrm.make_batch, skewed, "eager", to_device=dlrm._to)
    assert not result.ok
    assert result.worst["loss"] > 1 and result.worst["output[0]"] > 1
