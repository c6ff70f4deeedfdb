"""What starting tpu_debug costs: ``import tpu_debug`` and the reading verbs of the
CLI do not import ``torch._dynamo`` (about a second); dynamo is imported by ``torch.compile``,
and our backends and kernel shields are in place when it is. The ``tpu-debug`` console
script (``tpu_debug.cli.main``) runs the reading verbs without torch and jax at all.

Each check runs in a fresh interpreter: this one has imported dynamo long ago."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter


def _python(code: str, cwd) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _tiny_run(tmp_path):
    run_dir = tmp_path / "runs" / "20260131T120000.000Z-tiny"
    run_dir.mkdir(parents=True)
    meta = {
        "name": "tiny",
        "platform": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "argv": ["tiny.py"],
        "cwd": str(tmp_path),
        "start_time": "2026-01-31T12:00:00.000+00:00",
    }
    RunWriter(run_dir / DB_NAME, meta).close({"status": "finished", "exit_status": 0, "duration": 1.0})
    return run_dir


def test_reading_verbs_do_not_import_dynamo(tmp_path):
    run_dir = _tiny_run(tmp_path)
    out = _python(
        f"""
        import contextlib, io, sys
        import torch
        import tpu_debug
        assert tpu_debug.runtime.installed()  # by import torch
        from tpu_debug import cli
        import tpu_debug.tui.app  # what 'tpu-debug tui' imports in a terminal
        for argv in (["tui", {str(run_dir)!r}], ["report", {str(run_dir)!r}],
                     ["runs", "--logdir", {str(run_dir.parent)!r}],
                     ["tensorboard", {str(run_dir)!r}, "--print"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                print(argv[0], cli.main(argv), file=sys.__stdout__)
        print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
        """,
        tmp_path,
    )
    # tui: 2, not a terminal; tensorboard: 1, the run has no TensorBoard data
    assert out.split("\n") == ["tui 2", "report 0", "runs 0", "tensorboard 1", "[]", ""]


def test_backends_are_registered_when_dynamo_is_imported(tmp_path):
    out = _python(
        """
        import sys
        import torch
        import tpu_debug
        from tpu_debug.runtime import compiled
        print("torch._dynamo" in sys.modules)
        from torch._dynamo.backends import registry
        print(registry.get_default_backend() is compiled._auto_backend)
        print(registry.lookup_backend("tpu") is compiled.dynamo_backend)
        print(registry.lookup_backend("tpu_debug") is compiled.dynamo_backend)
        # the hook waiting for dynamo is gone (absl's, for libtpu's flags, waits for absl)
        print(not [f for f in sys.meta_path if type(f).__name__ == "_PostImportHook" and f.name == "torch._dynamo"])
        """,
        tmp_path,
    )
    assert out.split() == ["False", "True", "True", "True", "True"]


def test_default_compile_picks_our_backend_after_a_lazy_dynamo_import(tmp_path):
    out = _python(
        """
        import torch
        import tpu_debug
        from tpu_debug.runtime import compiled

        x = torch.randn(4, 3, device="tpu")
        before = len(compiled.graph_stats())
        y = torch.compile(lambda t: t * 2 + 1)(x)  # the default backend
        print(len(compiled.graph_stats()) - before, torch.allclose(y.cpu(), x.cpu() * 2 + 1))
        print(torch.compile(lambda t: t - 1, backend="tpu")(x).device.type)
        """,
        tmp_path,
    )
    assert out.split() == ["1", "True", "tpu"]


def test_kernels_stay_out_of_dynamos_reach(tmp_path):
    """After a graph break the rest of the function runs eagerly with dynamo's frame callback
    set: our `tpu` kernels must not be frames dynamo compiles (two frames here: the function
    and its resumption after the break; a third would be a kernel)."""
    out = _python(
        """
        import torch
        import tpu_debug

        def f(x):
            y = x * 2
            n = y.sum().item()  # graph break: item() runs eagerly
            return torch.relu(y + n).sum()

        x = torch.randn(4, 4, device="tpu")
        out = torch.compile(f, backend="tpu_debug")(x)
        from torch._dynamo.utils import counters
        print(counters["frames"]["total"], torch.allclose(out.cpu(), f(x).cpu()))
        """,
        tmp_path,
    )
    assert out.split() == ["2", "True"]


def test_the_probes_and_the_options_import_without_torch_or_jax(tmp_path):
    """The runtime's contract with the tracers and readers (the probe records, ``Probe``,
    ``subscribe``; the runtime's options; a target's spec) is light: a fresh process imports
    it and neither torch nor jax, and the device is not registered."""
    out = _python(
        """
        import sys
        import tpu_debug.runtime.probes, tpu_debug.runtime.config
        from tpu_debug.core.records import CompileInfo
        from tpu_debug.runtime.probes import Probe, subscribe
        from tpu_debug.runtime.target import Target, parse_target
        print(sorted(m for m in ("torch", "jax", "jaxlib", "tpu_debug.runtime.device") if m in sys.modules))
        """,
        tmp_path,
    )
    assert out.split("\n") == ["[]", ""]


# -- the reading verbs without torch and jax -------------------------------------------

# the runtime's light modules (the probe records, the options, the target specs) may load on the
# reading side; its device, which imports torch and jax, may not
_TORCH_JAX = 'print(sorted(m for m in ("torch", "jax", "jaxlib", "tpu_debug.runtime.device") if m in sys.modules))'


def test_reading_verbs_import_neither_torch_nor_jax(tmp_path, monkeypatch):
    """The ``tpu-debug`` console script (``tpu_debug.cli.main``) runs the reading verbs, and
    the TUI through every view, without importing torch or jax: the device is not registered."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "tui"))
    from synthetic_run import write_synthetic_run

    run_dir = tmp_path / "runs" / "20260131T120000.000Z-synthetic"
    write_synthetic_run(run_dir)
    out = _python(
        f"""
        import asyncio, contextlib, io, sys
        from tpu_debug import cli
        for argv in (["report", {str(run_dir)!r}], ["tui", {str(run_dir)!r}],
                     ["runs", "--logdir", {str(run_dir.parent)!r}],
                     ["tensorboard", {str(run_dir)!r}, "--print"], ["diff", {str(run_dir)!r}, {str(run_dir)!r}]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                print(argv[0], cli.main(argv), file=sys.__stdout__)
        {_TORCH_JAX}

        # what 'tpu-debug tui' runs in a terminal: the app, through every view and the HLO viewer
        import tpu_debug
        from tpu_debug.tui import TpuDebugApp
        from textual.worker import WorkerCancelled

        async def main():
            with tpu_debug.open_run({str(run_dir)!r}) as session:
                app = TpuDebugApp(session)
                async with app.run_test(size=(120, 36)) as pilot:
                    for key in ("2", "h", "escape", "3", "4", "5", "6", "7", "8", "1"):
                        await pilot.press(key)
                        for _ in range(20):
                            try:
                                await app.workers.wait_for_complete()
                            except WorkerCancelled:  # an exclusive load replaced by a newer one
                                pass
                            await pilot.pause(0.02)
                    print(type(app.screen).__name__)

        asyncio.run(main())
        {_TORCH_JAX}
        """,
        tmp_path,
    )
    # tui: 2, not a terminal; tensorboard: 1, the run has no TensorBoard data
    assert out.split("\n") == [
        "report 0",
        "tui 2",
        "runs 0",
        "tensorboard 1",
        "diff 0",
        "[]",
        "OverviewScreen",
        "[]",
        "",
    ]


@pytest.mark.parametrize("how", ["import tpu_debug", "python -m tpu_debug"])
def test_the_api_imports_neither_torch_nor_jax_until_something_records(how, tmp_path):
    """``import tpu_debug`` in any process (a notebook, ``python -m``) and the reading API
    load neither torch nor jax; what records (trace, compile, ...) registers the device
    first, also with PyTorch's autoload off."""
    first = (
        "import tpu_debug" if how == "import tpu_debug"
        else "import runpy, contextlib, io\n"
             "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
             "    sys.argv = ['tpu_debug', '--version']; runpy.run_module('tpu_debug', run_name='__main__')\n"
             "import tpu_debug"
    )
    code = (
        "import os, sys\n" + first + "\n"
        f"from tpu_debug import TraceConfig, TpuDebugError, open_run, Session, print_report\n"
        f"print(tpu_debug.list_runs({str(tmp_path)!r}), TraceConfig.__name__)\n"
        + _TORCH_JAX + "\n"
        "assert set(tpu_debug.__all__) <= set(dir(tpu_debug))\n"
        "tpu_debug.trace\n"
        "import torch\n"
        "print(torch.ones(2, device='tpu').sum().item(), tpu_debug.runtime.installed())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["[] TraceConfig", "[]", "2.0 True", ""]


def test_import_torch_registers_the_device(tmp_path):
    """A TorchTPU script imports only torch: PyTorch's backend autoload registers ``tpu``,
    and ``torch.compile`` with no backend compiles ``tpu`` inputs with ``tpu_debug``."""
    out = _python(
        """
        import sys
        import torch
        print((torch.ones(3, device="tpu") * 2).sum().item(), torch.tpu.get_device_name())
        f = torch.compile(lambda x: (x * 2).sin())
        x = torch.randn(4, 4)
        print(torch.allclose(f(x.to("tpu")).cpu(), (x * 2).sin(), rtol=1.2e-6, atol=1.2e-6))
        import tpu_debug
        print(tpu_debug.runtime.installed())
        """,
        tmp_path,
    )
    # inductor cannot compile a tpu tensor: a result on tpu equal to CPU's is tpu_debug's program
    assert out.split("\n")[1:] == ["True", "True", ""], out
    assert out.startswith("6.0 XLA CPU")


def test_autoload_off_leaves_the_device_unregistered(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import torch, sys; print('tpu_debug.runtime' in sys.modules, "
                               "torch._C._get_privateuse1_backend_name())"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "privateuseone"]


def test_run_verb_registers_the_device(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import torch\nprint((torch.ones(2, device='tpu') + 1).sum().item())\n")
    out = _python(
        f"""
        import sys
        from tpu_debug import cli
        code = cli.main(["run", "--logdir", {str(tmp_path / "runs")!r}, {str(script)!r}])
        print("exit", code, "torch" in sys.modules)
        """,
        tmp_path,
    )
    assert "4.0" in out.split() and out.split()[-3:] == ["exit", "0", "True"]


def test_run_of_a_missing_script_says_so_before_importing_torch(tmp_path):
    missing = tmp_path / "nosuch.py"
    out = _python(
        f"""
        import sys
        from tpu_debug import cli
        code = cli.main(["run", "--target", "v5e", {str(missing)!r}, "--steps", "3"])
        print("exit", code, "torch" in sys.modules, "jax" in sys.modules, file=sys.__stdout__)
        """,
        tmp_path,
    )
    assert out.split()[-4:] == ["exit", "2", "False", "False"]


def test_console_script_imports_neither_torch_nor_jax(tmp_path):
    """The installed ``tpu-debug`` script itself, as a user starts it (``-X importtime``'s
    report lists every module the process imported)."""
    script = Path(sys.executable).parent / "tpu-debug"
    if not script.exists():
        pytest.skip(f"no tpu-debug console script next to {sys.executable}")
    run_dir = _tiny_run(tmp_path)
    done = subprocess.run(
        [str(script), "report", "--plain", str(run_dir)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "tpu_debug.cli" in imported and "tiny" in done.stdout
    assert not imported & {"torch", "jax", "jaxlib", "tpu_debug.runtime.device"}
