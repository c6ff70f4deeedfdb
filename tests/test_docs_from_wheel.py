"""Every command README.md and docs/*.md show, checked as a user who installed the wheel runs
it (``scripts/doc_commands.py``): read from the documents' text, each one has a plan (run,
run by the full check only, never run for a stated reason, or a form the reader completes),
and each is validated by the real parsers and against the files, extras, markers and
variables it names. CI's wheel smoke (``scripts/wheel_smoke.py``) runs the quick ones from
the wheel; the ``slow`` test here runs the slow ones too."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


doc_commands = _load("doc_commands")


def test_every_documented_command_has_a_plan():
    found = doc_commands.commands()
    assert len(found) > 50, "the documents show far more commands than were found: is the reader broken?"
    unplanned = [str(c) for c in found if doc_commands.plan(c) is None]
    assert not unplanned, f"add each to RUN, SLOW or NEVER in scripts/doc_commands.py: {unplanned}"
    # commands README's main job and its sections promise are run in CI, not only validated
    ran = {c.text for c in found if doc_commands.plan(c).how == "run"}
    assert {"tpu-debug run examples/mlp_train.py", "tpu-debug tui",
            "torchrun --nproc-per-node 2 examples/distributed/ddp_train.py"} <= ran


def test_the_tables_name_only_commands_the_documents_show():
    shown = {c.text for c in doc_commands.commands()}
    for table in (doc_commands.RUN, doc_commands.SLOW, doc_commands.NEVER):
        stale = sorted(set(table) - shown)
        assert not stale, f"no document shows these any more: {stale}"
    assert not set(doc_commands.RUN) & set(doc_commands.SLOW) & set(doc_commands.NEVER)


@pytest.fixture
def work(tmp_path) -> Path:
    """A user's directory: examples/ taken from the clone, as README says."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def test_every_documented_command_validates(work):
    # the checkout's own parsers here (the wheel smoke validates with the wheel's)
    problems = doc_commands.validate(doc_commands.commands(), Path(sys.executable), ROOT, work)
    broken = {str(c): p for c, p in problems.items() if p}
    assert not broken, broken


def _docs(root: Path, readme: str, doc: str = "") -> Path:
    root.mkdir(exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy(ROOT / "constraints.txt", root / "constraints.txt")
    (root / "README.md").write_text(textwrap.dedent(readme))
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text(textwrap.dedent(doc))
    return root


def test_commands_are_read_as_the_documents_write_them(tmp_path):
    root = _docs(tmp_path, """\
        # demo

        ```bash
        # a comment line
        $ pip install -q -c constraints.txt -e . && tpu-debug run examples/mlp_train.py   # and a comment
        tpu-debug report \\
            --json
        ```

        ```text
        tpu-debug run this-is-output.py
        ```

        Try `tpu-debug run --divergence
        --numerics tpu examples/pitfalls/bf16_drift.py` and `torch.compile` (not a command).

            $ python scripts/op_coverage.py --check
        """, """\
        ```
        tpu-debug fit llama3-8b --target v5e-8
        core/    not a command
        ```
        """)
    found = [(c.doc, c.line, c.text, c.inline) for c in doc_commands.commands(root)]
    assert found == [
        ("README.md", 5, "pip install -q -c constraints.txt -e .", False),
        ("README.md", 5, "tpu-debug run examples/mlp_train.py", False),
        ("README.md", 6, "tpu-debug report --json", False),
        ("README.md", 14, "tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py", True),
        ("README.md", 17, "python scripts/op_coverage.py --check", False),
        ("docs/guide.md", 2, "tpu-debug fit llama3-8b --target v5e-8", False),
    ]


def test_a_broken_documented_command_is_found(tmp_path, work, monkeypatch):
    # each line is broken in one way the check must name
    root = _docs(tmp_path / "clone", """\
        ```bash
        tpu-debug run --no-such-flag examples/mlp_train.py
        tpu-debug run examples/no_such_example.py
        tpu-debug reprot
        tpu-debug run --memory-typo script.py
        torchrun --nproc-per-node 2 examples/no_such.py
        TPU_DEBUG_NO_SUCH_VARIABLE=1 tpu-debug run examples/mlp_train.py
        pip install -q -c constraints.txt -e ".[no-such-extra]"
        python -m pytest -m "not sloow" tests/no_such_dir
        python scripts/no_such_tool.py
        ```

        Under `torchrun --nproc-per-node N tpu-debug run script.py` each rank records.
        """)
    (root / "scripts").mkdir()
    for table in ("RUN", "SLOW", "NEVER"):
        monkeypatch.setattr(doc_commands, table, {})
    found = doc_commands.commands(root)
    # a concrete command no table names is refused: the check must say how it is checked
    concrete = [c.text for c in found if doc_commands.plan(c) is None]
    assert "tpu-debug run --no-such-flag examples/mlp_train.py" in concrete
    monkeypatch.setattr(doc_commands, "RUN", dict.fromkeys(concrete, 0))
    problems = doc_commands.validate(found, Path(sys.executable), root, work)
    said = {c.text: "; ".join(p) for c, p in problems.items()}
    # forms: the verb and the flags they name
    assert "no verb 'reprot'" in said["tpu-debug reprot"]
    assert "tpu-debug run has no --memory-typo" in said["tpu-debug run --memory-typo script.py"]
    assert "torchrun runs tpu-debug only with --no-python" in said[
        "torchrun --nproc-per-node N tpu-debug run script.py"]
    # commands: the real parsers, then the files, extras, markers and variables they name
    assert "unrecognized arguments: --no-such-flag" in said["tpu-debug run --no-such-flag examples/mlp_train.py"]
    assert "no script examples/no_such_example.py" in said["tpu-debug run examples/no_such_example.py"]
    assert "no such file" in said["torchrun --nproc-per-node 2 examples/no_such.py"]
    assert "no extra 'no-such-extra'" in said['pip install -q -c constraints.txt -e ".[no-such-extra]"']
    pytest_said = said['python -m pytest -m "not sloow" tests/no_such_dir']
    assert "no pytest marker 'sloow'" in pytest_said and "no tests/no_such_dir in the clone" in pytest_said
    assert "no scripts/no_such_tool.py" in said["python scripts/no_such_tool.py"]
    assert "no TPU_DEBUG_NO_SUCH_VARIABLE in the code" in said[
        "TPU_DEBUG_NO_SUCH_VARIABLE=1 tpu-debug run examples/mlp_train.py"]


@pytest.mark.slow
def test_every_documented_command_runs_from_the_wheel(tmp_path):
    """The full check: the wheel built and installed in a fresh environment, every command
    RUN and SLOW name run from it outside the checkout (minutes: TPU compiles of an 8B model)."""
    wheel_smoke = _load("wheel_smoke")
    bindir = wheel_smoke.make_env(tmp_path / "venv", wheel_smoke.build_wheel(tmp_path / "dist"))
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_") and k != "PYTHONPATH"}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1",
               TPU_DEBUG_LOGDIR=str(work / "runs"), TPU_DEBUG_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    outcomes = doc_commands.check(bindir, work, env, full=True)
    print(doc_commands.table(outcomes))
    broken = [f"{o.command}: {o.note}" for o in outcomes if not o.ok]
    assert not broken, "\n".join(broken)
