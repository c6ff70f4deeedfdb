"""Every command README.md shows is run, and the output it shows is what the command prints.

Commands are read from the README itself: each line of a fenced ``bash``/``sh``/``console``
block (``a && b`` is two commands) and each inline code span that is a ``tpu-debug``,
``python``, ``pip install`` or ``tlparse`` command. Every one is either run by this module (:data:`RUN`, keyed by the
README's text), excused with its reason (:data:`EXCUSED`), or, for a ``tpu-debug`` command
written with a placeholder (``script.py``, ``RUN``), checked for its verb and flags against
that verb's ``--help``. A command the README gains without one of those fails
:func:`test_every_readme_command_is_run_or_excused`.

A fenced block right after ``<!-- readme-test: output of COMMAND -->`` is what COMMAND
prints: each of its lines must appear in the command's output (stdout and stderr), in order;
a line ``...`` stands for any lines, and numbers match any number (timings and losses vary
from run to run, the words and the layout do not). A fenced block after
``<!-- readme-test: skip REASON -->`` is not run, for that reason.

Python blocks are sketches around the reader's own model (``MyModel``, ``train_steps``):
they are parsed, and every ``tpu_debug`` name and ``torch.tpu`` name they use must exist.
A block after ``<!-- readme-test: run ... -->`` is a whole program: it is run, and the
figures its comments promise are checked (:data:`PROGRAMS`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import warm_python

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELL = {"bash", "sh", "shell", "console"}
_MARK = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->")

# commands not run, and why
EXCUSED: dict[str, str] = {
    "pip install": "installs the package: CI's .ci/run runs it before the tests, and a test must not change "
                   "the environment it runs in",
    "python -m pytest": "the test suite itself, which CI runs",
    "TPU_DEBUG_OPINFO_FULL=1 python -m pytest": "the full OpInfo sweep, about 40 minutes on 2 cores",
    "python tests/corpus/score.py": "runs each of the corpus's scripts in a process of its own (minutes); "
                                    "tests/corpus checks the same findings",
    "python benchmarks/target_dryrun.py": "a benchmark (a 7B model compiled for a TPU, minutes); benchmarks are "
                                          "not run as tests",
    "tlparse": "PyTorch's reader of a TORCH_TRACE log, not this package's; tests/cli/test_import_trace.py runs it "
               "on a log as the independent reference",
    "python docs/tensorboard_screenshot.py": "needs headless Chromium and rewrites a committed image",
    "python tests/tui/test_serve.py": "needs headless Chromium and rewrites a committed image",
    "tpu-debug tui --serve": "serves until Ctrl+C; tests/tui/test_serve.py serves a run, reads the page in headless "
                             "Chromium and stops it",
    "tpu-debug fit": "the example is two TPU compiles of an 8B model's decoder layers (minutes); tests/fit "
                     "compares the answer for a tiny Llama with a direct sharded compile",
    "ssh ": "a port forward from the reader's machine to a remote TPU VM",
    "tpu-debug report --compile-profile": "writes the last run's compile profile; tests/tracers/test_compile_time.py "
                                          "writes one and parses it as pprof's protobuf, and the wheel smoke runs "
                                          "docs/compile_time.md's",
    "torchrun --nproc-per-node 4": "four ranks training a Llama (over a minute on 2 cores); "
                                   "tests/distributed/test_llama_fsdp_tp_example.py runs the script under torchrun "
                                   "against CPU/gloo, test_torchrun_ranks.py runs tpu-debug run under torchrun",
}

# the names a command uses for what the reader brings: with one, the command is a form to fill in
PLACEHOLDERS = {"script.py", "train.py", "RUN", "[RUN]", "RUN_A", "RUN_B", "DIR", "L", "N", "[args...]", "--flag"}


@dataclasses.dataclass(frozen=True)
class Block:
    lang: str
    line: int
    text: str
    mark: str | None  # the readme-test comment just above the fence


def blocks(text: str) -> list[Block]:
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.search(above)
        found.append(Block(fence.group(1), i + 1, "\n".join(lines[i + 1:end]), mark.group(1) if mark else None))
        i = end + 1
    return found


def shell_commands(block: Block) -> list[str]:
    out = []
    for line in block.text.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line).strip()  # a comment after the command
        if line and not line.startswith("#"):
            out += [part.strip() for part in line.split(" && ")]
    return out


def inline_commands(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    spans = (" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose))
    command = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:tpu-debug(?:\s|$)|python\s+(?:-m\s|\S+\.py\b)|pip install\s|tlparse\s)")
    return list(dict.fromkeys(s for s in spans if command.match(s)))


def readme_commands() -> list[str]:
    text = README.read_text()
    shown = [c for b in blocks(text) if b.lang in SHELL and b.mark is None for c in shell_commands(b)]
    return list(dict.fromkeys(shown + inline_commands(text)))


def _excused(command: str) -> str | None:
    return next((why for start, why in EXCUSED.items() if command.startswith(start)), None)


def _without_environment(command: str) -> list[str]:
    """The command's words after its leading ``NAME=value`` assignments."""
    words = command.split()
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    return words


def _form(command: str) -> bool:
    """A command to fill in rather than to run: a script the reader brings (``tpu-debug run
    --memory``, ``tpu-debug run --target v6e-8 script.py``, ``python script.py``). Its flags
    are checked (:func:`test_the_flags_readme_shows_exist`)."""
    words = _without_environment(command)
    if any(word in PLACEHOLDERS for word in words):
        return words[:2] in (["tpu-debug", "run"], ["python", "script.py"])
    return words[:2] == ["tpu-debug", "run"] and not any(w.endswith(".py") for w in words)


# -- running commands ---------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    code: int
    out: str

    @property
    def run_dir(self) -> Path:
        (found,) = re.findall(r"^run saved in (\S+)", self.out, re.MULTILINE)
        return Path(found)

    def __str__(self) -> str:
        return f"exit {self.code}\n{self.out[-4000:]}"


def run(command: str, env: dict[str, str], timeout: float = 300) -> Ran:
    words = command.split()
    assignments = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        name, _, value = words.pop(0).partition("=")
        assignments[name] = value
    if words[0] == "tpu-debug":
        words = [sys.executable, "-m", "tpu_debug", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    proc = warm_python.run(words, cwd=ROOT, env={**env, **assignments}, timeout=timeout)
    return Ran(proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment the commands run in: runs go to a temporary logdir, not the checkout."""
    logdir = tmp_path_factory.mktemp("readme-runs")
    keep = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_")}
    return {**keep, "TPU_DEBUG_LOGDIR": str(logdir), "TPU_DEBUG_COMPILE_CACHE": "0", "COLUMNS": "160"}


@pytest.fixture(scope="module")
def ran(env) -> dict[str, Ran]:
    """Outputs of commands already run, by README text (later commands read their runs)."""
    return {}


@pytest.fixture(scope="module")
def passed() -> set[Callable[..., None]]:
    """The checks that passed: README forms of one command that share a check (``tpu-debug tui``
    and ``tpu-debug tui [RUN]``) run it once."""
    return set()


def _run_once(command: str, env: dict, ran: dict, **extra: str) -> Ran:
    if command not in ran:
        ran[command] = run(command, {**env, **extra})
    return ran[command]


MLP = "tpu-debug run examples/mlp_train.py"
TENSORBOARD = "tpu-debug run --tensorboard examples/mlp_train.py"
HIDDEN_SYNC = "tpu-debug run --fail-on-recompile --transfer-guard-implicit disallow examples/pitfalls/hidden_sync.py"


def _compile_cache(env) -> dict[str, str]:
    """The compile cache on, as it is by default, in a folder of the module's own: the README's
    first run of mlp_train.py fills it, and check_second_run's run of it reads it back."""
    return {"TPU_DEBUG_COMPILE_CACHE": "1",
            "TPU_DEBUG_COMPILE_CACHE_DIR": env["TPU_DEBUG_LOGDIR"] + "-compile-cache"}


def check_mlp(env, ran):
    out = _run_once(MLP, env, ran, **_compile_cache(env))
    assert out.code == 0 and "loss curves match CPU" in out.out and "\nFindings\nnothing to fix" in out.out, out


def check_second_run(env, ran):
    """README: the second run of mlp_train.py compiles nothing (every program from the disk cache)."""
    check_mlp(env, ran)  # the first run, which fills the cache
    second = run(MLP, {**env, **_compile_cache(env)})
    assert second.code == 0, second
    # "Programs compiled" says how many came from the cache and the compile time saved
    read = re.search(r"^Programs compiled\nnothing was compiled while tracing; ([1-9]\d*) program\(s\) read back "
                     r"from the compile cache, saving \S+ \S?s of compiling$", second.out, re.MULTILINE)
    assert read, second
    # the Steps section places each of those read-backs in a part of the run (before, in, after the steps)
    placed = re.findall(r"(\d+) read back from the compile cache", second.out)
    assert sum(map(int, placed)) == int(read.group(1)), second.out


def check_tensorboard_run(env, ran):
    out = _run_once(TENSORBOARD, env, ran)
    assert out.code == 0, out
    run_dir = out.run_dir
    assert list((run_dir / "tensorboard").rglob("*.xplane.pb")), f"no JAX profile in {run_dir}"


def check_tensorboard_serve(env, ran):
    # serving runs until stopped: --print (named in the README's comment) shows the command it would run
    check_tensorboard_run(env, ran)
    out = run(f"tpu-debug tensorboard --print {ran[TENSORBOARD].run_dir}", env)
    assert out.code == 0 and "tensorboard" in out.out and ran[TENSORBOARD].run_dir.name in out.out, out


def check_hidden_sync(env, ran):
    out = _run_once(HIDDEN_SYNC, env, ran)
    line = next(i for i, s in enumerate((ROOT / "examples/pitfalls/hidden_sync.py").read_text().splitlines(), 1)
                if "loss.item()" in s and "+=" in s)
    assert out.code == 1 and f"hidden_sync.py:{line}" in out.out and "TransferGuardError" in out.out, out
    # the script's line and the message, not the runtime's frames
    assert "site-packages" not in out.out.split("tpu_debug report")[0] and "/runtime/" not in out.out, out


def check_bf16_drift(env, ran):
    out = _run_once("tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py", env, ran)
    assert out.code == 0 and "\nDivergence\n" in out.out and "first op over tolerance" in out.out, out


def check_dry_run(env, ran):
    from tpu_debug.runtime.target._libtpu import _find_libtpu

    if not _find_libtpu():
        pytest.skip('needs libtpu: pip install -e ".[tpu]"; CI installs it')
    out = _run_once("tpu-debug run --target v6e --dry-run examples/dry_run_llama.py", env, ran)
    assert out.code == 0 and "v6e" in out.out, out


def check_sharding_remat(env, ran):
    out = _run_once("tpu-debug run --devices 8 examples/pitfalls/sharding_remat.py", env, ran)
    # XLA's own line is the finding now, not a raw log line
    assert out.code == 0 and "Involuntary full rematerialization" not in out.out, out
    fixed = run("tpu-debug run --devices 8 examples/pitfalls/sharding_remat.py --fixed", env)
    assert fixed.code == 0 and "\nFindings\nnothing to fix" in fixed.out, fixed


def check_runs(env, ran):
    check_mlp(env, ran)
    out = run("tpu-debug runs", env)
    assert out.code == 0 and "mlp_train" in out.out, out


def check_report(env, ran):
    check_mlp(env, ran)
    out = run("tpu-debug report", env)  # the latest run
    assert out.code == 0 and "tpu_debug report: " in out.out and "\nFindings\n" in out.out, out


def check_report_json(env, ran):
    check_mlp(env, ran)
    out = run(f"tpu-debug report --json {ran[MLP].run_dir}", env)
    assert out.code == 0, out
    assert json.loads(out.out)["schema"] == "tpu_debug.report/1"  # the schema README names


def check_diff(env, ran):
    check_mlp(env, ran)
    check_tensorboard_run(env, ran)
    a, b = ran[MLP].run_dir, ran[TENSORBOARD].run_dir
    out = run(f"tpu-debug diff {a} {b}", env)
    assert out.code == 0, out
    data = run(f"tpu-debug diff --json {a} {b}", env)
    assert data.code == 0 and json.loads(data.out)["schema"] == "tpu_debug.diff/1", data


def check_import_trace(env, ran, tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text("import torch\nf = torch.compile(lambda x: x * 2, backend='eager', dynamic=False)\n"
                      "f(torch.ones(3)); f(torch.ones(4))\n")
    made = run(f"python {script}", {**env, "TORCH_TRACE": str(tmp_path / "trace")})
    assert made.code == 0, made
    out = run(f"tpu-debug import-trace {tmp_path / 'trace'} --logdir {tmp_path / 'runs'} --name traced", env)
    assert out.code == 0, out
    report = run(f"tpu-debug report --logdir {tmp_path / 'runs'}", env)
    assert report.code == 0 and "Recompiles" in report.out, report


def check_import_fr(env, ran, tmp_path):
    """README: a folder of Flight Recorder dumps becomes a multi-process run (written here as
    PyTorch's gloo group writes them: a pickled dict per rank)."""
    import pickle

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for rank in (0, 1):
        entries = [{"record_id": i, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
                    "p2p_seq_id": 0, "profiling_name": "gloo:all_reduce", "time_created_ns": 10**18 + i * 10**8,
                    "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"],
                    "output_dtypes": ["Float"], "state": "scheduled", "frames": []} for i in range(3)]
        (dumps / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}))
    # in this process, the verbs' own entry point (a process each would add seconds of start-up;
    # tests/cli covers the console script itself)
    import contextlib
    import io

    from tpu_debug.cli import main

    assert main(["import-fr", str(dumps), "--logdir", str(tmp_path / "runs")]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", "--logdir", str(tmp_path / "runs")]) == 0
    assert "c10d collectives in order, group 0" in out.getvalue(), out.getvalue()


def check_tui(env, ran):
    """README: keys 1-9 switch views and ``?`` lists the keys (driven headless; a terminal UI
    needs a terminal, which a test has not)."""
    import asyncio

    from tpu_debug.tui.app import TpuDebugApp

    import tpu_debug

    check_mlp(env, ran)
    session = tpu_debug.open_run(ran[MLP].run_dir)

    async def drive() -> list[str]:
        app = TpuDebugApp(session)
        seen = []
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            for key in "123456789":
                await pilot.press(key)
                await pilot.pause()
                seen.append(type(app.screen).__name__)
            await pilot.press("question_mark")
            await pilot.pause()
            seen.append(type(app.screen).__name__)
        return seen

    try:
        seen = asyncio.run(drive())
    finally:
        session.close()
    assert len(set(seen[:9])) == 9, f"keys 1-9 did not show nine views: {seen}"
    assert seen[9] not in seen[:9], f"? showed no help: {seen}"


CheckFn = Callable[..., None]
# README's text -> the check that runs it
RUN: dict[str, CheckFn] = {
    MLP: check_mlp,
    TENSORBOARD: check_tensorboard_run,
    "tpu-debug tensorboard": check_tensorboard_serve,
    HIDDEN_SYNC: check_hidden_sync,
    "tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py": check_bf16_drift,
    "tpu-debug run --target v6e --dry-run examples/dry_run_llama.py": check_dry_run,
    "tpu-debug run --devices 8 examples/pitfalls/sharding_remat.py": check_sharding_remat,
    "tpu-debug runs": check_runs,
    "tpu-debug report": check_report,
    "tpu-debug report [RUN]": check_report,
    "tpu-debug report --json": check_report_json,
    "tpu-debug diff RUN_A RUN_B": check_diff,
    "tpu-debug diff": check_diff,
    "tpu-debug import-trace DIR [--logdir L] [--name N]": check_import_trace,
    "tpu-debug import-fr DIR [--prefix P] [--logdir L] [--name N]": check_import_fr,
    "tpu-debug tui [RUN]": check_tui,
    "tpu-debug tui": check_tui,
}
# claims README makes about a command beyond its output
CLAIMS: dict[str, CheckFn] = {"the second run of mlp_train.py compiles nothing": check_second_run}


# -- the tests ------------------------------------------------------------------------------------


def test_every_readme_command_is_run_or_excused():
    unchecked = [c for c in readme_commands() if c not in RUN and _excused(c) is None and not _form(c)]
    assert not unchecked, f"README commands this test neither runs nor excuses (add them to RUN or EXCUSED): {unchecked}"
    stale = [c for c in RUN if c not in readme_commands()]
    assert not stale, f"commands RUN checks that README no longer shows: {stale}"
    for block in blocks(README.read_text()):
        if block.lang in SHELL and block.mark is not None:
            assert block.mark.startswith("skip ") and len(block.mark) > len("skip ") + 10, (
                f"README.md:{block.line}: a shell block marked {block.mark!r}; say 'skip <the reason>'")


def _flags(verb: str) -> str:
    import contextlib
    import io

    from tpu_debug.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit, match="0"):
        main([verb, "--help"])
    return out.getvalue()


def test_the_flags_readme_shows_exist():
    """Every tpu-debug command, placeholders and all: its verb exists and its flags are in its --help."""
    helps: dict[str, str] = {}
    for command in readme_commands():
        words = _without_environment(command)
        if words[0] != "tpu-debug" or len(words) < 2:
            continue
        verb = words[1]
        if verb not in helps:
            helps[verb] = _flags(verb)
        for flag in (w for w in words[2:] if w.startswith("--") and w != "--flag"):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[verb]), (
                f"README shows `{command}`, but tpu-debug {verb} --help has no {flag}")


@pytest.mark.parametrize("command", sorted(RUN))
def test_a_readme_command_does_what_readme_says(command, env, ran, passed, tmp_path):
    if command not in readme_commands():
        pytest.skip("no longer in README (test_every_readme_command_is_run_or_excused fails)")
    check = RUN[command]
    if check in passed:
        return  # the same check, on the same runs, passed for another form of this command
    params = check.__code__.co_varnames[: check.__code__.co_argcount]
    check(env, ran, tmp_path) if "tmp_path" in params else check(env, ran)
    passed.add(check)


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_a_readme_claim_about_a_command_holds(claim, env, ran):
    CLAIMS[claim](env, ran)


_NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"


def _pattern(shown: str) -> re.Pattern:
    """A shown output line as a pattern: numbers match any number, ``...`` any text, a run of
    blanks any run of blanks."""
    pieces = []
    for k, text in enumerate(shown.strip().split("...")):
        if k:
            pieces.append(".*")
        for i, part in enumerate(re.split(f"({_NUMBER})", text)):
            pieces.append(_NUMBER if i % 2 else r"\s+".join(re.escape(w) for w in part.split(" ")))
    return re.compile("".join(pieces))


def test_the_output_readme_shows_is_what_the_command_prints(env, ran, passed):
    shown = [b for b in blocks(README.read_text()) if b.mark and b.mark.startswith("output of ")]
    assert shown, "README shows no command output marked for this test"
    for block in shown:
        command = block.mark.removeprefix("output of ")
        assert command in RUN, f"README.md:{block.line}: output of {command!r}, which RUN does not run"
        if RUN[command] not in passed or command not in ran:
            RUN[command](env, ran)
            passed.add(RUN[command])
        actual = [" ".join(line.split()) for line in ran[command].out.splitlines()]
        at = 0
        for want in block.text.splitlines():
            if want.strip() in ("", "..."):
                continue
            pattern = _pattern(" ".join(want.split()))
            found = next((i for i in range(at, len(actual)) if pattern.fullmatch(actual[i])), None)
            assert found is not None, (
                f"README.md:{block.line}: {command!r} no longer prints {want.strip()!r} (after line {at}):\n"
                + "\n".join(actual[at:at + 60]))
            at = found + 1


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _dotted(node: ast.AST) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(names)]) if isinstance(node, ast.Name) else None


def test_the_python_readme_shows_uses_names_that_exist():
    import tpu_debug  # noqa: F401 - registers torch.tpu

    missing = []
    for block in blocks(README.read_text()):
        if block.lang != "python":
            continue
        tree = ast.parse(block.text, f"README.md:{block.line}")
        aliases = {"tpu_debug": "tpu_debug", "torch": "torch"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpu_debug"):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    if not _resolve(f"{node.module}.{alias.name}"):
                        missing.append(f"README.md:{block.line}: from {node.module} import {alias.name}")
        for node in ast.walk(tree):
            dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
            if dotted is None or dotted.split(".")[0] not in aliases:
                continue
            full = ".".join([aliases[dotted.split(".")[0]], *dotted.split(".")[1:]])
            if full.startswith("torch.") and not full.startswith("torch.tpu"):
                continue  # PyTorch's own names
            if not _resolve(full):
                missing.append(f"README.md:{block.line}: {dotted}")
    assert not missing, missing


def check_target_program(out: str) -> None:
    """The TPU target example: 2*m*n*k flops, the roofline's verdict its comment shows, and no
    padded array (8192 is a multiple of the (8,128) tile)."""
    flops, roofline, worst = out.strip().splitlines()[-3:]
    assert float(flops) == 2 * 8192**3
    assert "compute-bound, ~5.58 ms" in roofline, roofline
    assert worst == "[]", worst


# the first line of a README program marked to run -> the check of what it printed
PROGRAMS: dict[str, Callable[[str], None]] = {"import jax, jax.numpy as jnp": check_target_program}
_PRINTS = {  # what each program's last lines print for its check (its own lines only show values)
    "import jax, jax.numpy as jnp": "print(result.cost.flops)\nprint(roofline(result).render())\n"
                                    "print(padding_report(result.hlo).worst(5))\n",
}


def test_the_python_programs_readme_shows_run(env, tmp_path):
    marked = [b for b in blocks(README.read_text()) if b.lang == "python" and b.mark and b.mark.startswith("run")]
    assert marked, "README marks no Python program to run"
    for block in marked:
        first = block.text.splitlines()[0]
        assert first in PROGRAMS, f"README.md:{block.line}: a program this test has no check for: {first!r}"
        if "libtpu" in block.mark:
            from tpu_debug.runtime.target._libtpu import _find_libtpu

            if not _find_libtpu():
                pytest.skip('needs libtpu: pip install -e ".[tpu]"; CI installs it')
        script = tmp_path / f"readme_{block.line}.py"
        script.write_text(block.text + "\n" + _PRINTS[first])
        out = run(f"python {script}", {**env, "TPU_DEBUG_TARGET_CACHE": "off"})
        assert out.code == 0, out
        PROGRAMS[first](out.out)
