"""TorchTPU's device module class over this runtime (runtime/torchtpu/device_module.py): its class
state as the guide's notebook helper and TorchTPU's tests read and assign it, its autocast
accessors as PyTorch's autocast state, upstream PyTorch's ``torch/tpu`` module deferring to it,
the guide's ``torch.cuda`` -> ``torch.tpu`` table, the device initializers (``api.tpu_device()``
making ``tpu`` PyTorch's accelerator), and the host hardware answers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tpu_debug.core.errors import UnsupportedError


@pytest.fixture
def device_module():
    from torch_tpu.api import _device_module

    cls = _device_module._DeviceModule
    yield cls
    cls._init_runtime()  # whatever a test reset, the next finds the runtime up


def test_the_device_module_keeps_torchtpus_class_state(device_module):
    from torch_tpu._internal.device._device_module import TpuDeviceModule

    assert TpuDeviceModule is device_module
    device_module._init_runtime(device_type="tpu")
    assert device_module.is_initialized() and device_module._is_initialized
    assert device_module.device_count() == device_module._device_count >= 1
    assert device_module.current_device() == device_module._current_device == 0
    assert torch.tpu.is_initialized() and torch.tpu.current_device() == 0
    # TorchTPU's invariant: initialized, the counts are set; shut down, they are None
    device_module._shutdown_runtime()
    assert not device_module.is_initialized()
    assert device_module._device_count is None and device_module._current_device is None
    # the runtime's buffers outlive the shutdown (the XLA client lives as long as the process)
    x = torch.arange(4.0, device="tpu")
    device_module._init_runtime_options(device_type="tpu")
    assert device_module.is_initialized() and torch.equal((x * 2).cpu(), torch.arange(4.0) * 2)
    with pytest.raises(UnsupportedError, match=r"device_type='xla_cpu'.*'tpu' device only"):
        device_module._init_runtime(device_type="xla_cpu")


def test_the_notebook_helper_resets_and_starts_the_runtime_again(device_module):
    # what the guide's docs/notebooks/tpu_utils.py does at both its versions (the device
    # module imported from torch_tpu.api, then from torch_tpu._internal.device): safe_shutdown,
    # then safe_init
    from torch_tpu import api
    from torch_tpu._internal.device import _device_module as internal
    from torch_tpu.api import _device_module as older

    for module in (older, internal):
        dm = module.DeviceModule
        assert dm.is_initialized()
        assert api.tpu_device() == torch.device("tpu", 0)
        # safe_shutdown
        if dm._is_initialized:
            dm._shutdown_runtime()
        dm._is_initialized = False
        dm._device_count = None
        dm._current_device = None
        api.tpu_device.cache_clear()
        assert not dm.is_initialized()
        # safe_init: the slow path, then the partial-init guard
        api.tpu_device.cache_clear()
        device = api.tpu_device()
        if not dm.is_initialized():
            dm._init_runtime_options(device_type="tpu")
        assert device.type == "tpu" and dm.is_initialized() and dm._device_count >= 1
        assert torch.ones(2, device=device).sum().item() == 2.0
        # the fast path: already initialized, the cached device
        assert dm.is_initialized() and api.tpu_device() is device


def test_autocast_accessors_are_pytorchs_autocast_state(device_module):
    dm = device_module
    before = torch.get_autocast_dtype("tpu")
    # TorchTPU's autocast prefers bfloat16
    assert before == torch.bfloat16 == torch.tpu._get_autocast_dtype() and torch.amp.is_autocast_available("tpu")
    try:
        # TorchTPU's tests reset the class attributes, then read them through the methods
        dm._autocast_enabled = False
        dm._autocast_dtype = torch.float16
        assert not dm._is_autocast_enabled() and dm._get_autocast_dtype() == torch.float16
        dm._set_autocast_enabled(True)
        assert dm._autocast_enabled and torch.is_autocast_enabled("tpu")
        dm._set_autocast_enabled(False)
        for dtype in dm.get_amp_supported_dtype():
            dm._set_autocast_dtype(dtype)
            assert dm._autocast_dtype == dtype == torch.tpu._get_autocast_dtype()
        with pytest.raises(ValueError, match=r"^Unsupported dtype None for AMP"):
            dm._set_autocast_dtype(None)
        # the dtype set here is the one torch.autocast("tpu") computes in, as CPU autocast does
        torch.tpu._set_autocast_dtype(torch.bfloat16)
        a, b = torch.randn(4, 8), torch.randn(8, 3)
        with torch.autocast("tpu"):
            assert torch.tpu._is_autocast_enabled()
            out = a.to("tpu") @ b.to("tpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = a @ b
        assert out.dtype == torch.bfloat16 and torch.equal(out.cpu(), expected)
    finally:
        torch.set_autocast_dtype("tpu", before)


UPSTREAM = """
    # what upstream PyTorch's torch/tpu/__init__.py does: a thin module over TorchTPU
    from torch_tpu import api as tpu_api
    from torch_tpu.api.streams import TpuEvent as Event, TpuStream as Stream

    _device_mod = tpu_api._device_module._DeviceModule


    def current_device():
        return _device_mod.current_device()


    def device_count():
        return _device_mod.device_count()


    def stream(s):
        return _device_mod.stream(s)


    def current_stream(device=None):
        return _device_mod.current_stream(device)


    def set_stream(s):
        _device_mod.set_stream(s)
"""


def test_upstream_torch_tpu_defers_to_the_device_module(tmp_path):
    # a PyTorch that ships torch/tpu: its module imported before the device registers (autoload
    # off) works through torch_tpu.api, then gives its name to the device module
    shipped = tmp_path / "torch" / "tpu"
    shipped.mkdir(parents=True)
    (shipped / "__init__.py").write_text(textwrap.dedent(UPSTREAM))
    code = f"""
        import sys, torch
        torch.__path__.append({str(tmp_path / "torch")!r})  # as if torch shipped tpu/
        import torch.tpu as upstream
        assert upstream.__file__.startswith({str(tmp_path)!r}) and "tpu_debug" not in type(torch.tpu).__module__
        assert upstream.current_device() == 0 and upstream.device_count() >= 1
        s = upstream.Stream()
        with upstream.stream(s):
            assert upstream.current_stream() is s
        upstream.set_stream(None)
        from torch_tpu.api.streams import TpuEvent, TpuStream
        assert upstream.Event is TpuEvent and upstream.Stream is TpuStream
        # the device registered (torch_tpu.api started it): torch.tpu is the device module now
        assert type(torch.tpu).__name__ == "TpuModule" and sys.modules["torch.tpu"] is torch.tpu
        assert torch.ones(3, device="tpu").sum().item() == 3.0
        assert upstream.current_device() == torch.tpu.current_device() == 0
        print("ok")
    """
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_api_mapping_table_answers_as_torchtpu_documents():
    # the guide's torch.cuda -> torch.tpu table (docs/notebooks/api_mapping.py and its test):
    # the backend is ready and counts its devices, the active core's index, seeding every core
    # makes the device's random numbers repeat (as torch.cuda.manual_seed_all does), AMP's dtypes
    # a list holding bfloat16, and the streams placeholders that order nothing
    from torch_tpu import api

    device = api.tpu_device()
    assert torch.tpu.is_available() is True
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == device.index == 0
    draws = []
    for seed_all in (torch.tpu.manual_seed_all, torch.tpu.manual_seed, torch.tpu.manual_seed_all):
        seed_all(42)
        draws.append(torch.randn(8, device=device).cpu())
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)
    torch.testing.assert_close(draws[0], draws[2], rtol=0, atol=0)
    torch.tpu.manual_seed_all(43)
    assert not torch.equal(torch.randn(8, device=device).cpu(), draws[0])
    dtypes = torch.tpu.get_amp_supported_dtype()
    assert isinstance(dtypes, list) and torch.bfloat16 in dtypes
    default = torch.tpu.default_stream()
    assert isinstance(default, torch.tpu.Stream) and torch.tpu.current_stream() == default
    torch.tpu.set_stream(default)
    assert torch.tpu.current_stream() == default


def test_tpu_device_makes_tpu_pytorchs_accelerator():
    # the guide's API table prints torch.accelerator.is_available() beside torch.tpu.is_available()
    # once api.tpu_device() has run, before any tensor is made; PyTorch documents that
    # torch.accelerator delegates to the current accelerator's device module. A fresh process:
    # PyTorch's accelerator is process state that another test may already have set.
    code = """
        import torch, torch_tpu
        from torch_tpu import api
        device = api.tpu_device()
        assert torch.accelerator.current_accelerator() == torch.device("tpu"), torch.accelerator.current_accelerator()
        assert torch.accelerator.is_available() is torch.tpu.is_available() is True
        assert torch.accelerator.device_count() == torch.tpu.device_count() >= 1
        assert torch.accelerator.current_device_index() == torch.tpu.current_device() == device.index
        torch.accelerator.synchronize()
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("imports", ["import torch\nimport torch_tpu", "import torch_tpu\nimport torch",
                                     "import torch\nfrom torch_tpu._internal.utils import log_utils"])
def test_importing_torch_tpu_makes_tpu_pytorchs_accelerator_in_either_order(imports):
    # TorchTPU's LLM tutorial imports one of its modules, then places the model on
    # torch.accelerator.current_accelerator(): a script importing torch_tpu is written for TorchTPU,
    # where tpu is the accelerator from the start (a plain `import torch` keeps CPU's answer until
    # the device is used: tests/distributed/test_cpu_jobs.py)
    code = imports + """
assert torch.accelerator.current_accelerator() == torch.device("tpu"), torch.accelerator.current_accelerator()
print(torch.nn.Linear(2, 2).to(torch.accelerator.current_accelerator()).weight.device.type)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
    assert done.stdout.strip() == "tpu", done.stderr[-3000:]


def test_init_device_and_the_xla_devices():
    from torch_tpu import _loader, api

    assert _loader._init_device("tpu") == torch.device("tpu", 0) == api._init_device()
    for name in ("_xla_cpu_device", "_xla_cuda_device"):
        with pytest.raises(UnsupportedError, match=r"no counterpart here; .*use api.tpu_device\(\)$"):
            getattr(api, name)()
    with pytest.raises(UnsupportedError, match=r"_init_device\('xla_cuda'\)"):
        _loader._init_device("xla_cuda")


def test_hardware_answers_for_this_host():
    from torch_tpu._internal import env
    from torch_tpu._internal.utils import hardware

    chips, version = 0, None
    try:
        from jax._src import hardware_utils

        chips, version = hardware_utils.num_available_tpu_chips_and_device_id()
    except (ImportError, AttributeError, OSError):
        pass
    if chips:
        pytest.skip(f"this host has {chips} TPU chip(s) ({version}): the answers are the chip's")
    # no TPU attached: TorchTPU's answers there, never a CPU dressed as a TPU
    assert hardware.get_tpu_version() is hardware.TpuVersion.UNKNOWN
    assert hardware.get_tpu_device_name() == "TPU"
    assert hardware.get_tpu_device_count() == 0 and hardware.get_tpu_topology() is None
    assert hardware.get_hbm_bytes_per_chip() is None and hardware.get_bf16_flops_per_device() is None
    assert env.IS_INTERNAL_TORCH_TPU is False
    env.set_native_scan_emitter_supported(True)
