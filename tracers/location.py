"""Finding the user's line: the innermost frame of the user's own code.

Library code is torch, jax, jaxlib, tpu_debug, the standard library and every
installed package (anything under a ``site-packages`` or ``dist-packages``
directory: transformers, diffusers, ...), and code a library generated
(torch.fx's ``<eval_with_key>``, a ``"<string>"`` a library compiled and calls). The
script being run is the user's wherever it lives. A finding's location is the innermost user frame; the
library frame the user's line reached is kept beside it as context
(:func:`user_site`, :func:`split_frames`).

A function compiled by dynamo runs as a generated code object whose prologue
(the call of the compiled graph) carries the function's first line: an event
there belongs to the caller's line, where the inputs came from.

Whether a code object is "library" is decided once per code object and
cached, so a lookup is a short walk up the stack with dict hits.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import threading
from collections.abc import Sequence
from types import CodeType, FrameType

from tpu_debug.tracers.events import SourceLocation

__all__ = [
    "is_library_code",
    "is_library_file",
    "is_own_file",
    "is_user_frame",
    "library_roots",
    "location_of",
    "own_dirs",
    "split_frames",
    "user_frame_location",
    "user_location",
    "user_site",
]

# installed packages live in directories of these names, whichever interpreter, virtual
# environment or --target install put them there
_INSTALLED = tuple(f"{os.sep}{name}{os.sep}" for name in ("site-packages", "dist-packages"))
# the distribution's packages (pyproject's package-dir): one folder each, wherever installed
_OWN_PACKAGES = ("tpu_debug", "tpu_debug.core", "tpu_debug.runtime", "tpu_debug.tracers", "tpu_debug.fit",
                  "tpu_debug.tui")


def _package_dir(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = __import__(module_name)
        except ImportError:
            return None
    file = getattr(module, "__file__", None)
    return os.path.dirname(os.path.realpath(file)) + os.sep if file else None


def own_dirs() -> tuple[str, ...]:
    """tpu_debug's own package directories (the face, core, runtime, tracers, fit and TUI), each
    ending in ``os.sep``. Found from the import system's specs, so none of them is imported."""
    dirs = set()
    for name in _OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
            dirs.add(os.path.realpath(folder) + os.sep)
    return tuple(sorted(dirs))


def _site_packages() -> list[str]:
    # a virtual environment made with --system-site-packages also imports from the base
    # interpreter's site-packages, which sysconfig does not name and which sits inside
    # the base interpreter's stdlib tree
    import site

    dirs = list(getattr(site, "getsitepackages", list)())
    user = getattr(site, "getusersitepackages", lambda: None)()
    return dirs + ([user] if isinstance(user, str) else [])


def library_roots() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(library package dirs, site-packages dirs, stdlib dirs), each ending in ``os.sep``."""
    libs = [d for d in (_package_dir(m) for m in ("torch", "jax", "jaxlib")) if d]
    libs.extend(_own())
    paths = sysconfig.get_paths()
    site_dirs = [paths["purelib"], paths["platlib"], *_site_packages()]
    site = {os.path.realpath(d) + os.sep for d in site_dirs}
    stdlib = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")}
    return tuple(libs), tuple(site), tuple(stdlib)


_own_dirs: tuple[str, ...] | None = None
_roots: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None = None
# is a code object a library's, by the object's id: code objects compare equal across files
# (their file is not part of ==), so a user's function and a library's with the same body
# and first line would share a verdict keyed by the object. Each entry holds its code
# object, so the id stays its own.
_verdicts: dict[int, tuple[CodeType, bool]] = {}
_lock = threading.Lock()


def _own() -> tuple[str, ...]:
    global _own_dirs
    if _own_dirs is None:
        _own_dirs = own_dirs()
    return _own_dirs


def is_own_file(filename: str) -> bool:
    """True when ``filename`` is tpu_debug's own code (the one test of "is this frame ours")."""
    return os.path.realpath(filename).startswith(_own())


def _main_file() -> str | None:
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    return os.path.realpath(file) if isinstance(file, str) else None


def is_library_file(filename: str) -> bool:
    """True when ``filename`` is not the user's: torch, jax, tpu_debug, the standard
    library, or an installed package (transformers, diffusers, any ``site-packages``).

    The script being run is the user's even when it sits in an installed package's tree.
    """
    global _roots
    if _roots is None:
        with _lock:
            if _roots is None:
                _roots = library_roots()
    if filename.startswith("<"):
        # "<frozen runpy>" is the stdlib and "<eval_with_key>.3" torch.fx's generated code;
        # "<string>", "<stdin>", cells are the user's (see is_user_frame for code a library
        # compiled from a string)
        return filename.startswith(("<frozen ", "<eval_with_key>"))
    libs, site, stdlib = _roots
    path = os.path.realpath(filename)
    if path.startswith(libs):
        return True
    if path.startswith(site) or any(d in path for d in _INSTALLED):
        return path != _main_file()
    return path.startswith(stdlib)


def is_library_code(code: CodeType) -> bool:
    entry = _verdicts.get(id(code))
    if entry is None:
        entry = _verdicts[id(code)] = (code, is_library_file(code.co_filename))
    return entry[1]


_own_verdicts: dict[int, tuple[CodeType, bool]] = {}  # as _verdicts


def _is_own(code: CodeType) -> bool:
    entry = _own_verdicts.get(id(code))
    if entry is None:
        entry = _own_verdicts[id(code)] = (code, is_own_file(code.co_filename))
    return entry[1]


_interned: dict[tuple[str, int, str], SourceLocation] = {}


def location_of(frame: FrameType) -> SourceLocation:
    """The SourceLocation of ``frame`` (interned: one object per distinct line)."""
    code = frame.f_code
    key = (code.co_filename, frame.f_lineno, code.co_qualname)
    loc = _interned.get(key)
    if loc is None:
        loc = _interned.setdefault(key, SourceLocation(*key))
    return loc


def _in_compiled_prologue(frame: FrameType) -> bool:
    """True when ``frame`` runs dynamo's generated code for a compiled function outside any
    line of its body (the call of the compiled graph carries the function's first line)."""
    code = frame.f_code
    generated = getattr(sys.modules.get("torch._dynamo.utils"), "orig_code_map", None)
    if generated is None or code.co_name == "<module>":
        return False
    try:
        if code not in generated:  # a dict lookup by the code object's id
            return False
    except TypeError:
        return False
    return frame.f_lineno == code.co_firstlineno


def user_site(depth: int = 1) -> tuple[SourceLocation | None, SourceLocation | None]:
    """The innermost user line above the caller, and the library frame it reached.

    The context is the innermost library frame between the caller and the user line
    (tpu_debug's own frames are never context: they are the tool's machinery), None
    when the caller was reached from user code directly. An event in the prologue
    of a function compiled by dynamo belongs to the line that called the function.

    Args:
        depth: frames to skip before looking (1 skips the caller itself).

    Returns:
        ``(user line, library frame)``, e.g. ``(SourceLocation("train.py", 42, "step"),
        SourceLocation(".../transformers/utils/deprecation.py", 172, "wrapped_func"))``;
        ``(None, None)`` when no user frame is on the stack.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None, None
    context: SourceLocation | None = None
    while frame is not None:
        code = frame.f_code
        if is_user_frame(frame):
            return user_frame_location(frame), context
        if context is None and not _is_own(code) and not code.co_filename.startswith("<"):
            context = location_of(frame)  # a frame with a file to show
        frame = frame.f_back
    return None, None


def user_frame_location(frame: FrameType) -> SourceLocation:
    """The location of the user frame ``frame``: its line, or, when it runs the prologue of a
    function dynamo compiled, the line of the user code that called the function.

    A tracer that walks the stack itself calls this on the user frame it stops at, so its
    locations follow the same policy as :func:`user_site`.
    """
    if frame.f_back is not None and _in_compiled_prologue(frame):
        caller = frame.f_back
        while caller is not None:
            if is_user_frame(caller):
                return location_of(caller)
            caller = caller.f_back
    return location_of(frame)


# pseudo-files that are the user's typing whoever runs them
_TYPED = ("<stdin>", "<ipython-input-")


def is_user_frame(frame: FrameType) -> bool:
    """True when ``frame`` runs the user's code: a file that is not library code, or code
    compiled from a string by the user (``python -c``, the user's own ``exec``). Code a
    library compiled from a string (``"<string>"`` called by torch, say) is the library's.
    """
    code = frame.f_code
    if is_library_code(code):
        return False
    if not code.co_filename.startswith("<") or code.co_filename.startswith(_TYPED):
        return True
    caller = frame.f_back
    return caller is None or not is_library_code(caller.f_code)


# what a code object is to the stack walk, decided once per code object (by its id, as
# _verdicts)
_LIBRARY, _USER, _STRING = 0, 1, 2
_walk_kinds: dict[int, tuple[CodeType, int]] = {}
# the location of a user frame at (code's id, last instruction): one per call site, so the
# line number (decoded from the code's line table) and the interned location are looked
# up once (the code is kept alive by its _walk_kinds entry). A frame in a compiled
# function's prologue is not kept: its location is its caller's, which differs from call
# to call.
_site_locations: dict[tuple[int, int], SourceLocation] = {}


def _walk_kind(code: CodeType) -> int:
    entry = _walk_kinds.get(id(code))
    if entry is not None:
        return entry[1]
    if is_library_code(code):
        kind = _LIBRARY
    elif not code.co_filename.startswith("<") or code.co_filename.startswith(_TYPED):
        kind = _USER
    else:
        kind = _STRING  # the user's unless a library called it (is_user_frame)
    _walk_kinds[id(code)] = (code, kind)
    return kind


def user_location(depth: int = 1) -> SourceLocation | None:
    """The first frame of user code above the caller, or None when there is none
    (the location half of :func:`user_site`).

    This is the per-op lookup (lazy mode asks it for every op it records), so it walks
    the stack without :func:`user_site`'s library context, with each code object's verdict
    and each call site's location cached.

    Args:
        depth: frames to skip before looking (1 skips the caller itself).

    Returns:
        The user line, e.g. ``SourceLocation("train.py", 42, "step")``.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    kinds = _walk_kinds
    while frame is not None:
        code = frame.f_code
        entry = kinds.get(id(code))
        kind = entry[1] if entry is not None else _walk_kind(code)
        if kind == _LIBRARY or (
            kind == _STRING and frame.f_back is not None and is_library_code(frame.f_back.f_code)
        ):
            frame = frame.f_back
            continue
        site = (id(code), frame.f_lasti)
        loc = _site_locations.get(site)
        if loc is None:
            if frame.f_back is not None and _in_compiled_prologue(frame):
                return user_frame_location(frame)
            loc = _site_locations.setdefault(site, location_of(frame))
        return loc
    return None


def split_frames(frames: Sequence[SourceLocation]) -> tuple[SourceLocation | None, SourceLocation | None]:
    """The innermost user frame of a stack given outermost first (a traceback's order),
    and the innermost frame when that one is library code (its context; tpu_debug's own
    code included: a break inside the tool's runtime is not on the user's line either).

    Example::

        split_frames([SourceLocation("train.py", 24, "<module>"),
                      SourceLocation(".../torch/_dynamo/external_utils.py", 69, "inner")])
        # (SourceLocation('train.py', 24, '<module>'), SourceLocation('.../external_utils.py', 69, 'inner'))
    """
    user = next((f for f in reversed(frames) if not is_library_file(f.file)), None)
    inner = frames[-1] if frames else None
    return user, (inner if inner is not None and inner is not user else None)
