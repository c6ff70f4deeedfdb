"""How every renderer writes a size, a duration and a source line.

The report, ``tpu-debug diff``, the TUI, fit's answers and the advisor's findings all show
the same figures; one function per kind keeps ``15.75 GiB`` from reading ``15.8 GiB`` in
one place and ``16.1 GB`` in another. Standard library only, so every layer may use it.
"""

from __future__ import annotations

import os

__all__ = ["format_bytes", "format_count", "format_location", "format_seconds", "short_path"]

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float | None) -> str:
    """``512 B``, ``19.50 KiB``, ``72.00 MiB``, ``15.75 GiB`` (binary units; a negative size keeps
    its sign; ``-`` for an unknown size).

    Two decimals because a TPU's usable HBM differs from the spec sheet in the second one
    (a v5e offers 15.75 of its 16 GiB).

    Example:
        >>> format_bytes(15.75 * 1024**3)
        '15.75 GiB'
    """
    if n is None:
        return "-"
    sign, value = ("-" if n < 0 else ""), abs(float(n))
    if value < 1024:
        return f"{sign}{value:.0f} B"
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    return f"{sign}{value:.2f} {unit}"


def format_count(n: int | float) -> str:
    """A count people read at a glance: ``950``, ``107K``, ``8.03B`` (decimal units, three
    significant digits).

    Example:
        >>> format_count(106816), format_count(8_030_261_248), format_count(950)
        ('107K', '8.03B', '950')
    """
    value = float(n)
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        # 999,999 is 1M rather than 1e+03K: a value that rounds up to the next unit takes it
        if abs(value) >= size * 0.9995:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def format_seconds(seconds: float | None) -> str:
    """``12.5 µs``, ``3.25 ms``, ``1.50 s`` (``-`` for an unknown time).

    Example:
        >>> format_seconds(0.00325)
        '3.25 ms'
    """
    if seconds is None:
        return "-"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def short_path(file: str, cwd: str | None) -> str:
    """``file`` relative to ``cwd`` (the run's working directory) when it lies under it."""
    if cwd and os.path.isabs(file):
        try:
            rel = os.path.relpath(file, cwd)
        except ValueError:  # another drive
            return file
        if not rel.startswith(".."):
            return rel
    return file


def format_location(
    file: str | None,
    line: int | None,
    function: str | None = None,
    *,
    cwd: str | None = None,
    full: bool = False,
) -> str:
    """``train.py:12``, or ``train.py:12 in step`` with the function (``-`` with no file).

    The path is the file's name alone, unless ``full`` (the whole path) or ``cwd`` (the
    path relative to the run's working directory when the file lies under it, else the
    whole path) is given.

    Example:
        >>> format_location("/home/me/train.py", 12, "step")
        'train.py:12 in step'
    """
    if not file:
        return "-"
    path = short_path(file, cwd) if cwd or full else os.path.basename(file)
    text = f"{path}:{line}"
    return f"{text} in {function}" if function else text
