from __future__ import annotations

import json
import os
import sys
import threading

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
    # an installed third-party package is library code, like torch
    assert is_library_file(sys.modules["pytest"].__file__)


def test_a_users_function_equal_to_a_librarys_is_still_the_users():
    # code objects compare equal across files (== ignores co_filename): a verdict or a line kept
    # per code object must still be each file's own
    source = "def call(fn):\n    return fn()\n"
    library, user = {}, {}
    exec(compile(source, json.__file__, "exec"), library)
    exec(compile(source, __file__, "exec"), user)
    assert library["call"].__code__ == user["call"].__code__  # what the caches must not conflate
    # the library's copy first: its frame is skipped, this test is the user's line
    assert library["call"](lambda: user_location(2)).function == "test_a_users_function_equal_to_a_librarys_is_still_the_users"
    loc = user["call"](lambda: user_location(2))
    assert (loc.file, loc.function) == (__file__, "call")
    from tpu_debug.tracers.location import is_library_code

    assert is_library_code(library["call"].__code__) and not is_library_code(user["call"].__code__)


def _frozen(source: str) -> dict:
    """Run ``source`` compiled under a ``<frozen ...>`` name, which counts as the stdlib."""
    scope: dict = {}
    exec(compile(source, "<frozen fake>", "exec"), scope)
    return scope


def test_frozen_frames_are_skipped():
    scope = _frozen("from tpu_debug.tracers.location import user_location as u\nresult = u()")
    # the exec'd frame is "library"; above it is this test function, which is user code
    assert scope["result"].file == __file__


def test_no_user_frame_gives_none():
    # a thread whose every frame is library code: threading's bootstrap (stdlib) runs a
    # function compiled under a "<frozen ...>" name
    probe = _frozen(
        "from tpu_debug.tracers.location import user_location\n"
        "def probe(found):\n"
        "    found.append(user_location())\n"
    )["probe"]
    found: list = []
    thread = threading.Thread(target=probe, args=(found,))
    thread.start()
    thread.join()
    assert found == [None]


def _two_sites():
    return user_location(), user_location()


def test_each_call_site_of_one_function_has_its_own_line():
    # locations are cached per call site: two calls in one function, two lines
    first, second = _two_sites(), _two_sites()
    assert first == second
    a, b = first
    assert a.file == b.file == __file__
    assert (a.function, b.function) == ("_two_sites", "_two_sites")
    assert a.line == b.line == _two_sites.__code__.co_firstlineno + 1


def _site_in_loop():
    lines = []
    for _ in range(2):
        lines.append(user_location().line)
        lines.append(user_location().line)
    return lines


def test_call_sites_on_different_lines_are_told_apart():
    first = _site_in_loop.__code__.co_firstlineno
    assert _site_in_loop() == [first + 3, first + 4, first + 3, first + 4]
