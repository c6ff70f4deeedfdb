"""The layers install as subpackages of one distribution, from a built wheel too."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from wheel_build import built_wheel

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    """pyproject.toml lists the packages (setuptools cannot find them under remapped folders):
    every folder with an ``__init__.py`` under a package-dir root, and nothing else."""
    folders = {".".join((package, *init.parent.relative_to(ROOT / folder).parts))
               for package, folder in SETUPTOOLS["package-dir"].items()
               for init in (ROOT / folder).rglob("__init__.py")}
    assert sorted(folders) == SETUPTOOLS["packages"], "list each package in pyproject.toml's packages, sorted"


def test_wheel_installs_and_runs(tmp_path):
    wheel = built_wheel()
    names = set(zipfile.ZipFile(wheel).namelist())
    # every source file of the checkout is in the wheel, at the path its package-dir root gives
    for package, folder in SETUPTOOLS["package-dir"].items():
        for source in (ROOT / folder).rglob("*.py"):
            expected = "/".join((*package.split("."), *source.relative_to(ROOT / folder).parts))
            assert expected in names, f"{source.relative_to(ROOT)} is not in the wheel"
    for expected in ("tpu_debug/py.typed", "tpu_debug/tui/app.tcss", "tpu_debug_torch_tpu.pth"):
        assert expected in names, expected
    # the package and the .pth are all the wheel puts at the top of site-packages
    assert {name.split("/")[0] for name in names if not name.startswith("tpu_debug-")} == {
        "tpu_debug", "tpu_debug_torch_tpu.pth"}
    target = tmp_path / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    # every module the installed package holds imports (a subpackage left out of the wheel fails
    # here as ModuleNotFoundError in the module that imports it), then an op runs on the device
    code = (
        "import importlib, pkgutil, tpu_debug, torch, sys;"
        "assert tpu_debug.__file__.startswith(sys.argv[1]), tpu_debug.__file__;"
        "names = [m.name for p in (tpu_debug,)"
        " for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.') if not m.name.endswith('.__main__')];"
        "[importlib.import_module(n) for n in names];"
        "print(len(names));"
        "print((torch.ones(3, device='tpu') * 2).sum().item());"
        # (a --target install processes no .pth: the device's registration installs the finder)
        "from torch_tpu import api; assert api.tpu_device() == torch.device('tpu', 0)"
    )
    # run from tmp_path with only the wheel's copy on the path (not the editable checkout)
    run = subprocess.run(
        [sys.executable, "-c", code, str(target)], check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    *_, imported, result = run.stdout.strip().splitlines()
    top = ("tpu_debug/",)
    sources = [p for p in names if p.endswith(".py") and p.startswith(top) and "__main__" not in p
               and not p.endswith("__init__.py")]
    packages = [p for p in names if p.endswith("/__init__.py") and p.startswith(top)]
    # the top package is not among walk_packages' names; its subpackages and modules are
    assert int(imported) == len(sources) + len(packages) - 1
    assert result == "6.0"
