"""tests/warm_python.py against ``subprocess.run``: a program forked from the warm interpreter sees
what a fresh interpreter gives it (the reference is a fresh ``python`` run the same way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import warm_python

# what a program can see of how it was started
PROBE = textwrap.dedent("""
    import json, os, sys
    import __main__
    from jax._src import xla_bridge
    seen = {
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "var": os.environ.get("WARM_PROBE"),
        "flags": os.environ.get("XLA_FLAGS"),
        "main_file": getattr(__main__, "__file__", None),
        "name": __name__,
        "backend_started_before": xla_bridge.backends_are_initialized(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
    }
    import jax
    seen["devices"] = len(jax.devices())
    print(json.dumps(seen))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[-1]))
""")


def _both(cmd, **kwargs):
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs)
    warm = warm_python.run(cmd, timeout=300, **kwargs)
    return fresh, warm


def test_a_script_sees_what_a_fresh_interpreter_gives_it(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, WARM_PROBE="yes", XLA_FLAGS="--xla_force_host_platform_device_count=3")
    fresh, warm = _both([sys.executable, str(script), "a b", "3"], cwd=tmp_path, env=env)
    assert (warm.returncode, warm.stderr.splitlines()[-1:]) == (fresh.returncode, fresh.stderr.splitlines()[-1:]) \
        == (3, ["to stderr"]), warm.stderr
    seen, expected = json.loads(warm.stdout), json.loads(fresh.stdout)
    assert seen.pop("pgid_is_pid")  # the fork leads a process group of its own: a timeout kills it all
    expected.pop("pgid_is_pid")
    assert seen == expected
    assert seen["devices"] == 3 and not seen["backend_started_before"]


def test_a_module_and_code_run_as_python_runs_them(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    # the environment of the test above (its XLA_FLAGS aside, read at run time): its warm
    # interpreter serves this program too, rather than one more started for a new value
    env = dict(os.environ, WARM_PROBE="yes")
    fresh, warm = _both([sys.executable, "-m", "probe_mod", "0"], cwd=tmp_path, env=env)
    assert warm.returncode == fresh.returncode == 0, warm.stderr
    seen, expected = json.loads(warm.stdout), json.loads(fresh.stdout)
    seen.pop("pgid_is_pid"), expected.pop("pgid_is_pid")
    assert seen == expected
    code = "import sys; print(sys.argv, sys.path[0] == ''); raise ValueError('boom')"
    fresh, warm = _both([sys.executable, "-c", code, "x"], cwd=tmp_path)
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout) == (1, "['-c', 'x'] True\n")
    assert warm.stderr == fresh.stderr  # the traceback starts at the program, as the interpreter's does


def test_a_timeout_kills_the_program_and_keeps_its_output(tmp_path):
    code = "import time; print('started', flush=True); time.sleep(600)"
    with pytest.raises(subprocess.TimeoutExpired, match="timed out after 5 seconds") as raised:
        warm_python.run([sys.executable, "-c", code], cwd=tmp_path, timeout=5)
    assert raised.value.output == "started\n"
    # the warm interpreter serves the next program
    assert warm_python.run([sys.executable, "-c", "print(6 * 7)"], cwd=tmp_path).stdout == "42\n"


def test_a_variable_read_at_import_is_read_by_the_imports(tmp_path):
    # the command's environment differs in a variable jax reads when imported: it gets a warm
    # interpreter that imported jax with it
    code = "import jax; print(jax.config.jax_enable_x64)"
    env = dict(os.environ, JAX_ENABLE_X64="1")
    assert warm_python.run([sys.executable, "-c", code], cwd=tmp_path, env=env).stdout == "True\n"
