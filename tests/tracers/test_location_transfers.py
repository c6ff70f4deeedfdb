"""The transfers tracer follows the location policy: a sync made inside an installed package,
even in code that package compiled from a string, is pinned to the user's line that called it."""

from __future__ import annotations

import inspect
import sys
import textwrap

import torch

import tpu_debug


def _installed(root, name: str, source: str):
    pkg = root / "lib" / "python3.11" / "site-packages" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(pkg.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(pkg.parent))


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
    lib = _installed(tmp_path, "fakegen_transfers", _GENERATING)

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
