"""Packages are found, not listed: every folder with an ``__init__.py`` under a root that
``pyproject.toml`` maps in ``[tool.setuptools.package-dir]`` (all other metadata lives there).

setuptools' own discovery cannot follow a mapping whose folder name differs from the package
name (``tpu_debug.runtime`` lives in ``runtime/``), so the walk is done here.

The wheel also carries ``tpu_debug_torch_tpu.pth`` at the top of site-packages: Python runs
its one line at start-up (``import tpu_debug_torch_tpu`` where that module can be found: an
environment it was uninstalled from without the ``.pth`` prints no error), which installs the finder that
answers ``import torch_tpu`` where TorchTPU is not installed. setuptools has no option for a
``.pth`` file, so ``build_py`` copies it into the build, and for an editable install into
the folder that install writes as it is.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PTH = "tpu_debug_torch_tpu.pth"


def find_packages(package_dir: dict[str, str]) -> list[str]:
    packages = []
    for root, folder in package_dir.items():
        base = HERE / folder
        for init in sorted(base.rglob("__init__.py")):
            relative = init.parent.relative_to(base)
            packages.append(".".join((root, *relative.parts)))
    return sorted(set(packages))


class BuildWithPth(build_py):
    """``build_py`` that also puts the ``.pth`` file at the top of the build."""

    def run(self) -> None:
        super().run()
        folders = [Path(self.build_lib)]
        if getattr(self, "editable_mode", False):
            # an editable wheel holds the build's modules as a finder, and takes files as they
            # are only from the folder the install command writes to: put the .pth there too
            folders.append(Path(self.distribution.get_command_obj("install").install_lib))
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / PTH, folder / PTH)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), str(Path(self.build_lib) / PTH): str(HERE / PTH)}


package_dir = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
setup(packages=find_packages(package_dir), cmdclass={"build_py": BuildWithPth})
