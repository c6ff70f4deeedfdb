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

__all__ = ["user_location", "is_library_file", "library_roots"]


def _package_dir(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = __import__(module_name)
        except ImportError:
            return None
    file = getattr(module, "__file__", None)
    return os.path.dirname(os.path.realpath(file)) + os.sep if file else None


def _tpu_debug_dirs() -> list[str]:
    import tpu_debug.runtime
    import tpu_debug.tracers

    import tpu_debug

    dirs = {_package_dir("tpu_debug")}
    for module in (tpu_debug.runtime, tpu_debug.tracers):
        dirs.add(os.path.dirname(os.path.realpath(module.__file__)) + os.sep)
    tui = sys.modules.get("tpu_debug.tui")
    if tui is not None and getattr(tui, "__file__", None):
        dirs.add(os.path.dirname(os.path.realpath(tui.__file__)) + os.sep)
    return sorted(d for d in dirs if d)


def library_roots() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(library package dirs, site-packages dirs, stdlib dirs), each ending in ``os.sep``."""
    libs = [d for d in (_package_dir(m) for m in ("torch", "jax", "jaxlib")) if d]
    libs.extend(_tpu_debug_dirs())
    paths = sysconfig.get_paths()
    site = {os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib")}
    stdlib = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")}
    return tuple(libs), tuple(site), tuple(stdlib)


_roots: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None = None
_verdicts: dict[CodeType, bool] = {}
_lock = threading.Lock()


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
