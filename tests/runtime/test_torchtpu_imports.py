"""``import torch_tpu`` where TorchTPU is not installed (core/torch_tpu_finder.py, runtime/torchtpu/),
never over a real one; TorchTPU's ``torch.tpu`` submodules; its launcher."""

from __future__ import annotations

import importlib
import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch
from tpu_debug.core import torch_tpu_finder
from tpu_debug.core.errors import UnsupportedError


def _python(code: str, *, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=240, check=False)


def test_torchtpu_modules_are_the_runtimes():
    import torch_tpu
    from torch_tpu import api
    from torch_tpu._internal import execution_mode, pallas, profiler, sync
    from torch_tpu._internal.device import _device_module
    from torch_tpu._internal.utils import log_utils, test_utils, utils
    from tpu_debug.runtime import pallas as runtime_pallas
    from tpu_debug.runtime import tpu_utils
    from tpu_debug.runtime.torchtpu import sync as runtime_sync

    assert getattr(torch_tpu, torch_tpu_finder.MARKER) is True
    assert api.tpu_device() == torch.device("tpu", 0)
    # each TorchTPU module holds the runtime's names under its own name
    assert sync.__name__ == "torch_tpu._internal.sync" and sync.synchronize is runtime_sync.synchronize
    assert utils.assert_close is test_utils.assert_close is tpu_utils.assert_close
    assert utils.CheckValueMode is test_utils.CheckValueMode is tpu_utils.CheckValueMode
    assert utils.OpTracer is tpu_utils.OpTracer
    assert pallas.jax_op is runtime_pallas.jax_op
    assert execution_mode.EagerMode is torch.tpu.EagerMode
    assert _device_module.DeviceModule.is_initialized()
    assert callable(profiler.xprof_trace_handler) and callable(log_utils.log_to_stderr)
    # a package's submodules load as attributes too, as TorchTPU's do
    assert torch_tpu._internal.compile.clear_cache is tpu_utils.clear_caches
    with pytest.raises(ModuleNotFoundError, match="No module named 'torch_tpu._internal.no_such_module'"):
        import torch_tpu._internal.no_such_module
    with pytest.raises(AttributeError, match="module 'torch_tpu._internal.sync' has no attribute 'nothing'"):
        sync.nothing  # noqa: B018


def test_a_module_that_became_a_package_keeps_both_spellings():
    # TorchTPU's layouts: torch_tpu.api a package (upstream torch.tpu imports its submodules)
    # and a module; _internal.{sync,pallas,compile} modules that became packages of a module
    # of the same name; _device_module and streams under api, then under _internal
    import torch_tpu._internal.compile._backend
    import torch_tpu._internal.pallas.pallas
    import torch_tpu._internal.sync.sync
    from torch_tpu._internal.device._device_module import DeviceModule
    from torch_tpu._internal.stream.streams import TpuStream
    from torch_tpu.api import _device_module, streams, tpu_device
    from tpu_debug.runtime.pallas import jax_op

    assert torch_tpu._internal.pallas.pallas.jax_op is torch_tpu._internal.pallas.jax_op is jax_op
    assert torch_tpu._internal.sync.sync.computation_mlir is torch_tpu._internal.sync.computation_mlir
    assert torch_tpu._internal.compile._backend.TpuBackend is torch_tpu._internal.compile.TpuBackend
    assert _device_module._DeviceModule is _device_module.DeviceModule is DeviceModule
    assert streams.TpuStream is TpuStream is torch.tpu.Stream
    assert tpu_device() == torch.device("tpu", 0)
    for package in ("torch_tpu.api", "torch_tpu._internal.sync", "torch_tpu._internal.pallas",
                    "torch_tpu._internal.compile", "torch_tpu.shims.g3_multiprocessing"):
        assert importlib.import_module(package).__path__ == [], package
    assert not hasattr(sys.modules["torch_tpu._internal.sync.sync"], "__path__")


def test_import_before_torch_and_a_real_torchtpu_wins(tmp_path):
    # a "real" TorchTPU on the path: it is found first, and no name of ours joins it
    real = tmp_path / "torch_tpu"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    done = _python("""
        import sys, torch_tpu
        assert torch_tpu.REAL and "torch" not in sys.modules
        try:
            import torch_tpu.api
        except ModuleNotFoundError:
            print("real")
    """, env_extra={"PYTHONPATH": str(tmp_path)})
    assert done.stdout.strip() == "real", done.stderr
    # ours, imported before torch (the .pth installed the finder at start-up)
    done = _python("""
        import sys, torch_tpu
        assert "torch" not in sys.modules
        from torch_tpu import api
        import torch
        print(torch.ones(2, device=api.tpu_device()).sum().item())
    """)
    assert done.stdout.strip() == "2.0", done.stderr


def test_the_single_host_launcher_prints_the_environment_a_launch_reads(monkeypatch, capsys):
    # what `python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper` runs:
    # runpy takes the module's code from the finder's loader, as -m does
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCH_TPU_TOPOLOGY", raising=False)
    with pytest.raises(SystemExit, match="^0$") as done:
        runpy.run_module("torch_tpu._internal.distributed.launchers.singlehost_wrapper", run_name="__main__")
    assert done.value.code == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.split())
    assert lines == {"WORLD_SIZE": "2", "TORCH_TPU_TOPOLOGY": "2x1x1"}


def test_torch_tpu_is_a_package_of_torchtpus_submodules():
    import torch.tpu.compiler
    import torch.tpu.distributed
    import torch.tpu.ops
    import torch.tpu.optimizers
    import torch.tpu.pallas
    import torch.tpu.profiler
    from tpu_debug.runtime import pallas

    assert torch.tpu.pallas.jax_op is pallas.jax_op
    with pytest.raises(ModuleNotFoundError, match="torch.tpu.nothing"):
        import torch.tpu.nothing
    x = torch.randn(1, 2, 6, 6)
    got = torch.tpu.ops.max_pool2d(x.to("tpu"), kernel_size=2, stride=2).cpu()
    assert torch.equal(got, torch.nn.functional.max_pool2d(x, 2, 2))
    a, b = torch.randn(3), torch.randn(3)
    barrier = torch.tpu.ops.optimization_barrier([a.to("tpu"), b.to("tpu")])
    assert torch.equal(barrier[0].cpu(), a) and torch.equal(barrier[1].cpu(), b)
    with pytest.raises(UnsupportedError, match=r"^torch.tpu.ops.sparse_gather needs TorchTPU on a TPU; .*: use "):
        torch.tpu.ops.sparse_gather(a)
    with pytest.raises(UnsupportedError, match=r"torch.tpu.optimizers.AdamW .* use torch.optim's optimizer"):
        torch.tpu.optimizers.AdamW([])
    assert torch.equal(torch.tpu.distributed.topology_aware_mesh((2, 3)), torch.arange(6).reshape(2, 3))


def test_accelerator_synchronize_waits_for_the_device():
    from tpu_debug.runtime import lazy

    assert torch.accelerator.current_accelerator().type == "tpu"
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = torch.ones(5, device="tpu") * 3.0
        assert lazy.pending_ops() > 0
        torch.accelerator.synchronize()  # PyTorch's own raises for a Python backend
        assert lazy.pending_ops() == 0
    assert torch.equal(y.cpu(), torch.full((5,), 3.0))


def test_a_real_torchtpu_is_told_from_the_served_modules(tmp_path, monkeypatch):
    import importlib.util

    # find_spec answers for the served modules too; the autoload asks whether a real one is there
    assert importlib.util.find_spec("torch_tpu") is not None
    assert not torch_tpu_finder.installed_elsewhere()
    (tmp_path / "torch_tpu").mkdir()
    (tmp_path / "torch_tpu" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert torch_tpu_finder.installed_elsewhere()
