"""Finding the user's line: the first frame outside torch, jax, tpu_debug and the stdlib.

Whether a code object is "library" is decided once per code object and
cached, so a lookup is a short walk up the stack with dict hits.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from types import CodeType, FrameType

from tpu_debug.tracers.events import SourceLocation

__all__ = ["is_library_file", "is_own_file", "library_roots", "location_of", "own_dirs", "user_location"]


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
    """tpu_debug's own package directories (tpu_debug, its core, runtime and tracers, and
    the TUI once imported), each ending in ``os.sep``."""
    import tpu_debug.runtime
    import tpu_debug.tracers
    import tpu_debug_core

    import tpu_debug

    dirs = {_package_dir("tpu_debug")}
    for module in (tpu_debug_core, tpu_debug.runtime, tpu_debug.tracers):
        dirs.add(os.path.dirname(os.path.realpath(module.__file__)) + os.sep)
    tui = sys.modules.get("tpu_debug.tui")
    if tui is not None and getattr(tui, "__file__", None):
        dirs.add(os.path.dirname(os.path.realpath(tui.__file__)) + os.sep)
    return tuple(sorted(d for d in dirs if d))


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
_verdicts: dict[CodeType, bool] = {}
_lock = threading.Lock()


def _own() -> tuple[str, ...]:
    global _own_dirs
    if _own_dirs is None:
        _own_dirs = own_dirs()
    return _own_dirs


def is_own_file(filename: str) -> bool:
    """True when ``filename`` is tpu_debug's own code (the one test of "is this frame ours")."""
    return os.path.realpath(filename).startswith(_own())


def is_library_file(filename: str) -> bool:
    """True when ``filename`` belongs to torch, jax, tpu_debug or the standard library."""
    global _roots
    if _roots is None:
        with _lock:
            if _roots is None:
                _roots = library_roots()
    if filename.startswith("<"):
        # "<frozen runpy>" is the stdlib; "<string>", "<stdin>", cells are the user's
        return filename.startswith("<frozen ")
    libs, site, stdlib = _roots
    path = os.path.realpath(filename)
    if path.startswith(libs):
        return True
    if path.startswith(site):
        return False  # third-party code (site-packages sits inside the stdlib tree)
    return path.startswith(stdlib)


def _is_library(code: CodeType) -> bool:
    verdict = _verdicts.get(code)
    if verdict is None:
        verdict = is_library_file(code.co_filename)
        _verdicts[code] = verdict
    return verdict  # type: ignore[return-value]


_interned: dict[tuple[str, int, str], SourceLocation] = {}


def location_of(frame: FrameType) -> SourceLocation:
    """The SourceLocation of ``frame`` (interned: one object per distinct line)."""
    code = frame.f_code
    key = (code.co_filename, frame.f_lineno, code.co_qualname)
    loc = _interned.get(key)
    if loc is None:
        loc = _interned.setdefault(key, SourceLocation(*key))
    return loc


def user_location(depth: int = 1) -> SourceLocation | None:
    """The first frame of user code above the caller, or None when there is none.

    Args:
        depth: frames to skip before looking (1 skips the caller itself).

    Returns:
        The user line, e.g. ``SourceLocation("train.py", 42, "step")``.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        if not _is_library(frame.f_code):
            return location_of(frame)
        frame = frame.f_back
    return None
