"""Install tpu_debug from a built wheel, as a user who installs a release would, and use it.

CI runs this before the test suite, which only ever sees an editable install: a module
that the wheel leaves out, or a data file it forgets, shows up here and nowhere else.

Steps: build the wheel; make a fresh virtual environment that sees the already-installed
dependencies (torch, jax, ...) but not this checkout; install the wheel there without
dependencies; then, from a directory outside the checkout, import every module that
``pkgutil.walk_packages`` finds in the installed package, print every verb's ``--help``, run
the main job (``tpu-debug run examples/mlp_train.py``, with ``examples/`` taken from the
checkout, as README tells a wheel's user to take it from a clone) and every other CLI verb
once; the second run reads its programs back from the compile cache and counts none of them
as a compile or a recompile.

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

ROOT = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, pkgutil, sys
import tpu_debug
assert tpu_debug.__file__.startswith(sys.prefix), ("not the wheel's copy", tpu_debug.__file__)
names = ["tpu_debug_launcher", "tpu_debug_pytest"]
# a __main__ module runs the command line when imported: it is run by 'python -m', not imported
names += [m.name for m in pkgutil.walk_packages(tpu_debug.__path__, "tpu_debug.")
          if not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), "modules imported from", tpu_debug.__file__)
"""

# the TUI needs a terminal: run it in a pseudo-terminal and quit it with 'q' once it has drawn
TUI_IN_PTY = """
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(TERM="xterm-256color", COLUMNS="120", LINES="40")
    os.execvp(sys.argv[1], sys.argv[1:])
seen, deadline, quit_sent = b"", time.monotonic() + 120, False
while time.monotonic() < deadline:
    ready, _, _ = select.select([fd], [], [], 0.5)
    if ready:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    if not quit_sent and b"Findings" in seen:
        os.write(fd, b"q")
        quit_sent = True
_, status = os.waitpid(pid, 0)
ok = quit_sent and os.waitstatus_to_exitcode(status) == 0
print("tui drew its overview and quit" if ok else "tui failed: " + repr(seen[-500:]))
sys.exit(0 if ok else 1)
"""


def step(title: str, argv: list[str], *, cwd: Path, env: dict[str, str]) -> str:
    shown = [arg if "\n" not in arg else "<code>" for arg in argv]
    print(f"--- {title}: {' '.join(shown)}", flush=True)
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-4000:])
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(f"wheel smoke: '{title}' exited with {result.returncode}")
    return result.stdout


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
        step("--version", [tool, "--version"], cwd=work, env=env)
        for verb in ("run", "report", "runs", "tui", "tensorboard", "diff", "import-trace", "fit"):
            shown = step(f"{verb} --help", [tool, verb, "--help"], cwd=work, env=env)
            assert f"usage: tpu-debug {verb}" in shown, shown
        env["TPU_DEBUG_COMPILE_CACHE_DIR"] = str(tmp_path / "compile_cache")
        step("run (the main job)", [tool, "run", "--tensorboard", "--name", "first", "examples/mlp_train.py"],
             cwd=work, env=env)
        step("run again", [tool, "run", "--name", "second", "examples/mlp_train.py"], cwd=work, env=env)
        second = json.loads(step("report --json second", [tool, "report", "--json", "second"], cwd=work, env=env))
        # every program read back from the cache: no compile, and no recompile either
        assert second["compiles"]["count"] == 0 and second["recompiles"]["count"] == 0, second["recompiles"]
        runs = step("runs", [tool, "runs"], cwd=work, env=env)
        assert "first" in runs and "second" in runs, runs
        step("report", [tool, "report", "first"], cwd=work, env=env)
        data = json.loads(step("report --json", [tool, "report", "--json"], cwd=work, env=env))
        assert data["schema"].startswith("tpu_debug.report/"), data.get("schema")
        step("diff", [tool, "diff", "first", "second"], cwd=work, env=env)
        step("tensorboard --print", [tool, "tensorboard", "--print", "first"], cwd=work, env=env)
        print(step("tui", [str(bindir / "python"), "-c", TUI_IN_PTY, tool, "tui", "first"],
                   cwd=work, env=env).strip())
    print("wheel smoke: every step passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
