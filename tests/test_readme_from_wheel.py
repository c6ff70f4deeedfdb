"""README's commands from an installed wheel, outside the checkout, as a user who installed a
release runs them: the wheel's own copy on the path, examples/ taken from where README says."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel_build import built_wheel

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
VERBS = ("run", "report", "runs", "tui", "tensorboard", "diff", "import-trace", "import-fr", "fit")


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> tuple[Path, set[str]]:
    """The wheel installed into a directory of its own, and the wheel's file names."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = built_wheel()
    site = tmp / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return site, set(zipfile.ZipFile(wheel).namelist())


@pytest.fixture(scope="module")
def first_run(wheel_site, tmp_path_factory) -> tuple[Path, dict[str, str], subprocess.CompletedProcess]:
    """README's run of mlp_train.py from the wheel in a work folder with examples/ copied from the
    checkout, with the compile cache on (its default) in a folder of its own: the first run, whose
    output one test reads and whose cache the other's second run reads back."""
    site, _ = wheel_site
    work = tmp_path_factory.mktemp("first") / "work"
    shutil.copytree(ROOT / "examples", work / "examples")  # from a clone, as README says
    env = {"TPU_DEBUG_LOGDIR": str(work / "runs"), "TPU_DEBUG_COMPILE_CACHE": "1",
           "TPU_DEBUG_COMPILE_CACHE_DIR": str(work.parent / "cache")}
    return work, env, _tool(site, work, "run", "examples/mlp_train.py", **env)


def _tool(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") and k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "tpu_debug", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
        check=False, env={**keep, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1", **env},
    )


def test_examples_not_in_the_wheel_while_readme_uses_them(wheel_site, first_run):
    site, names = wheel_site
    # README runs examples/ and tlparse: it says where each comes from when the wheel has neither
    assert "examples/mlp_train.py" in README
    if not any(n.startswith("examples/") or "/examples/" in n for n in names):
        assert re.search(r"`examples/`[^.]*is in the repository, not in the wheel", README), (
            "the wheel has no examples/: README must say where they are")
    if "tlparse" in README:
        assert "pip install tlparse" in README, "README uses tlparse: it must say how to install it"
    work, _, where = first_run
    assert where.returncode == 0, where.stderr[-3000:]
    out = where.stdout + where.stderr
    assert "loss curves match CPU" in out and "\nFindings\nnothing to fix" in out, out[-3000:]
    # the run was made by the wheel's copy, not the checkout's
    probe = subprocess.run(
        [sys.executable, "-c", "import tpu_debug; print(tpu_debug.__file__)"], cwd=work, capture_output=True,
        text=True, check=False, env={**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"},
    )
    assert probe.stdout.strip().startswith(str(site)), probe.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_every_verbs_help_from_the_wheel(wheel_site, tmp_path, verb):
    # README sends users to `tpu-debug run --help` for the run flags. The three forms run in one
    # process per verb, each as `python -m tpu_debug` runs the wheel's __main__ (runpy), the one
    # that names a script first, as in a fresh process
    site, _ = wheel_site
    keep = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") and k != "PYTHONPATH"}
    forms = [[verb, *args] for args in (["-h", "nosuch"], ["-h"], ["--help"])]
    proc = subprocess.run(
        [sys.executable, "-c", _HELP_FORMS, json.dumps(forms)], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, check=False, env={**keep, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for argv, code, out, err, where in json.loads(proc.stdout):
        assert where.startswith(str(site)), where  # the wheel's copy, not the checkout's
        assert code in (0, None) and f"usage: tpu-debug {verb}" in out, (argv, code, err)


_HELP_FORMS = """
import contextlib, io, json, runpy, sys
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["tpu_debug", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("tpu_debug", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code
    done.append((argv, code, out.getvalue(), err.getvalue(), sys.modules["tpu_debug"].__file__))
print(json.dumps(done))
"""


def test_second_run_from_the_wheel_counts_read_backs_apart(wheel_site, first_run):
    # README: a second run of mlp_train.py compiles nothing; what it read back is not a recompile
    site, _ = wheel_site
    work, env, first = first_run  # the first run filled the cache
    assert first.returncode == 0, first.stderr[-3000:]
    done = _tool(site, work, "run", "--no-report", "--name", "second", "examples/mlp_train.py", **env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = _tool(site, work, "report", "--json", "second", **env)
    assert report.returncode == 0, report.stderr[-2000:]
    data = json.loads(report.stdout)
    assert data["compiles"]["count"] == 0, data["compiles"]
    assert data["recompiles"]["count"] == 0, data["recompiles"]
