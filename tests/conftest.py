from __future__ import annotations

import os
import sys

# Machines of this project's kind export PYTHONDONTWRITEBYTECODE=1: every Python process the suite
# starts (the xdist workers, warm interpreters, the scripts tests run) would compile tpu_debug's
# sources again (about 0.7 s of CPU each), and each pytest process would rewrite the asserts of
# tpu_debug (a pytest plugin's distribution) again (about 2.5 s). Bytecode changes no behaviour a
# test checks: the suite lets Python keep it, as Python does by default.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Tests never pick up a user's TPU_DEBUG_* settings by accident. TPU_DEBUG_OPINFO_* and
# TPU_DEBUG_MODULEINFO_* (the OpInfo and ModuleInfo harnesses' tier and results files) and
# TPU_DEBUG_FAULTS_* (where the fault-injection suite writes its figures) steer test harnesses,
# not runtime behaviour.
_HARNESS_VARIABLES = ("TPU_DEBUG_OPINFO_", "TPU_DEBUG_MODULEINFO_", "TPU_DEBUG_FAULTS_")
for _name in [n for n in os.environ if n.startswith("TPU_DEBUG_") and not n.startswith(_HARNESS_VARIABLES)]:
    del os.environ[_name]
# nor TorchTPU's name for one of them (core/options.py: an option's alias)
os.environ.pop("TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS", None)
# Plain-text reports take their width from $COLUMNS, which pytest-xdist's workers set to 80 and a
# developer's shell to anything: tests that read a report see its default width unless they set one.
os.environ.pop("COLUMNS", None)
# Tests compile from scratch, in this process and in the scripts they run: a user's persistent
# compile cache would turn compiles into read-backs and make counts depend on earlier runs.
# tests/runtime/test_compile_cache.py turns it on, in a temporary directory. Helpers that give
# a child process none of the test process's TPU_DEBUG_* variables keep this one.
os.environ["TPU_DEBUG_COMPILE_CACHE"] = "0"
# The suite's programs are small and run once or a few times: their time is their compile, a
# third of which XLA's CPU backend spends optimizing machine code (core/options.py). Results do
# not change with the level (tests/runtime/test_xla_options.py compares both levels); the
# programs users run, and the examples the README runs, compile at XLA's default.
os.environ["TPU_DEBUG_FAST_LOCAL_COMPILE"] = "1"
# Every Python process the tests start ends without the interpreter's last garbage collection
# (tests/_fast_exit/sitecustomize.py says why): about half a second of CPU each.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, (os.path.join(os.path.dirname(__file__), "_fast_exit"), os.environ.get("PYTHONPATH")))
)

import pytest  # noqa: E402
import torch  # noqa: E402

import tpu_debug  # noqa: E402,F401 - registers the tpu device


@pytest.fixture(autouse=True)
def _compile_debug_collector_stopped():
    """TorchTPU's compile-debug collector (``TpuBackend(debug=True)``) listens to the runtime
    for the rest of the process once started, as in a user's script; a test that started it
    stops it, so that the next test sees only the probes it subscribed itself."""
    yield
    import sys

    compile_debug = sys.modules.get("tpu_debug.runtime.torchtpu.compile")
    if compile_debug is not None and compile_debug._collector:
        from tpu_debug.runtime import probes

        probes.unsubscribe(compile_debug._collector.pop())


@pytest.fixture(autouse=True)
def _excepthook_restored():
    """``torch.distributed.init_process_group`` wraps ``sys.excepthook`` to prefix each line
    with the rank, once per call, and leaves it so: a test that starts a process group in this
    process must not change how a later test's ``tpu-debug run`` prints a traceback."""
    import sys

    hook = sys.excepthook
    yield
    sys.excepthook = hook


@pytest.fixture
def tpu():
    return torch.device("tpu")


def on_both(fn, *cpu_args, **kwargs):
    """Run ``fn`` on the CPU args and on copies moved to tpu; return (cpu, tpu-as-cpu)."""
    moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    ref = fn(*cpu_args, **kwargs)
    out = fn(*moved, **kwargs)
    return ref, _to_cpu(out)


def _to_cpu(out):
    if isinstance(out, torch.Tensor):
        return out.cpu()
    if isinstance(out, (list, tuple)):
        return type(out)(_to_cpu(o) for o in out)
    return out


# the tests that start first on xdist workers (pytest_collection_modifyitems)
_FIRST = ("tests/distributed/",)
# tests of one module sent to an xdist worker at once, when they share no fixture
_CHUNK = 8


# first: xdist's own hook reads the marks (it names each marked test after its group)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The xdist work units: a module sharing a fixture is one, the other tests go in eights.

    pytest-xdist's ``load`` scheduling hands a module's tests to both workers, and each worker
    then builds the module's fixtures again: a torchrun launch, a traced run, a compile, done
    twice. With ``--dist loadgroup`` (pyproject's addopts) each ``xdist_group`` is one work
    unit: a module that uses a module-, class- or package-scoped fixture of this suite is one
    group, so its fixtures are built once. The other tests go in groups of ``_CHUNK``
    consecutive tests of a module: sent one by one, a worker waits for the next test after
    each short one (measured: a quarter longer on OpInfo's millisecond tests). Without xdist
    the marks change nothing.

    The units start in collection order (``--no-loadscope-reorder``), and on an xdist worker
    the tests that launch process groups (tests/distributed: torchrun and ``--nproc`` jobs,
    tens of seconds each) come first, so the last units to start are short and the two
    workers end together. Every worker sorts the same way, so their collections agree."""
    both = [item.nodeid for item in items if item.get_closest_marker("quick") and item.get_closest_marker("slow")]
    if both:
        # `-m quick` would run them: the quick tier is a few minutes of the default tier
        raise pytest.UsageError(f"tests marked both quick and slow: {both}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not item.nodeid.startswith(_FIRST))
    counts: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        info = getattr(item, "_fixtureinfo", None)
        shared = info is not None and any(
            d.scope in ("module", "class", "package") and d.baseid
            for defs in info.name2fixturedefs.values() for d in defs
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))
        else:
            # no "]" in a group's name: xdist reads one after the "@" as a parameter id's
            n = counts[module] = counts.get(module, -1) + 1
            item.add_marker(pytest.mark.xdist_group(f"{module}#{n // _CHUNK}"))
