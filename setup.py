"""The one job ``pyproject.toml`` cannot do: put ``tpu_debug_torch_tpu.pth`` at the top of
site-packages (setuptools has no option for a ``.pth`` file; all else is in ``pyproject.toml``).

Python runs the file's one line at start-up: it imports :mod:`tpu_debug.core.torch_tpu_finder`,
which installs the finder that answers ``import torch_tpu`` where TorchTPU is not installed;
in an environment tpu_debug was uninstalled from without the ``.pth``, the line does nothing.
``build_py`` writes the file into the build, and for an editable install into the folder
that install writes as it is.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tpu_debug_torch_tpu.pth"
# Python runs a .pth line that starts with "import"; exec gives that one line its guard
PTH_LINE = 'import sys; exec("try:\\n    import tpu_debug.core.torch_tpu_finder\\nexcept ImportError:\\n    pass")\n'


class BuildWithPth(build_py):
    """``build_py`` that also writes the ``.pth`` file at the top of the build."""

    def run(self) -> None:
        super().run()
        folders = [Path(self.build_lib)]
        if getattr(self, "editable_mode", False):
            # an editable wheel holds the build's modules as a finder, and takes files as they
            # are only from the folder the install command writes to: put the .pth there too
            folders.append(Path(self.distribution.get_command_obj("install").install_lib))
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / PTH).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildWithPth})
