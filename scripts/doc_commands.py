"""Every shell command that README.md and docs/*.md show, read from their text, and how
each is checked from a tpu_debug wheel installed outside the checkout.

Where commands are written: each line of a fenced ``bash``/``sh``/``shell``/``console``
block (a ``$ `` prompt, a trailing ``  # comment`` and ``\\`` continuations taken off; ``a &&
b`` is two commands), each line of an unlabelled fenced block or an indented code block that
starts with a command word (``tpu-debug``, ``python``, ``torchrun``, ``pip install``, ...),
and each inline code span that is such a command (``tpu-debug run --divergence ...``).

How each is checked (:func:`plan`): every command is validated without running it, by the
real parsers (``tpu-debug``'s own, from the wheel; torchrun's), against the files it names
(``examples/`` as README says to take them, the clone's scripts and tests) and the
variables, extras and markers it uses (:func:`validate`). Then it is run from the wheel in
a temporary directory (:data:`RUN`, by ``scripts/wheel_smoke.py`` in CI), or run only by the
full check (:data:`SLOW`: minutes of TPU compiles, many seconds each; the ``slow`` test
``tests/test_docs_from_wheel.py``), or never run, for the reason :data:`NEVER` gives (a
browser, a server, a remote machine, the test suite itself, an install). A command written
with a placeholder (``script.py``, ``RUN``, ``N``) or naming only a verb and a flag is a
form the reader completes: it is validated with the placeholders filled in.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import resource
import shlex
import subprocess
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = {"bash", "sh", "shell", "console"}
RUN_DIR = re.compile(r"^run saved in (\S+)", re.MULTILINE)  # the line tpu-debug run ends with
_ENV = r"(?:[A-Z][A-Z0-9_]*=\S*\s+)*"
# a command word: what a line or a code span must start with to be read as a command
COMMAND = re.compile(
    rf"^{_ENV}(?:tpu-debug(?:\s|$)|python\s+(?:-m\s|\S+\.py\b)|pip install\s|tlparse\s|torchrun\s|ssh\s|tensorboard\s)"
)


@dataclasses.dataclass(frozen=True)
class Command:
    doc: str  # the document, relative to the repository
    line: int
    text: str  # the command as the document writes it, blanks collapsed
    inline: bool  # written in a sentence (a code span), not in a code block

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _split(line: str) -> list[str]:
    line = re.sub(r"\s{2,}#.*$", "", line).strip()  # a comment after the command
    line = re.sub(r"^\$\s+", "", line)
    if not line or line.startswith("#"):
        return []
    return [" ".join(part.split()) for part in line.split(" && ") if part.strip()]


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in lines:
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.strip()
        if text.rstrip().endswith("\\"):
            pending = (number, text.rstrip()[:-1])
            continue
        pending = None
        out.append((number, text))
    if pending is not None:
        out.append(pending)
    return out


def commands_in(path: Path, root: Path = ROOT) -> list[Command]:
    doc = str(path.relative_to(root))
    lines = path.read_text().splitlines()
    found: list[Command] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```\s*([\w-]*)", lines[i])
        if fence is None:
            indented = re.match(r"^(?: {4}|\t)(.*)$", lines[i])
            if indented and (i == 0 or not lines[i - 1].strip() or re.match(r"^(?: {4}|\t)", lines[i - 1])):
                text = re.sub(r"^\$\s+", "", indented.group(1).strip())
                if COMMAND.match(text):
                    found += [Command(doc, i + 1, c, False) for c in _split(text)]
                    i += 1
                    continue
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        lang = fence.group(1).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        body = _logical_lines([(j + 1, lines[j]) for j in range(i + 1, end)])
        for number, text in body:
            if lang in SHELL or (lang == "" and COMMAND.match(re.sub(r"^\$\s+", "", text.strip()))):
                found += [Command(doc, number, c, False) for c in _split(text)]
        i = end + 1
    # code spans may wrap across lines of a paragraph: read each paragraph as one text
    paragraph: list[tuple[int, str]] = []
    for number, text in [*prose, (0, "")]:
        if text.strip():
            paragraph.append((number, text))
            continue
        if paragraph:
            joined, starts = "", []
            for number_, text_ in paragraph:
                starts.append((len(joined), number_))
                joined += text_ + "\n"
            for span in re.finditer(r"`([^`]+)`", joined):
                words = " ".join(span.group(1).split())
                if COMMAND.match(words):
                    line = max(n for start, n in starts if start <= span.start())
                    found.append(Command(doc, line, words, True))
        paragraph = []
    return found


def commands(root: Path = ROOT) -> list[Command]:
    """Every command the documents show, in document order (each text once per document)."""
    out: list[Command] = []
    for path in documents(root):
        seen: set[str] = set()
        for command in sorted(commands_in(path, root), key=lambda c: c.line):
            if command.text not in seen:
                seen.add(command.text)
                out.append(command)
    return out


# -- how each command is checked ---------------------------------------------------------------

# run from the wheel in CI, with the exit status the text around it gives
RUN: dict[str, int] = {
    "tpu-debug run examples/mlp_train.py": 0,
    "python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper": 0,
    "tpu-debug run --tensorboard examples/mlp_train.py": 0,
    "tpu-debug runs": 0,
    "tpu-debug report": 0,
    "tpu-debug report --json": 0,
    "tpu-debug run --help": 0,
    "tpu-debug tui": 0,  # in a pseudo-terminal, quit with q once the overview is drawn
    # README: it stops at the first loss.item(), the sync it hides
    "tpu-debug run --fail-on-recompile --transfer-guard-implicit disallow examples/pitfalls/hidden_sync.py": 1,
    "tpu-debug run --divergence --numerics tpu examples/pitfalls/bf16_drift.py": 0,
    "tpu-debug run --devices 8 examples/pitfalls/sharding_remat.py": 0,
    # docs/compile_time.md: a tiny 12-layer transformer compiled whole, then its compile profile
    "tpu-debug run examples/pitfalls/unrolled_layers.py": 0,
    "tpu-debug report --compile-profile compile.pb.gz": 0,
    "tpu-debug run --target v6e --dry-run examples/dry_run_llama.py": 0,
    "torchrun --nproc-per-node 2 examples/distributed/ddp_train.py": 0,
    "tpu-debug run --nproc 2 examples/distributed/ddp_train.py": 0,
}

# run only by the full check (the slow test): why not in CI, and the exit status its answer
# has (fit: 0 fits, 3 does not fit; docs/fit.md's table: Llama-3-8B's step on v5e-64 at
# fsdp=64 does not; on v5e-8 at fsdp=8, batch 8, it needs 16.5 GiB of 15.75)
SLOW: dict[str, tuple[str, int]] = {
    "tpu-debug fit llama3-8b --target v5e-8 --plan fsdp --batch 8 --seq 2048":
        ("two TPU compiles of an 8B model's decoder layers: minutes and several GB of host memory", 3),
    "tpu-debug fit llama3-8b --target v5e-64 --plan fsdp --batch 64 --seq 2048 --optimization-level O0":
        ("TPU compiles of an 8B model on a 64-chip slice: minutes and several GB of host memory", 3),
    "torchrun --nproc-per-node 4 examples/distributed/train_llama_fsdp_tp.py":
        ("4 ranks of a Llama under FSDP2 and tensor parallelism on 2 cores (minutes)", 0),
    "torchrun --nproc-per-node 4 $(which tpu-debug) run examples/distributed/train_llama_fsdp_tp.py":
        ("4 ranks of a Llama under FSDP2 and tensor parallelism, each traced, on 2 cores (minutes)", 0),
    "torchrun --nproc-per-node 4 -m tpu_debug run examples/distributed/train_llama_fsdp_tp.py":
        ("4 ranks of a Llama under FSDP2 and tensor parallelism, each traced, on 2 cores (minutes)", 0),
    "python tests/corpus/score.py": ("runs each of the corpus's scripts in a process of its own (minutes)", 0),
    "python tests/corpus/score.py --jobs 2": ("runs each of the corpus's scripts in a process of its own, two at "
                                              "a time (minutes)", 0),
    "python tests/corpus/score.py --cache --jobs 2": ("runs each of the corpus's scripts twice, cold then warm in one "
                                                      "compile cache, two at a time (tens of minutes)", 0),
    "python tests/corpus/score.py --cache": ("runs each of the corpus's scripts twice, cold then warm in one compile "
                                             "cache, each in a process of its own (tens of minutes)", 0),
    "tpu-debug run --dry-run --target v5e-8 examples/peak_memory_llama.py --mode compiled":
        ("a dry run of a 0.74 B-parameter training step: minutes of TPU compiles (the refused program is a "
         "finding, not the run's failure)", 0),
    "tpu-debug run --dry-run --target v5e-8 examples/peak_memory_llama.py --mode compiled --chunked-loss":
        ("a dry run of a 0.74 B-parameter training step: minutes of TPU compiles", 0),
    "python scripts/op_coverage.py --check":
        ("compares docs/op_coverage.md with the sweep's results (a clone's tool, run from the clone)", 0),
}

# never run by the check, and why (each is still validated)
NEVER: dict[str, str] = {
    "python -m torch.cuda._memory_viz stats snap.g1.backward.v5e-1.pickle":
        "reads the snapshot the command before writes (tests/tracers/test_memory_snapshot.py runs it on others)",
    "python -m torch.cuda._memory_viz trace_plot snap.g1.backward.v5e-1.pickle -o backward.html":
        "reads the snapshot the command before writes (tests/tracers/test_memory_snapshot.py runs it on others)",
    "pip install -q -c constraints.txt -e .": "installs the clone into the environment: .ci/run does",
    'pip install -q -c constraints.txt -e ".[dev,tpu,models]"': "installs the clone into the environment: .ci/run does",
    'pip install -q -c constraints.txt -e ".[tpu]"': "installs libtpu into the environment: .ci/run does",
    'pip install -q -c constraints.txt -e ".[dev,models]"': "installs the clone into the environment: .ci/run does",
    "pip install tlparse": "installs PyTorch's tlparse into the environment: the dev extra does",
    'python -m pytest -n 2 -q -p no:cacheprovider -m "not slow" --ignore=tests/runtime/test_opinfo.py '
    '--ignore=tests/runtime/test_moduleinfo.py': "the test suite itself, which .ci/run runs",
    "python -m pytest -n 2 -q -p no:cacheprovider tests/runtime/test_opinfo.py tests/runtime/test_moduleinfo.py":
        "the test suite itself, which .ci/run runs",
    "TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_moduleinfo.py -n 2 -q":
        "the full ModuleInfo sweep, every module input in three modes (hours on 2 cores)",
    "TPU_DEBUG_OPINFO_FULL=1 python -m pytest -n 2 -q -p no:cacheprovider tests/runtime/test_moduleinfo.py":
        "the full ModuleInfo sweep, every module input in three modes (hours on 2 cores)",
    "python scripts/op_coverage.py --module-results RESULTS.jsonl": "records a ModuleInfo sweep's results in "
                                                                    "docs/moduleinfo_sweep.json",
    "python -m pytest -n 2 -q -p no:cacheprovider -m slow": "the slow tier of the test suite (hours on 2 cores)",
    "python -m pytest -n 2 -q -p no:cacheprovider -m quick": "the quick tier of the test suite, tests the command "
                                                              "after it (.ci/run's) runs too",
    "TPU_DEBUG_OPINFO_FULL=1 python -m pytest -n 2 -q -p no:cacheprovider tests/runtime/test_opinfo.py":
        "the full OpInfo sweep, about 40 minutes on 2 cores",
    "TPU_DEBUG_OPINFO_FULL=1 python -m pytest tests/runtime/test_opinfo.py -n 2 -q":
        "the full OpInfo sweep, about 40 minutes on 2 cores",
    "python -m pytest tests/runtime/test_opinfo.py -n 2 -q": "the test suite's OpInfo tier, which .ci/run runs",
    "python -m pytest -n 2 -q -p no:cacheprovider tests/corpus": "a part of the test suite, which .ci/run runs",
    'python -m pytest -n 2 -q -p no:cacheprovider -m "not slow" tests/models': "a part of the test suite, which "
                                                                               ".ci/run runs",
    "python -m pytest -n 2 -q -p no:cacheprovider tests/models": "a part of the test suite with its slow tier",
    "TPU_DEBUG_FAULTS_REPORT=faults.jsonl python -m pytest -n 2 -q -p no:cacheprovider tests/faults/test_signals.py":
        "a part of the test suite (its signal points), which .ci/run runs",
    "python tests/faults/fault_injection.py faults.jsonl": "tabulates the faults.jsonl that the pytest command "
                                                           "before it writes",
    "python -m tpu_debug run --no-report --op-events tests/faults/train_steps.py 2":
        "what tests/faults/test_signals.py runs under each signal it sends",
    "python scripts/op_coverage.py --sweep full": "the full OpInfo sweep (40 minutes), and it rewrites "
                                                  "docs/op_coverage.md",
    "python scripts/op_coverage.py": "rewrites docs/op_coverage.md from a sweep's results",
    "python tests/runtime/make_opinfo_expectations.py RESULTS.jsonl": "rewrites the committed xfail list from a "
                                                                      "sweep's results",
    "python tests/tui/test_serve.py RUN --out docs/tui_browser.png": "needs headless Chromium and rewrites a "
                                                                     "committed image",
    "python docs/tensorboard_screenshot.py": "needs headless Chromium and rewrites a committed image",
    "python benchmarks/target_dryrun.py --target v6e --mode training": "a benchmark: a 7B model's training step "
                                                                       "compiled for a TPU (minutes, GBs)",
    "python benchmarks/fit.py --maxtext": "a benchmark: every MaxText configuration compiled for its slice (hours)",
    'python benchmarks/fit.py --only "llama3-8b v5e-8"': "a benchmark: an 8B training step compiled for "
                                                   "v5e-8 in a fresh process (minutes, GBs)",
    "tpu-debug tui --serve": "serves the UI until Ctrl+C and needs a browser to see it; tests/tui/test_serve.py "
                             "serves a run and reads the page in headless Chromium",
    "tpu-debug tensorboard": "serves TensorBoard until stopped; the wheel smoke runs tpu-debug tensorboard --print",
    "ssh -N -L 8000:127.0.0.1:8000 you@tpu-vm": "a port forward from the reader's machine to a remote TPU VM",
    "tlparse /tmp/tt/dedicated_log_torch_trace_*.log -o out": "PyTorch's reader of a TORCH_TRACE log, not ours; "
                                                             "tests/cli/test_import_trace.py runs it",
}

# the words a command uses for what the reader brings, and what fills each in to validate it
PLACEHOLDERS: dict[str, str | None] = {
    "script.py": "examples/mlp_train.py", "train.py": "examples/mlp_train.py",
    "config.json": "config.json", "MODEL": "llama3-8b", "RUN": "RUN", "RUN_A": "RUN_A", "RUN_B": "RUN_B",
    "RUN_DIR": "RUN", "DIR": "DIR", "L": "runs", "N": "2", "RESULTS.jsonl": "RESULTS.jsonl",
    "[args...]": None, "...": None, "--flag": None,
}


@dataclasses.dataclass(frozen=True)
class Plan:
    how: str  # "run" (CI), "slow" (the full check), "never", "form" (completed by the reader)
    reason: str = ""
    code: int = 0  # the exit status a run must end with


def _is_form(words: list[str]) -> bool:
    if any(w.strip("[]") in PLACEHOLDERS or w in PLACEHOLDERS for w in words):
        return True
    # a verb with flags and no file: written in a sentence to name a flag (tpu-debug run --memory)
    return words[0] == "tpu-debug" and not any(w.endswith((".py", ".json")) for w in words) and (
        len(words) <= 2 or words[1] in ("run", "fit", "tui", "diff"))


def plan(command: Command | str) -> Plan | None:
    """How the check treats a command; None for a command no table or rule covers."""
    text = command if isinstance(command, str) else command.text
    if text in RUN:
        return Plan("run", code=RUN[text])
    if text in SLOW:
        return Plan("slow", *SLOW[text])
    if text in NEVER:
        return Plan("never", NEVER[text])
    words = _words(text)
    if words and _is_form(words):
        return Plan("form", "a form: the reader brings the script, the run or the value")
    return None


def environment(text: str) -> tuple[dict[str, str], list[str]]:
    """A command's leading ``NAME=value`` assignments, and its words after them (split as
    the shell splits them)."""
    text = re.sub(r"\$\(which ([\w-]+)\)", r"@which:\1", text)  # the shell's $(which NAME)
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: a sketch rather than a command
        words = text.split()
    env = {}
    while words and re.match(r"^[A-Z][A-Z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def _words(text: str) -> list[str]:
    return environment(text)[1]


def filled(text: str) -> list[str]:
    """The command's words with placeholders filled in (``[--logdir L]`` is ``--logdir runs``)."""
    out = []
    for word in _words(text):
        bare = word.strip("[]") if word not in PLACEHOLDERS else word
        if bare in PLACEHOLDERS:
            if PLACEHOLDERS[bare] is not None:
                out.append(PLACEHOLDERS[bare])
        elif word not in PLACEHOLDERS:
            out.append(bare)
    return out


# -- validating without running -------------------------------------------------------------------

# run by the wheel's interpreter: each request parsed by the real parsers (tpu-debug's, torchrun's)
PARSE = r"""
import contextlib, io, json, os, sys
from tpu_debug.cli import COMMANDS, build_parser

def flags_of(verb):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[verb]._option_string_actions

def check(kind, argv):
    if kind == "form":  # the verb exists and so does each flag it names
        if len(argv) < 1:
            return None
        if argv[0] not in COMMANDS:
            return f"no verb {argv[0]!r} (tpu-debug has {', '.join(COMMANDS)})"
        known = flags_of(argv[0])
        bad = [w.split("=")[0] for w in argv[1:] if w.startswith("-") and w.split("=")[0] not in known]
        return f"tpu-debug {argv[0]} has no {', '.join(bad)}" if bad else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if kind == "torchrun":
                from torch.distributed.run import get_args_parser
                args = get_args_parser().parse_args(argv)
                if not args.no_python and not args.module and not os.path.exists(args.training_script):
                    return f"torchrun would run python {args.training_script}: no such file"
                return None
            args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    if argv[0] == "run" and args.script and not args.module and not os.path.exists(args.script):
        return f"no script {args.script}"
    return None

results = []
for kind, argv, base in json.load(sys.stdin):
    os.chdir(base)
    results.append(check(kind, argv))
print(json.dumps(results))
"""


def _pyproject(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def _variables_known(env: dict[str, str], root: Path) -> list[str]:
    """A ``TPU_DEBUG_*`` variable is an option's (``core/options.py`` derives the names) or is
    read by name somewhere in the clone's code (a test's, a script's)."""
    source = _code(root)
    options = _option_names(root)
    return [f"no {name} in the code" for name in env if name.startswith("TPU_DEBUG_")
            and name not in source and name.removeprefix("TPU_DEBUG_").lower() not in options]


@functools.cache
def _code(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py") if ".git" not in p.parts)


@functools.cache
def _option_names(root: Path) -> frozenset[str]:
    options = root / "core" / "options.py"
    return frozenset(re.findall(r'^\s*Option\("(\w+)"', options.read_text(), re.MULTILINE)) if options.exists() \
        else frozenset()


def _static_problems(command: Command, root: Path, work: Path) -> list[str]:
    """What can be checked of a command that is not tpu-debug's or torchrun's: the files
    it names, the flags its script declares, the extras, constraints and markers it uses."""
    words = filled(command.text)
    problems: list[str] = []
    if words[:2] == ["pip", "install"]:
        extras = _pyproject(root)["project"].get("optional-dependencies", {})
        for i, word in enumerate(words):
            if word == "-c" and not (root / words[i + 1]).exists():
                problems.append(f"no {words[i + 1]} in the clone")
            if word == "-e":
                target = words[i + 1]
                wanted = re.findall(r"[\w-]+", target.partition("[")[2])
                problems += [f"no extra {e!r} in pyproject.toml" for e in wanted if e not in extras]
        named = [w for w in words[2:] if not w.startswith("-") and words[words.index(w) - 1] not in ("-c", "-e")]
        problems += [f"{w} is in no extra of pyproject.toml" for w in named
                     if not any(w in deps for deps in map(str, extras.values()))]
    elif words[:3] == ["python", "-m", "pytest"]:
        markers = " ".join(_pyproject(root)["tool"]["pytest"]["ini_options"].get("markers", []))
        for i, word in enumerate(words[3:], 3):
            if word == "-m":
                for name in re.findall(r"\w+", words[i + 1]):
                    if name not in ("not", "and", "or") and f"{name}:" not in markers:
                        problems.append(f"no pytest marker {name!r}")
            path = word.partition("=")[2] if word.startswith("--ignore=") else word
            if "/" in path and not (root / path.split("::")[0]).exists():
                problems.append(f"no {path} in the clone")
    elif words[0] == "python" and words[1].endswith(".py"):
        script = root / words[1] if not words[1].startswith("examples/") else work / words[1]
        if not script.exists():
            return problems + [f"no {words[1]}"]
        source = script.read_text()
        problems += [f"{words[1]} declares no {w}" for w in words[2:] if w.startswith("--")
                     and not re.search(rf"['\"]{re.escape(w)}['\"]", source)]
    return problems


CLONE_DIRS = ("tests/", "scripts/", "benchmarks/", "docs/")


def base_of(words: list[str], root: Path, work: Path) -> Path:
    """Where a command runs: a clone's tool (``tests/``, ``scripts/``, ...) in the clone, a
    user's command in the directory that holds ``examples/``, as README says."""
    return root if any(w.startswith(CLONE_DIRS) for w in words) else work


def validate(found: list[Command], python: Path, root: Path, work: Path) -> dict[Command, list[str]]:
    """Each command's problems, found without running it (``python``: the wheel's interpreter,
    run in ``work``, which holds ``examples/``)."""
    problems: dict[Command, list[str]] = {c: [] for c in found}
    requests, owners = [], []
    for command in found:
        kind = plan(command)
        if kind is None:
            problems[command].append("in no table of scripts/doc_commands.py and not a form: say how it is checked")
            continue
        words = filled(command.text)
        if words[:3] == ["python", "-m", "tpu_debug"]:
            words = ["tpu-debug", *words[3:]]
        if words[0] == "tpu-debug":
            if len(words) > 1:
                requests.append(("form" if kind.how == "form" else "parse", words[1:],
                                 str(base_of(words, root, work))))
                owners.append(command)
        elif words[0] == "torchrun":
            if kind.how == "form" and "--no-python" not in words and "tpu-debug" in words:
                problems[command].append("torchrun runs tpu-debug only with --no-python")
            requests.append(("torchrun", _which([w for w in words[1:] if w != "..."], python.parent),
                             str(base_of(words, root, work))))
            owners.append(command)
        else:
            problems[command] += _static_problems(command, root, work)
    for command in found:
        problems[command] += _variables_known(environment(command.text)[0], root)
    done = subprocess.run([str(python), "-c", PARSE], input=json.dumps(requests), cwd=work, capture_output=True,
                          text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the parser check failed: {done.stderr[-3000:]}")
    for command, problem in zip(owners, json.loads(done.stdout)):
        if problem:
            problems[command].append(problem)
    return problems


# -- running ----------------------------------------------------------------------------------------

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


@dataclasses.dataclass
class Outcome:
    command: Command
    how: str
    seconds: float
    ok: bool
    note: str
    cpu: float = 0.0  # the command's processes' CPU seconds: its cost whatever else runs


def _which(words: list[str], bindir: Path) -> list[str]:
    """``$(which NAME)`` is the wheel's script NAME."""
    return [str(bindir / w.removeprefix("@which:")) if w.startswith("@which:") else w for w in words]


def argv_of(words: list[str], bindir: Path) -> list[str]:
    words = _which(words, bindir)
    if words[0] == "tpu-debug":
        return [str(bindir / "tpu-debug"), *words[1:]]
    if words[0] == "torchrun":  # torchrun's console script is python -m torch.distributed.run
        return [str(bindir / "python"), "-m", "torch.distributed.run", *words[1:]]
    if words[0] == "python":
        return [str(bindir / "python"), *words[1:]]
    return words


def run_one(command: Command, words: list[str], code: int, bindir: Path, work: Path, root: Path,
            env: dict[str, str]) -> Outcome:
    extra, _ = environment(command.text)
    argv = argv_of(words, bindir)
    if words[:2] == ["tpu-debug", "tui"] and "--serve" not in words:
        argv = [str(bindir / "python"), "-c", TUI_IN_PTY, *argv]
    cwd = base_of(words, root, work)
    start, used = time.monotonic(), _children_cpu()
    try:
        done = subprocess.run(argv, cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                              timeout=3600, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(command, "run", time.monotonic() - start, False, "did not end within an hour")
    seconds, cpu = time.monotonic() - start, _children_cpu() - used
    ok = done.returncode == code
    if ok and words[-1] == "--help":
        ok = f"usage: {' '.join(words[:2])}" in done.stdout
    note = f"exit {done.returncode}" + ("" if ok else f" (expected {code}):\n{(done.stdout + done.stderr)[-3000:]}")
    return Outcome(command, "run", seconds, ok, note, cpu)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check(bindir: Path, work: Path, env: dict[str, str], *, full: bool, root: Path = ROOT,
          done: dict[str, str] | None = None, log=print) -> list[Outcome]:
    """Validate every documented command, then run those :data:`RUN` names (and, ``full``,
    those :data:`SLOW` names too) from the wheel whose scripts are in ``bindir``, in
    ``work`` (which holds ``examples/``). A command is run once whatever the number of
    documents that show it; ``done`` names the commands the caller already ran this way
    (the text -> where). Returns one outcome per command."""
    found = commands(root)
    problems = validate(found, bindir / "python", root, work)
    outcomes: list[Outcome] = []
    ran = dict(done or {})
    for command in found:
        how = plan(command)
        if problems[command]:
            outcomes.append(Outcome(command, "validate", 0.0, False, "; ".join(problems[command])))
            continue
        runs = how.how == "run" or (full and how.how == "slow")
        if runs and command.text in ran:
            outcomes.append(Outcome(command, f"run ({ran[command.text]})", 0.0, True, ""))
            continue
        if runs:
            ran[command.text] = f"as {command.doc}:{command.line}"
            log(f"--- {command}", flush=True)
            outcome = run_one(command, filled(command.text), how.code, bindir, work, root, env)
            log(f"    {outcome.seconds:.1f} s ({outcome.cpu:.1f} s CPU), {outcome.note.splitlines()[0]}", flush=True)
            outcomes.append(outcome)
        else:
            outcomes.append(Outcome(command, f"validated ({how.how}: {how.reason})", 0.0, True, ""))
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    rows = ["| command | where | checked | wall s | CPU s | ok |", "|---|---|---|---:|---:|---|"]
    for o in outcomes:
        rows.append(f"| `{o.command.text}` | {o.command.doc}:{o.command.line} | {o.how} | {o.seconds:.1f} | {o.cpu:.1f} | "
                    f"{'yes' if o.ok else 'NO: ' + o.note.splitlines()[0]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    for command in commands():
        print(command)
