"""The layers install as subpackages of one distribution, from a built wheel too."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("tpu_debug-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("tpu_debug/__init__.py", "tpu_debug/runtime/eager.py", "tpu_debug/runtime/ops/registry.py",
                     "tpu_debug/tracers/store.py", "tpu_debug/cli/__init__.py", "tpu_debug/py.typed"):
        assert expected in names, expected
    target = tmp_path / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    code = (
        "import tpu_debug, torch, sys;"
        "assert tpu_debug.__file__.startswith(sys.argv[1]), tpu_debug.__file__;"
        "print((torch.ones(3, device='tpu') * 2).sum().item())"
    )
    # run from tmp_path with only the wheel's copy on the path (not the editable checkout)
    run = subprocess.run(
        [sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "6.0"
