"""CLI semantics through ``main([...])`` (in process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
import torch

import tpu_debug
from tpu_debug.cli import COMMANDS, main

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = (x.to("tpu") * 0.5 + 2.0).relu()
    with open(os.path.join(os.path.dirname(__file__), "seen.json"), "w") as f:
        json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
                   "main_is_me": sys.modules["__main__"].__dict__ is globals(),
                   "result": y.cpu().tolist()}, f)
    print("script says hi")
    """
)


@pytest.fixture
def script(tmp_path):
    def make(body: str, name: str = "prog.py"):
        path = tmp_path / "scripts" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(textwrap.dedent(body))
        return path

    return make


def _seen(script_path):
    return json.loads((script_path.parent / "seen.json").read_text())


@pytest.mark.quick
def test_run_gives_the_script_what_python_would(script, logdir, capsys):
    prog = script(PROBE)
    saved_argv, saved_path0, saved_main = list(sys.argv), sys.path[0], sys.modules["__main__"]
    code = main(["run", "--logdir", str(logdir), str(prog), "a", "--flag", "-m", "x"])
    assert code == 0
    seen = _seen(prog)
    assert seen["argv"] == [str(prog), "a", "--flag", "-m", "x"]
    assert seen["name"] == "__main__" and seen["main_is_me"]
    assert seen["path0"] == str(prog.parent.resolve())
    assert seen["file"] == str(prog.absolute())
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert seen["result"] == (x * 0.5 + 2.0).relu().tolist()
    # the runner put everything back
    assert (sys.argv, sys.path[0], sys.modules["__main__"]) == (saved_argv, saved_path0, saved_main)
    out, err = capsys.readouterr()
    assert out == "script says hi\n"
    assert "tpu_debug report: prog" in err and "Top ops by time" in err
    assert re.search(r"run saved in .*Z-prog \(tpu-debug report .*Z-prog\)\n$", err)
    session = tpu_debug.open_run(logdir=logdir)
    meta = session.metadata()
    assert (meta.status, meta.exit_status, meta.argv) == (
        "finished",
        0,
        (str(prog), "a", "--flag", "-m", "x"),
    )
    assert {o.name for o in session.ops()} >= {"mul.Tensor", "add.Tensor", "relu"}


@pytest.mark.quick
@pytest.mark.parametrize(
    "body, code, stderr_line, status",
    [
        ("import sys; sys.exit(3)", 3, None, "failed"),
        ("import sys; sys.exit()", 0, None, "finished"),
        ("import sys; sys.exit('bye now')", 1, "bye now", "failed"),
        ("raise SystemExit(0)", 0, None, "finished"),
    ],
)
def test_exit_codes_are_forwarded(script, logdir, capsys, body, code, stderr_line, status):
    prog = script(body)
    assert main(["run", "--no-report", "--logdir", str(logdir), str(prog)]) == code
    err = capsys.readouterr().err
    if stderr_line:
        assert err.splitlines()[0] == stderr_line
    meta = tpu_debug.open_run(logdir=logdir).metadata()
    assert (meta.status, meta.exit_status) == (status, code)


def test_exception_prints_its_traceback_and_the_run_is_kept(script, logdir, capsys):
    prog = script(
        """
        import torch
        x = torch.ones(2, device="tpu") * 3.0

        def explode():
            raise ValueError("boom")

        explode()
        """
    )
    assert main(["run", "--logdir", str(logdir), str(prog)]) == 1
    err = capsys.readouterr().err
    tb = err[: err.index("tpu_debug report")].strip().splitlines()
    assert tb == [
        "Traceback (most recent call last):",
        f'  File "{prog}", line 8, in <module>',
        "    explode()",
        f'  File "{prog}", line 6, in explode',
        '    raise ValueError("boom")',
        "ValueError: boom",
    ]
    assert "Top ops by time" in err
    session = tpu_debug.open_run(logdir=logdir)
    meta = session.metadata()
    assert (meta.status, meta.exit_status, meta.error) == ("failed", 1, "ValueError: boom")
    assert session.ops(name="mul.Tensor")[0].count == 1


def test_run_module(tmp_path, logdir, monkeypatch, capsys):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text("import sys\nprint('module', __name__, sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--no-report", "--logdir", str(logdir), "-m", "mypkg.tool", "x", "--y"]) == 0
    assert capsys.readouterr().out == "module __main__ ['x', '--y']\n"
    assert tpu_debug.open_run(logdir=logdir).run_dir.name.endswith("-tool")


def test_missing_script(tmp_path, capsys):
    missing = tmp_path / "nope.py"
    assert main(["run", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"tpu-debug run: can't open file '{missing}': no such file. "
        "Pass the path of a Python script: tpu-debug run script.py [args ...]\n"
    )


def test_flags_beat_the_environment(script, tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_LOGDIR", str(tmp_path / "from_env"))
    monkeypatch.setenv("TPU_DEBUG_HLO", "0")
    prog = script("import torch\ny = torch.ones(3, device='tpu') + 1.0\n")
    assert (
        main(["run", "--no-report", "--logdir", str(tmp_path / "from_flag"), "--name", "flagged", str(prog)])
        == 0
    )
    assert not (tmp_path / "from_env").exists()
    session = tpu_debug.open_run(logdir=tmp_path / "from_flag")
    assert session.run_dir.name.endswith("-flagged")
    assert session.metadata().options["hlo"] is False
    assert main(["run", "--no-report", "--hlo", str(prog)]) == 0
    assert tpu_debug.open_run().metadata().options["hlo"] is True  # TPU_DEBUG_LOGDIR is where it went


def test_bad_environment_is_one_line(script, monkeypatch, capsys):
    monkeypatch.setenv("TPU_DEBUG_OP_EVENTS", "sometimes")
    assert main(["run", str(script("pass"))]) == 1
    assert capsys.readouterr().err == (
        "tpu-debug run: TPU_DEBUG_OP_EVENTS='sometimes' is not a boolean; "
        "use one of 1/0, true/false, yes/no, on/off\n"
    )


def test_report_latest_and_named(script, logdir, capsys):
    prog = script("import torch\ny = torch.ones(3, device='tpu') * 2.0\n", name="first.py")
    main(["run", "--no-report", "--logdir", str(logdir), str(prog)])
    main(["run", "--no-report", "--logdir", str(logdir), str(script("pass\n", name="second.py"))])
    capsys.readouterr()
    assert main(["report", "--logdir", str(logdir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tpu_debug report: second\n") and "no ops recorded" in out
    assert main(["report", "--logdir", str(logdir), "first"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tpu_debug report: first\n") and "mul.Tensor" in out


def test_report_bad_input_is_one_line(tmp_path, logdir, capsys):
    assert main(["report", "--logdir", str(logdir)]) == 1
    assert capsys.readouterr().err == (
        f"tpu-debug report: no runs in {logdir}: record one with 'tpu-debug run script.py', "
        "or point --logdir / TPU_DEBUG_LOGDIR at the directory holding your runs.\n"
    )
    assert main(["report", "--logdir", str(logdir), "ghost"]) == 1
    assert capsys.readouterr().err == (
        f"tpu-debug report: ghost: no such run (not a path, nor a run name in {logdir}). "
        "List recorded runs with 'tpu-debug runs'.\n"
    )
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 512)
    assert main(["report", str(junk)]) == 1
    assert capsys.readouterr().err == (
        f"tpu-debug report: {junk}: not a readable tpu_debug run (file is not a database). "
        "The file is damaged or truncated; re-record the run.\n"
    )


def test_runs_lists_runs_and_flags_damaged_ones(script, logdir, capsys):
    assert main(["runs", "--logdir", str(logdir)]) == 0
    assert capsys.readouterr().err == f"no runs in {logdir}: record one with 'tpu-debug run script.py'\n"
    main(["run", "--no-report", "--logdir", str(logdir), str(script("pass\n", name="alpha.py"))])
    main(["run", "--no-report", "--logdir", str(logdir), str(script("pass\n", name="beta.py"))])
    damaged = tpu_debug.list_runs(logdir)[0] / "run.db"
    damaged.write_bytes(b"garbage" * 100)
    capsys.readouterr()
    assert main(["runs", "--logdir", str(logdir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "status", "duration", "platform", "op", "calls", "events", "command"]
    assert "-alpha" in lines[1] and "unreadable" in lines[1]
    assert "-beta" in lines[2] and "finished" in lines[2] and "cpu x1" in lines[2]


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: tpu-debug" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit, match=r"^0$") as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"tpu-debug {tpu_debug.__version__}\n"


def test_console_script_points_at_main():
    (ep,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "tpu-debug"]
    assert ep.value == "tpu_debug.cli:main"
    assert callable(ep.load())


def test_report_goes_to_a_terminal_in_rich(script, logdir, capsys, monkeypatch):
    main(["run", "--no-report", "--logdir", str(logdir), str(script("pass\n"))])
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["report", "--logdir", str(logdir)]) == 0
    assert "\x1b[" in capsys.readouterr().out
    assert main(["report", "--plain", "--logdir", str(logdir)]) == 0
    assert "\x1b[" not in capsys.readouterr().out
    os.environ.pop("FORCE_COLOR", None)


def test_a_script_that_traces_itself_is_told_why_it_cannot(script, logdir, capsys):
    prog = script("import tpu_debug\nwith tpu_debug.trace():\n    pass\n")
    assert main(["run", "--no-report", "--logdir", str(logdir), str(prog)]) == 1
    err = capsys.readouterr().err
    # in process, the first user frame above the runner is this test; from a shell it is
    # "started outside your code, e.g. by 'tpu-debug run'"
    assert re.search(
        r"TraceActiveError: a trace is already recording \(started at .*test_cli\.py:\d+ in "
        r"test_a_script_that_traces_itself_is_told_why_it_cannot\); tpu_debug records one trace at a time\. "
        r"End it before starting another\.",
        err,
    )


@pytest.mark.parametrize("verb", [None, *COMMANDS])
def test_help_is_plain_text(verb, capsys):
    # help is read in a terminal: no reST markup from the docstrings it is made of
    with pytest.raises(SystemExit, match=r"^0$"):
        main(["--help"] if verb is None else [verb, "--help"])
    text = capsys.readouterr().out
    assert "usage: tpu-debug" in text
    assert not re.search(r"``|:(class|func|data|meth):`", text), text


def test_a_tpu_debug_error_ending_the_script_shows_the_users_frame_and_its_message(tmp_path, capsys):
    script = tmp_path / "guarded.py"
    script.write_text(
        "import torch\nimport tpu_debug\n\n"
        "def main():\n"
        "    s = torch.ones(3, device='tpu').sum()\n"
        "    with tpu_debug.transfer_guard('disallow'):\n"
        "        print(s.item())\n\n"
        "main()\n"
    )
    logdir = tmp_path / "runs"
    assert main(["run", "--logdir", str(logdir), "--no-report", str(script)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    start = lines.index("Traceback (the innermost frame of the script; tpu-debug run --traceback shows every frame):")
    assert lines[start + 1] == f'  File "{script}", line 7, in main'
    assert lines[start + 2].strip() == "print(s.item())"
    message = next(line for line in lines[start:] if line.startswith("TransferGuardError: "))
    assert f"by .item() at {script}:7 in main is disallowed" in message
    assert "site-packages" not in err and "runtime" not in err  # no library frame
    # --traceback: every frame, the runtime's too
    assert main(["run", "--logdir", str(logdir), "--no-report", "--traceback", str(script)]) == 1
    full = capsys.readouterr().err
    assert "Traceback (most recent call last):" in full and full.count('  File "') > 2



# each verb's help in one process of its own; the forms that give `run` a script-like word come
# first, so `run` meets them as in a fresh process (help imports nothing that changes that)
_HELP_FORMS = """
import contextlib, io, json, sys
from tpu_debug.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    done.append((argv, code, out.getvalue(), err.getvalue()))
print(json.dumps(done))
"""


@pytest.mark.parametrize("verb", COMMANDS)
def test_run_help_prints_no_script_given(verb, tmp_path):
    # every verb's help, through the console script in a process that has not imported torch
    # (`run` then checks its script before importing anything heavy: -h is not a script)
    forms = [[verb, *extra] for extra in (["-h", "nosuch.py"], ["--logdir", "somewhere", "-h"], ["-h"], ["--help"])]
    proc = subprocess.run([sys.executable, "-c", _HELP_FORMS, json.dumps(forms)], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for argv, code, out, err in json.loads(proc.stdout):
        assert code in (0, None), (argv, err)
        assert f"usage: tpu-debug {verb}" in out, (argv, out)


def test_syntax_error_script_gets_a_30_line_report(script, logdir, capsys):
    # a script Python cannot compile never started: no report of an empty run, no run kept
    bad = script("import torch\n\ndef f(:\n    pass\n", name="bad.py")
    assert main(["run", "--logdir", str(logdir), str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f'  File "{bad}", line 3',
        "    def f(:",
        "          ^",
        "SyntaxError: invalid syntax",
        "",
        (
            f"tpu-debug run: {bad} did not start: SyntaxError: invalid syntax (bad.py, line 3). "
            "Nothing ran and no run was recorded; fix the script and run it again."
        ),
    ]
    assert captured.out == ""
    assert not logdir.exists() or not any(logdir.iterdir())


@pytest.mark.parametrize("broken", ["tool.py", "__init__.py", "__main__.py"])
def test_syntax_error_module_gets_a_long_report(broken, tmp_path, logdir, monkeypatch, capsys):
    # `-m` answers as a script does: the module (or a parent package, or a package's
    # __main__) that Python cannot compile is named, and nothing runs or is recorded
    pkg = tmp_path / "brokenpkg"
    pkg.mkdir()
    for name in ("__init__.py", "tool.py", "__main__.py"):
        (pkg / name).write_text("print('ran', __name__)\n")
    (pkg / broken).write_text("import sys\n\ndef f(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    target = "brokenpkg" if broken == "__main__.py" else "brokenpkg.tool"
    assert main(["run", "--logdir", str(logdir), "-m", target]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f'  File "{pkg / broken}", line 3',
        "    def f(:",
        "          ^",
        "SyntaxError: invalid syntax",
        "",
        (
            f"tpu-debug run: -m {target} did not start: SyntaxError: invalid syntax ({broken}, line 3). "
            "Nothing ran and no run was recorded; fix the script and run it again."
        ),
    ]
    assert captured.out == ""  # not even the parent package ran
    assert not logdir.exists() or not any(logdir.iterdir())


def test_run_package_module(tmp_path, logdir, monkeypatch, capsys):
    # a package runs as its __main__ module, compiled first like any module
    pkg = tmp_path / "mainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("print('main of', __spec__.name)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--no-report", "--logdir", str(logdir), "-m", "mainpkg"]) == 0
    assert capsys.readouterr().out == "main of mainpkg.__main__\n"


def test_run_ctrl_c_traceback_ends_in_raise_interrupt(script, logdir, capsys):
    import signal

    prog = script("import signal\n\ndef loop():\n    signal.raise_signal(signal.SIGINT)\n\nloop()\n")
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["run", "--no-report", "--logdir", str(logdir), str(prog)]) == 130
    finally:
        signal.signal(signal.SIGINT, inherited)
    err = capsys.readouterr().err
    trace = err[err.index("Traceback (most recent call last):") : err.index("KeyboardInterrupt")]
    assert "tpu_debug" not in trace, err
    assert trace.rstrip().splitlines()[-2:] == [
        f'  File "{prog}", line 4, in loop',
        "    signal.raise_signal(signal.SIGINT)",
    ]
