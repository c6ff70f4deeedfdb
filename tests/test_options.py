"""Options (core/options.py): one declaration each, from which the environment
parsing, ``trace()``'s keywords, ``TraceConfig``, the runtime's config objects and the
flags of ``tpu-debug run`` all come, with one parsing rule for every variable."""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tpu_debug.runtime.config import RuntimeConfig
from tpu_debug.runtime.distributed.config import DistributedConfig

import tpu_debug
from tpu_debug.core import options
from tpu_debug.cli import main
from tpu_debug.cli.run import prepare_parser
from tpu_debug.trace_config import TraceConfig
from tpu_debug.core.errors import ConfigError

# Written out by hand, not read from the declarations: every TPU_DEBUG_* option variable
# the documentation (README, docstrings) promises, with a value each one refuses.
JUNK = {
    "TPU_DEBUG_LOGDIR": " ",
    "TPU_DEBUG_NAME": " ",
    "TPU_DEBUG_HLO": "maybe",
    "TPU_DEBUG_OP_EVENTS": "2",
    "TPU_DEBUG_TENSORBOARD": "junk",
    "TPU_DEBUG_TENSORBOARD_MAX_EVENTS": "many",
    "TPU_DEBUG_DIVERGENCE": "junk",
    "TPU_DEBUG_NUMERICS": "gpu",
    "TPU_DEBUG_TOLERANCES": "float32=x",
    "TPU_DEBUG_DIVERGENCE_SAMPLE": "0",
    "TPU_DEBUG_STORM_THRESHOLD": "-3",
    "TPU_DEBUG_FAIL_ON_RECOMPILE": "junk",
    "TPU_DEBUG_TRANSFER_GUARD": "off",
    "TPU_DEBUG_TRANSFER_GUARD_IMPLICIT": "junk",
    "TPU_DEBUG_EAGER_MODE": "junk",
    "TPU_DEBUG_TARGET": " ",
    "TPU_DEBUG_TARGET_WAIT": "soon",
    "TPU_DEBUG_MEMORY": "junk",
    "TPU_DEBUG_MEMORY_SNAPSHOT": " ",
    "TPU_DEBUG_DRY_RUN": "junk",
    "TPU_DEBUG_CPU_FALLBACK": "junk",
    "TPU_DEBUG_DATA_CHECKS": "junk",
    "TPU_DEBUG_MATMUL_PRECISION": "low",
    "TPU_DEBUG_EAGER_CACHE_SIZE": "0",
    "TPU_DEBUG_COMPILED_CACHE_SIZE": "lots",
    "TPU_DEBUG_INDEX_CACHE_BYTES": "1.5",
    "TPU_DEBUG_LAZY_GRAPH_LIMIT": "none",
    "TPU_DEBUG_FAST_LOCAL_COMPILE": "junk",
    "TPU_DEBUG_RANK_CHECK": "junk",
    "TPU_DEBUG_RANK_TIMEOUT": "0",
    "TPU_DEBUG_COLLECTIVE_CHECK": "junk",
    "TPU_DEBUG_COLLECTIVE_TIMEOUT": "0",
    "TPU_DEBUG_FLIGHT_RECORDER_AT_EXIT": "junk",
    "TPU_DEBUG_COMPILE_CACHE": "junk",
    "TPU_DEBUG_COMPILE_CACHE_DIR": " ",
    "TPU_DEBUG_COMPILE_CACHE_BYTES": "1GB",
    "TPU_DEBUG_TRACEBACK": "junk",
    "TPU_DEBUG_COORDINATOR": "localhost",
    "TPU_DEBUG_NPROC": "0",
    "TPU_DEBUG_RANK": "-1",
    "TPU_DEBUG_TARGET_CACHE": " ",
}
# the reading verbs use the logdir too, and a target's capacity comes from the target cache
RECORDING = sorted(set(JUNK) - {"TPU_DEBUG_LOGDIR", "TPU_DEBUG_TARGET_CACHE"})


def test_every_documented_variable_is_declared_once():
    names = [o.env for o in options.OPTIONS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(JUNK)


# -- one parsing rule -------------------------------------------------------------------


@pytest.mark.parametrize("var", sorted(JUNK))
def test_junk_is_one_line_naming_the_variable_the_value_and_what_is_accepted(var):
    raw = JUNK[var]
    with pytest.raises(ConfigError, match=rf"^{var}") as caught:
        options.check_env({var: raw})
    message = str(caught.value)
    assert "\n" not in message
    if not raw.strip():
        assert message.endswith(", or unset it")
    elif var == "TPU_DEBUG_TOLERANCES":  # the spec's own parser says what is wrong in it
        assert message.startswith(f"{var}={raw!r}: tolerance for float32: 'x' is not rtol")
    else:
        assert message.startswith(f"{var}={raw!r} is not ") and "; use " in message


@pytest.mark.parametrize("opt", [o for o in options.OPTIONS if o.kind is options.BOOL], ids=lambda o: o.name)
def test_every_boolean_reads_the_same_words(opt):
    for raw, value in [("1", True), (" Yes ", True), ("ON", True), ("true", True),
                       ("0", False), ("no", False), ("Off", False), ("FALSE", False)]:
        assert options.read_env([opt], {opt.env: raw}) == {opt.name: value}
    # blank is refused for a boolean as for any other option (unset it to get the default)
    with pytest.raises(ConfigError, match=rf"^{opt.env} is set but empty; set it to a boolean, or unset it$"):
        options.read_env([opt], {opt.env: ""})


def test_another_tools_variable_for_an_option_is_read_after_ours():
    """TorchTPU's TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS sets data_checks, parsed by the same
    rule and named in its error; TPU_DEBUG_DATA_CHECKS wins when both are set."""
    env = {"TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS": "1"}
    assert options.read_env("runtime", env)["data_checks"] is True
    assert options.read_env("runtime", {**env, "TPU_DEBUG_DATA_CHECKS": "0"})["data_checks"] is False
    assert RuntimeConfig.from_env(env).data_checks is True
    with pytest.raises(ConfigError, match="^TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS='maybe' is not a boolean"):
        options.read_env("runtime", {"TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS": "maybe"})


def test_counts_and_seconds():
    count = options.option("storm_threshold")
    assert options.read_env([count], {count.env: " 1_000 "}) == {"storm_threshold": 1000}
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_STORM_THRESHOLD='0' is not a positive integer; use a count "):
        options.read_env([count], {count.env: "0"})
    wait, timeout = options.option("target_wait"), options.option("rank_timeout")
    assert options.read_env([wait], {wait.env: "0"}) == {"target_wait": 0.0}  # 0: do not wait
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_RANK_TIMEOUT='0' is not a number of seconds above 0; "):
        options.read_env([timeout], {timeout.env: "0"})
    with pytest.raises(ConfigError, match=r"^TPU_DEBUG_TARGET_WAIT='inf' is not a number of seconds; "):
        options.read_env([wait], {wait.env: "inf"})


def test_readers_find_runs_from_the_logdir_variable_alone():
    junk = {var: JUNK[var] for var in RECORDING}
    assert options.default_logdir(junk) == Path("tpu_debug_runs")
    assert options.default_logdir({**junk, "TPU_DEBUG_LOGDIR": " /data/runs "}) == Path("/data/runs")


# -- everything derived from the declarations -------------------------------------------


def test_trace_keywords_config_fields_and_flags_come_from_the_declarations():
    trace_options = [o.name for o in options.OPTIONS if "trace" in o.scopes]
    assert [f for f in TraceConfig.__dataclass_fields__] == trace_options
    params = inspect.signature(tpu_debug.trace).parameters
    assert list(params) == trace_options
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in params.values())
    parser = argparse.ArgumentParser()
    prepare_parser(parser)
    flags = {a.dest: a.option_strings for a in parser._actions if a.option_strings}
    for name in trace_options:
        assert f"--{name.replace('_', '-')}" in flags[name]
    assert set(RuntimeConfig().as_dict()) == {o.name for o in options.OPTIONS if "runtime" in o.scopes}
    assert set(DistributedConfig().as_dict()) == {"rank_check", "rank_timeout", "collective_check", "collective_timeout",
                                                  "flight_recorder_at_exit"}
    with pytest.raises(TypeError, match=r"^trace\(\) got an unexpected keyword argument 'hlos'$"):
        tpu_debug.trace(hlos=True)


def test_trace_config_writes_out_every_trace_option():
    """Editors and type checkers see TraceConfig's fields: its class body declares each trace
    option, in the table's order (a field the table lacks, or an option the body lacks, fails)."""
    assert list(TraceConfig.__annotations__) == [o.name for o in options.options("trace")]
    assert TraceConfig.__mro__[1:] == (object,)
    assert TraceConfig() == TraceConfig(**{o.name: o.default_in("trace") for o in options.options("trace")})


def test_every_variable_the_package_names_is_declared():
    """No TPU_DEBUG_* variable lives outside the option table: each one the source names (to read,
    set or document) is an option's."""
    root = Path(__file__).resolve().parents[1]
    folders = ("core", "runtime", "tracers", "tpu_debug", "tui")
    sources = [p for folder in folders for p in (root / folder).rglob("*.py")]
    named = {m for p in sources for m in re.findall(r"TPU_DEBUG_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    assert named - {o.env for o in options.OPTIONS} == set()


def test_an_option_shared_by_trace_and_runtime_leaves_the_runtime_alone_by_default():
    # numerics and eager_mode: one variable each, read by both config objects
    env = {"TPU_DEBUG_NUMERICS": "TPU", "TPU_DEBUG_EAGER_MODE": "defer_and_fuse"}
    assert (TraceConfig().numerics, TraceConfig().eager_mode) == (None, None)
    assert (RuntimeConfig().numerics, RuntimeConfig().eager_mode) == ("cpu", "defer_never")
    trace_cfg, runtime_cfg = TraceConfig.from_env(env), RuntimeConfig.from_env(env)
    assert (trace_cfg.numerics, trace_cfg.eager_mode) == ("tpu", "defer_and_fuse")
    assert (runtime_cfg.numerics, runtime_cfg.eager_mode) == ("tpu", "defer_and_fuse")


def test_adding_an_option_is_one_declaration(tmp_path):
    """A new option declared in the table alone is a trace() keyword, a TraceConfig field,
    a TPU_DEBUG_* variable and a 'tpu-debug run' flag (in a fresh interpreter: the
    derived objects are built when their modules are imported)."""
    code = """
        from tpu_debug.core import options as o
        o.OPTIONS += (o.Option("sample_rate", o.COUNT, 7, "keep every N-th sample"),)
        import argparse, inspect, os
        from tpu_debug.trace_config import TraceConfig
        from tpu_debug.cli.run import prepare_parser
        import tpu_debug.tracing
        parser = argparse.ArgumentParser()
        prepare_parser(parser)
        print(TraceConfig().sample_rate, TraceConfig.from_env({"TPU_DEBUG_SAMPLE_RATE": "3"}).sample_rate)
        print(parser.parse_args(["--sample-rate", "5", "s.py"]).sample_rate)
        print("sample_rate" in inspect.signature(tpu_debug.tracing.trace).parameters)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["7 3", "5", "True", ""]


# -- recording with a bad variable: one line, before the script runs ----------------------


@pytest.mark.parametrize("var", RECORDING)
def test_run_with_a_bad_recording_variable_says_so_in_one_line(var, tmp_path, monkeypatch, capsys):
    script = tmp_path / "script.py"
    script.write_text("open('ran', 'w').write('the script ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, JUNK[var])
    assert main(["run", "--logdir", str(tmp_path / "runs"), str(script)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tpu-debug run: {var}")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()


# -- in fresh processes: import parses nothing, the reading verbs ignore recording options ----

# what the installed ``tpu-debug`` console script runs
_CONSOLE = "import sys; from tpu_debug.cli import main; sys.exit(main())"


def _process(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, *argv], check=False, capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, **env})


def _recorded_run(tmp_path: Path) -> Path:
    from tpu_debug.tracers.store import DB_NAME
    from tpu_debug.tracers.recording.run_writer import RunWriter

    run_dir = tmp_path / "runs" / "20260131T120000.000Z-fine"
    run_dir.mkdir(parents=True)
    meta = {"name": "fine", "platform": "cpu", "device_kind": "cpu", "device_count": 1, "argv": ["fine.py"],
            "cwd": str(tmp_path), "start_time": "2026-01-31T12:00:00.000+00:00"}
    RunWriter(run_dir / DB_NAME, meta).close({"status": "finished", "exit_status": 0, "duration": 1.0})
    return run_dir


def test_bad_recording_variables_leave_import_and_the_reading_verbs_alone(tmp_path):
    run_dir = _recorded_run(tmp_path)
    junk = {var: JUNK[var] for var in RECORDING}  # every one at once: none of them is read
    runs = _process(["-c", _CONSOLE, "runs", "--logdir", str(run_dir.parent)], tmp_path, junk)
    assert (runs.returncode, runs.stderr) == (0, "") and run_dir.name in runs.stdout
    report = _process(["-c", _CONSOLE, "report", "--plain", str(run_dir)], tmp_path, junk)
    assert (report.returncode, report.stderr) == (0, "") and report.stdout.startswith("tpu_debug report: fine\n")
    imported = _process(["-c", "import tpu_debug"], tmp_path, junk)
    assert (imported.returncode, imported.stdout, imported.stderr) == (0, "", "")


def test_run_with_a_bad_variable_is_one_line_and_fails(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    done = _process(["-c", _CONSOLE, "run", str(script)], tmp_path, {"TPU_DEBUG_EAGER_MODE": "junk"})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        (
            "tpu-debug run: TPU_DEBUG_EAGER_MODE='junk' is not an eager mode; "
            "use one of defer_and_fuse, defer_never, defer_never_and_launch_blocking"
        )
    ]
