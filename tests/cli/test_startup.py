"""What starting tpu_debug costs (issue 6): ``import tpu_debug`` and the reading verbs of the
CLI do not import ``torch._dynamo`` (about a second); dynamo is imported by ``torch.compile``,
and our backends and kernel shields are in place when it is.

Each check runs in a fresh interpreter: this one has imported dynamo long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tpu_debug.tracers.store import DB_NAME, RunWriter


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
        import tpu_debug
        assert tpu_debug.runtime.installed()
        from tpu_debug.cli import main
        import tpu_debug.tui.app  # what 'tpu-debug tui' imports in a terminal
        for argv in (["tui", {str(run_dir)!r}], ["report", {str(run_dir)!r}],
                     ["runs", "--logdir", {str(run_dir.parent)!r}],
                     ["tensorboard", {str(run_dir)!r}, "--print"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                print(argv[0], main(argv), file=sys.__stdout__)
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
        print(not [f for f in sys.meta_path if type(f).__name__ == "_PostImportHook"])
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
