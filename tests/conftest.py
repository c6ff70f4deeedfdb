from __future__ import annotations

import os

# Tests never pick up a user's TPU_DEBUG_* settings by accident; TPU_DEBUG_OPINFO_* select
# the OpInfo harness tier and results file (issue 7), not runtime behaviour.
for _name in [n for n in os.environ if n.startswith("TPU_DEBUG_") and not n.startswith("TPU_DEBUG_OPINFO_")]:
    del os.environ[_name]

import pytest  # noqa: E402
import torch  # noqa: E402

import tpu_debug  # noqa: E402,F401 - registers the tpu device


@pytest.fixture
def tpu():
    return torch.device("tpu")


def on_both(fn, *cpu_args, **kwargs):
    """Run ``fn`` on the CPU args and on copies moved to tpu; return (cpu, tpu-as-cpu)."""
    moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    ref = fn(*cpu_args, **kwargs)
    out = fn(*moved, **kwargs)
    return ref, _to_cpu(out)


def _to_cpu(out):
    if isinstance(out, torch.Tensor):
        return out.cpu()
    if isinstance(out, (list, tuple)):
        return type(out)(_to_cpu(o) for o in out)
    return out
