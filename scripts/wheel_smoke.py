"""Install tpu_debug from a built wheel, as a user who installs a release would, and use it.

CI runs this before the test suite, which only ever sees an editable install: a module
that the wheel leaves out, or a data file it forgets, shows up here and nowhere else.

Steps: build the wheel; make a fresh virtual environment that sees the already-installed
dependencies (torch, jax, ...) but not this checkout; install the wheel there without
dependencies; then, from a directory outside the checkout, import every module that
``pkgutil.walk_packages`` finds in the installed package, print every verb's ``--help``, run
the main job (``tpu-debug run examples/mlp_train.py``, with ``examples/`` taken from the
checkout, as README tells a wheel's user to take it from a clone), a test through the pytest
plugin, and every other CLI verb once; the second run reads its programs back from the compile cache and counts none of them
as a compile or a recompile. Last, every command README.md and docs/*.md show is validated
by the wheel's own parsers and the quick ones are run (``scripts/doc_commands.py``; the
slow test ``tests/test_docs_from_wheel.py`` runs the rest).

Usage: ``python scripts/wheel_smoke.py`` (exit status 0 when every step passed).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import doc_commands

ROOT = Path(__file__).resolve().parents[1]
# README's commands for the main job: with a TensorBoard profile, and the run a second run reads back
TENSORBOARD_RUN = ["tpu-debug", "run", "--tensorboard", "examples/mlp_train.py"]
MAIN_RUN = ["tpu-debug", "run", "examples/mlp_train.py"]

# a TorchTPU script's first line, before torch: the wheel's .pth installed the finder at start-up
TORCH_TPU_FIRST = """
import sys
import torch_tpu
assert "torch" not in sys.modules
from torch_tpu import api
import torch
print((torch.ones(2, device=api.tpu_device()) * 2).sum().item())
"""

IMPORT_ALL = """
import importlib, pkgutil, sys
import tpu_debug
assert tpu_debug.__file__.startswith(sys.prefix), ("not the wheel's copy", tpu_debug.__file__)
# a __main__ module runs the command line when imported: it is run by 'python -m', not imported
names = [m.name for m in pkgutil.walk_packages(tpu_debug.__path__, "tpu_debug.")
         if not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), "modules imported from", tpu_debug.__file__)
"""

# the pytest plugin, loaded by its entry point: its fixture records the test and checks its syncs
PLUGIN_TEST = """
import torch

def test_through_the_plugin(request, tpu_debug_no_implicit_syncs):
    assert request.config.pluginmanager.has_plugin("tpu_debug_pytest")
    assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2.0, 2.0, 2.0]
"""

def step(title: str, argv: list[str], *, cwd: Path, env: dict[str, str], stderr: bool = False) -> str:
    """Run one step; its stdout (and its stderr after it, with ``stderr``)."""
    shown = [arg if "\n" not in arg else "<code>" for arg in argv]
    print(f"--- {title}: {' '.join(shown)}", flush=True)
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-4000:])
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(f"wheel smoke: '{title}' exited with {result.returncode}")
    return result.stdout + (result.stderr if stderr else "")


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True)
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = out.glob("tpu_debug-*.whl")
    return wheel


def make_env(where: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    # the dependencies come from the environment that runs this script, the package from the wheel
    target = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    Path(target, "_smoke_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    return where / "bin"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tpu_debug_wheel_") as tmp:
        tmp_path = Path(tmp)
        wheel = build_wheel(tmp_path / "dist")
        bindir = make_env(tmp_path / "venv", wheel)
        work = tmp_path / "work"
        work.mkdir()
        shutil.copytree(ROOT / "examples", work / "examples")  # not in the wheel: from a clone
        env = {key: value for key, value in os.environ.items() if not key.startswith("TPU_DEBUG_")}
        env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1",
                   TPU_DEBUG_LOGDIR=str(work / "runs"))
        env.pop("PYTHONPATH", None)
        tool = str(bindir / "tpu-debug")
        print(step("import every module", [str(bindir / "python"), "-c", IMPORT_ALL], cwd=work, env=env).strip())
        shown = step("import torch_tpu first", [str(bindir / "python"), "-c", TORCH_TPU_FIRST], cwd=work, env=env)
        if shown.strip() != "4.0":
            raise SystemExit(f"wheel smoke: a TorchTPU script's first lines printed {shown.strip()!r}, not 4.0")
        (work / "test_plugin_smoke.py").write_text(PLUGIN_TEST)
        # the .pth imported tpu_debug before pytest could rewrite it: an error if pytest warns
        pytest_argv = ["-m", "pytest", "-p", "no:cacheprovider", "-W", "error::pytest.PytestAssertRewriteWarning"]
        shown = step("pytest plugin", [str(bindir / "python"), *pytest_argv, "test_plugin_smoke.py"], cwd=work, env=env)
        if "1 passed" not in shown:
            raise SystemExit(f"wheel smoke: the test through the pytest plugin did not pass:\n{shown}")
        step("--version", [tool, "--version"], cwd=work, env=env)
        for verb in ("run", "report", "runs", "tui", "tensorboard", "diff", "import-trace", "fit"):
            shown = step(f"{verb} --help", [tool, verb, "--help"], cwd=work, env=env)
            assert f"usage: tpu-debug {verb}" in shown, shown
        env["TPU_DEBUG_COMPILE_CACHE_DIR"] = str(tmp_path / "compile_cache")
        # README's own two runs of the main job, word for word (the documented-command check
        # below counts them as run)
        first_run = doc_commands.RUN_DIR.search(step("run (the main job)", [tool, *TENSORBOARD_RUN[1:]],
                                                     cwd=work, env=env, stderr=True)).group(1)
        second_run = doc_commands.RUN_DIR.search(step("run again", [tool, *MAIN_RUN[1:]],
                                                      cwd=work, env=env, stderr=True)).group(1)
        second = json.loads(step("report --json (the second)", [tool, "report", "--json", second_run],
                                 cwd=work, env=env))
        # every program read back from the cache: no compile, and no recompile either
        assert second["compiles"]["count"] == 0 and second["recompiles"]["count"] == 0, second["recompiles"]
        runs = step("runs", [tool, "runs"], cwd=work, env=env)
        assert Path(first_run).name in runs and Path(second_run).name in runs, runs
        step("report", [tool, "report", first_run], cwd=work, env=env)
        data = json.loads(step("report --json", [tool, "report", "--json"], cwd=work, env=env))
        assert data["schema"].startswith("tpu_debug.report/"), data.get("schema")
        step("diff", [tool, "diff", first_run, second_run], cwd=work, env=env)
        step("tensorboard --print", [tool, "tensorboard", "--print", first_run], cwd=work, env=env)
        print(step("tui", [str(bindir / "python"), "-c", doc_commands.TUI_IN_PTY, tool, "tui", first_run],
                   cwd=work, env=env).strip())
        # every command README.md and docs/ show: validated, and the quick ones run, in the
        # same directory (the compile cache is shared: the examples' programs read back)
        outcomes = doc_commands.check(bindir, work, env, full=False,
                                      done={" ".join(TENSORBOARD_RUN): "the main job", " ".join(MAIN_RUN): "run again"})
        failed = [o for o in outcomes if not o.ok]
        ran = [o for o in outcomes if o.how == "run"]
        print(f"documented commands: {len(outcomes)}, {len(ran)} run ({sum(o.seconds for o in ran):.0f} s, "
              f"{sum(o.cpu for o in ran):.0f} s CPU), "
              f"{len(outcomes) - len(ran) - len(failed)} validated or run above, {len(failed)} broken")
        if failed:
            for o in failed:
                print(f"BROKEN {o.command}: {o.note}")
            raise SystemExit(f"wheel smoke: {len(failed)} documented command(s) broken")
    print("wheel smoke: every step passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
