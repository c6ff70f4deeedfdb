from __future__ import annotations

import json
import os
import sys

import torch
from tpu_debug.tracers.location import is_library_file, user_location


def _inner():
    return user_location()


def test_user_location_is_the_calling_line():
    loc = _inner()
    assert loc.file == __file__
    assert loc.function == "_inner"
    assert loc.line == _inner.__code__.co_firstlineno + 1


def test_library_frames_are_skipped():
    # json (stdlib) calls back into this file: the first user frame is the callback
    seen = []

    def hook(pairs):
        seen.append(user_location())
        return dict(pairs)

    json.loads('{"a": 1}', object_pairs_hook=hook)
    assert seen[0].file == __file__ and seen[0].function.endswith("hook")


def test_what_counts_as_library():
    assert is_library_file(torch.__file__)
    assert is_library_file(json.__file__)
    assert is_library_file(os.path.join(os.path.dirname(__import__("jax").__file__), "numpy", "x.py"))
    import tpu_debug.runtime
    import tpu_debug.tracers

    assert is_library_file(tpu_debug.tracers.__file__)
    assert is_library_file(tpu_debug.runtime.__file__)
    assert is_library_file("<frozen runpy>")
    assert not is_library_file(__file__)
    assert not is_library_file("<string>")
    assert not is_library_file(sys.modules["pytest"].__file__)  # third-party code is the user's


def test_no_user_frame_gives_none():
    code = compile(
        "from tpu_debug.tracers.location import user_location as u\nresult = u()", "<frozen fake>", "exec"
    )
    scope: dict = {}
    exec(code, scope)
    # the exec'd frame is "library"; above it is this test function, which is user code
    assert scope["result"].file == __file__
