"""Packages are found, not listed: every folder with an ``__init__.py`` under a root that
``pyproject.toml`` maps in ``[tool.setuptools.package-dir]`` (all other metadata lives there).

setuptools' own discovery cannot follow a mapping whose folder name differs from the package
name (``tpu_debug.runtime`` lives in ``runtime/``), so the walk is done here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def find_packages(package_dir: dict[str, str]) -> list[str]:
    packages = []
    for root, folder in package_dir.items():
        base = HERE / folder
        for init in sorted(base.rglob("__init__.py")):
            relative = init.parent.relative_to(base)
            packages.append(".".join((root, *relative.parts)))
    return sorted(set(packages))


package_dir = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
setup(packages=find_packages(package_dir))
