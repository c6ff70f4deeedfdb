"""The transfers tracer follows the location policy: a sync made inside an installed package,
even in code that package compiled from a string, is pinned to the user's line that called it."""

from __future__ import annotations

import inspect

import torch
from source_helpers import installed

import tpu_debug

# a library that builds its helper from a string, as code generators (torch.fx, dataclasses) do
_GENERATING = """
    _scope = {}
    exec(compile("def should_stop(t):\\n    return bool(t.max() > 0.5)\\n", "<string>", "exec"), _scope)


    def generate(x, steps):
        out = []
        for _ in range(steps):
            x = x * 0.9
            out.append(x)
            if _scope["should_stop"](x):
                continue
        return out
"""


def test_a_sync_inside_library_generated_code_is_pinned_to_the_users_call(tmp_path):
    lib = installed(tmp_path, "fakegen_transfers", _GENERATING)

    def user(x):
        return lib.generate(x, 3)  # the user's call

    x = torch.ones(4).to("tpu")
    with tpu_debug.trace(logdir=tmp_path / "runs", hlo=False) as session:
        user(x)
    syncs = [t for t in session.transfers() if t.implicit]
    lines, first = inspect.getsourcelines(user)
    expected = first + next(i for i, line in enumerate(lines) if "# the user's call" in line)
    assert len(syncs) == 3
    assert {(t.op, t.location.file, t.location.line) for t in syncs} == {("bool", __file__, expected)}
