"""The location policy: a finding's line is the innermost frame of the user's code, whatever
library (stdlib, an installed package, torch, jax, tpu_debug) it went through, and the
library frame it reached is kept as context."""

from __future__ import annotations

import functools
import json
import sys
import textwrap
import types

import jax
import torch
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import is_library_file, split_frames, user_location, user_site
from source_helpers import line_of


def _fake_package(root, name: str) -> types.ModuleType:
    """An installed package in a site-packages tree under ``root``, whose ``call(fn)`` calls
    ``fn`` back from inside the package, as transformers' decorators call user code."""
    pkg = root / "lib" / "python3.11" / "site-packages" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            def call(fn):
                return fn()  # the library line
            """
        )
    )
    sys.path.insert(0, str(pkg.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(pkg.parent))


def test_an_installed_package_is_library_code_kept_as_context(tmp_path):
    lib = _fake_package(tmp_path, "fakelib_policy")
    assert is_library_file(lib.__file__)

    def user():
        return lib.call(user_site)  # the user's line

    location, context = user()
    assert (location.file, location.line, location.function) == (
        __file__,
        line_of(user, "# the user's line"),
        user.__qualname__,
    )
    assert context.file == lib.__file__ and context.line == 3 and context.function == "call"


def test_a_script_in_a_temporary_directory_is_the_users(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from tpu_debug.tracers.location import user_location\nfound = user_location()\n")
    scope: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), scope)
    assert not is_library_file(str(script))
    assert scope["found"] == SourceLocation(str(script), 2, "<module>")


def test_the_running_script_is_the_users_even_inside_site_packages(tmp_path, monkeypatch):
    script = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "tool" / "main.py"
    script.parent.mkdir(parents=True)
    script.write_text("pass\n")
    other = script.parent / "helpers.py"
    other.write_text("pass\n")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    assert not is_library_file(str(script))
    assert is_library_file(str(other))


def test_stdlib_frames_are_context():
    def user():
        # the hook looks from the frame that called it (user_site(2) skips the hook itself)
        return json.loads('{"a": 1}', object_pairs_hook=lambda _: user_site(2))  # the json call

    location, context = user()
    assert location.file == __file__ and location.line == line_of(user, "# the json call")
    assert context.file == json.decoder.__file__ and is_library_file(context.file)


def test_torch_frames_are_context():
    def user():
        return torch.utils._pytree.tree_map(lambda _: user_site(2), [0])[0]  # the torch call

    location, context = user()
    assert location.line == line_of(user, "# the torch call") and location.file == __file__
    assert context.file == torch.utils._pytree.__file__


def test_jax_frames_are_context():
    def user():
        return jax.tree_util.tree_map(lambda _: user_site(2), [0])[0]  # the jax call

    location, context = user()
    assert location.line == line_of(user, "# the jax call") and location.file == __file__
    assert "/jax/" in context.file and is_library_file(context.file)


def test_tpu_debug_frames_are_never_context():
    def user():
        return user_site()  # no library between

    location, context = user()
    assert location.line == line_of(user, "# no library between") and context is None


def test_a_dynamo_traceback_splits_into_the_users_line_and_the_library_frame():
    ext = torch._dynamo.external_utils.__file__
    from tpu_debug.runtime import compiled

    frames = [
        SourceLocation("/tmp/work/train.py", 24, "<module>"),
        SourceLocation(compiled.__file__, 880, "run"),  # the tool's own wrapper: skipped
        SourceLocation(ext, 69, "inner"),
    ]
    assert split_frames(frames) == (frames[0], frames[2])
    # a break in user code has no library context
    assert split_frames(frames[:1]) == (frames[0], None)
    assert split_frames(frames[1:]) == (None, frames[2])
    # a break inside the tool's own runtime is library code too
    assert split_frames(frames[:2]) == (frames[0], frames[1])


def test_a_compiled_function_points_at_its_callers_line():
    seen = []

    def backend(gm, example_inputs):
        def run(*args):
            # the compiled graph runs from dynamo's generated code of `encode`, whose
            # prologue carries the `def` line: the event belongs to the caller
            seen.append(user_location(2))
            return gm.forward(*args)

        return _library(run)

    @torch.compile(backend=backend)
    def encode(x):
        return (x * 2).sum()

    def caller():
        return encode(torch.ones(3))  # the caller's line

    assert caller().item() == 6.0
    assert seen and seen[-1].line == line_of(caller, "# the caller's line"), seen


def _library(fn):
    """``fn`` run from a frame of library code (a function compiled as "<frozen ...>")."""
    scope: dict = {}
    exec(compile("def call(fn, *a):\n    return fn(*a)\n", "<frozen fake>", "exec"), scope)
    return functools.partial(scope["call"], fn)


def test_a_tracers_own_stack_walk_gets_the_same_caller_line():
    # a tracer that walks frames itself stops at the first user frame and asks for its location
    from tpu_debug.tracers.location import user_frame_location

    seen = []

    def backend(gm, example_inputs):
        def run(*args):
            frame = sys._getframe(1)
            while frame.f_code.co_filename != __file__ or frame.f_code.co_name == "run":
                frame = frame.f_back
            seen.append((frame.f_code.co_name, user_frame_location(frame)))
            return gm.forward(*args)

        return _library(run)

    @torch.compile(backend=backend)
    def scale(x):
        return x * 3

    def caller():
        return scale(torch.ones(2))  # the call

    caller()
    (name, location), *_ = seen
    # the frame the walk stops at is the compiled function's; its location is the caller's line
    assert name == "scale" and location.line == line_of(caller, "# the call")


def test_pseudo_files():
    assert is_library_file("<eval_with_key>.3")  # torch.fx's generated forward
    assert is_library_file("<frozen runpy>")
    assert not is_library_file("<string>") and not is_library_file("<stdin>")  # python -c, the REPL


def test_a_string_compiled_function_called_by_a_library_is_not_the_users_line(tmp_path):
    lib = _fake_package(tmp_path, "fakecall_policy")
    scope: dict = {}
    exec(compile("probe = lambda: site()\n", "<string>", "exec"), {"site": user_site}, scope)  # noqa: S102

    def user():
        return lib.call(scope["probe"])  # reaches the library

    location, context = user()
    # the "<string>" lambda is called by the library: it is the library's generated code
    assert (location.file, location.line) == (__file__, line_of(user, "# reaches the library"))
    assert context.file == lib.__file__
