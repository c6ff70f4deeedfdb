"""Helpers of the tracer tests: a line of a test's own source (the reference a finding's
location is checked against) and a package installed in a site-packages tree."""

from __future__ import annotations

import inspect
import sys
import textwrap


def line_of(fn, text: str) -> int:
    """The line of ``fn``'s source holding ``text`` (read from the file)."""
    lines, first = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return first + offset


def installed(root, name: str, source: str):
    """A package installed in a site-packages tree under ``root`` (as transformers is)."""
    pkg = root / "lib" / "python3.11" / "site-packages" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(pkg.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(pkg.parent))
