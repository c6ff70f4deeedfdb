"""Hugging Face Transformers models on `tpu`: one training step (forward with labels,
``loss.backward()``, an SGD step), eagerly and under ``torch.compile(backend="tpu_debug")``,
against the same model on CPU: the logits, the loss, every gradient and every parameter after
the step.

Tolerances: the models run in float32 with 2 layers of width 32-64, so a result sums a few
hundred products; XLA orders those sums differently from ATen (and fuses differently when
compiled), which moves each result by a few float32 ulps per layer. Logits and losses are
O(1) and gradients smaller: 1e-4 absolute is about a hundred ulps at 1.0, above that
reordering, far below any wrong lowering (a wrong op moves results by 1e-2 or more).
"""

from __future__ import annotations

import pytest
from hf_common import SPECS, compare, run_on_tpu

ATOL = 1e-4

# the fastest of each family run in the default tier; the others in the slow tier
FAST = ("llama", "gpt2", "bert", "t5", "vit")
SLOW = tuple(n for n in SPECS if n not in FAST)


def _cases():
    for name in (*FAST, *SLOW):
        for mode in ("eager", "compiled"):
            marks = []
            if name in SLOW:
                marks.append(pytest.mark.slow)
            if (name, mode) == (FAST[0], "eager"):
                marks.append(pytest.mark.quick)
            yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


@pytest.mark.parametrize(("name", "mode"), list(_cases()))
def test_train_step_matches_cpu(name, mode):
    dev, ref = run_on_tpu(name, mode)
    errors = compare(dev, ref)
    assert errors.forward <= ATOL, errors
    assert errors.loss <= ATOL, errors
    assert errors.grad <= ATOL, errors
    assert errors.param <= ATOL, errors


@pytest.mark.slow
def test_mixtral_eager_experts_compiled_matches_cpu():
    """Mixtral's eager experts loop (``experts_implementation="eager"``) runs without
    aten._grouped_mm; compiled, its router's one_hot asserts its indices on the device
    (aten._assert_async, which the compiled graph checks as a program output)."""
    dev, ref = run_on_tpu("mixtral", "compiled", experts_implementation="eager")
    errors = compare(dev, ref)
    assert max(errors.forward, errors.train) <= ATOL, errors
