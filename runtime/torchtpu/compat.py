"""What registering the device adds for scripts written for TorchTPU (called by
``runtime.device.install``): the ``torch.tpu`` submodules and ``torch.backends.tpu``
(:mod:`.public`), the ``import torch_tpu`` finder, libtpu's command-line flags accepted by
absl, ``torch.accelerator.synchronize()`` on the device, ``torch.tpu``'s autocast accessors,
``torch.profiler.xprof_trace_handler`` and TorchTPU's ``torch.ops.torch_tpu`` ops (:mod:`.ops`)."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch
import torch.profiler
from tpu_debug.core import torch_tpu_finder
from tpu_debug.core.post_import import when_imported
from tpu_debug.runtime.torchtpu import ops, public
from tpu_debug.runtime.torchtpu.profiler import xprof_trace_handler

__all__ = ["AUTOCAST", "declare_libtpu_flags", "eager_mode_from_env", "install", "take_the_torch_tpu_name"]


def take_the_torch_tpu_name() -> types.ModuleType | None:
    """Make room for the device module where PyTorch ships a ``torch/tpu`` module of its own.

    Upstream PyTorch's ``torch.tpu`` is a thin module that defers to TorchTPU
    (``torch_tpu.api._device_module._DeviceModule``, ``torch_tpu.api.streams``), and
    ``torch._register_device_module("tpu", ...)`` refuses a name ``torch`` already has. When
    that module was imported before the device registers, it gives up the name (the
    ``torch.tpu`` attribute and its ``sys.modules`` entry) so the device module takes it; a
    reference kept to PyTorch's module still works, through ``torch_tpu.api`` to this
    runtime. Returns the module that gave way, or None.
    """
    shipped = torch.__dict__.get("tpu")
    if not isinstance(shipped, types.ModuleType) or shipped.__name__ != "torch.tpu":
        return None
    # a module of torch's package: its folder is one of torch's (torch/tpu/__init__.py)
    folders = {os.path.realpath(p) for p in torch.__path__}
    where = os.path.realpath(getattr(shipped, "__file__", None) or "")
    if os.path.dirname(os.path.dirname(where)) not in folders:
        return None
    del torch.tpu
    if sys.modules.get("torch.tpu") is shipped:
        del sys.modules["torch.tpu"]
    return shipped


def install(tpu_module: Any, profiler: types.ModuleType, utils: types.ModuleType) -> None:
    """Everything the module docstring lists; idempotent."""
    public.install(tpu_module, profiler, utils)
    ops.register_ops()  # TorchTPU's torch.ops.torch_tpu ops, defined with its device
    torch_tpu_finder.install()
    when_imported("absl.flags", declare_libtpu_flags)
    _accelerator_synchronize(tpu_module)
    for name, fn in AUTOCAST.items():
        if not hasattr(type(tpu_module), name):
            setattr(type(tpu_module), name, staticmethod(fn))
    # TorchTPU's autocast computes in bfloat16 unless told otherwise (PyTorch's default for a
    # new backend is float16); the TPU's matrix units take bfloat16
    torch.set_autocast_dtype("tpu", torch.bfloat16)
    if not hasattr(torch.profiler, "xprof_trace_handler"):
        # TorchTPU adds its handler to torch.profiler (its profiling notebook calls it there)
        torch.profiler.xprof_trace_handler = xprof_trace_handler


def _is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")


def _set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("tpu", bool(enabled))


def _get_autocast_dtype():
    return torch.get_autocast_dtype("tpu")


def _set_autocast_dtype(dtype) -> None:
    """Raises ValueError for a dtype ``torch.tpu.get_amp_supported_dtype()`` does not list."""
    supported = torch.tpu.get_amp_supported_dtype()
    if dtype not in supported:
        raise ValueError(f"Unsupported dtype {dtype} for AMP. Supported dtypes are: {supported}")
    torch.set_autocast_dtype("tpu", dtype)


#: ``torch.tpu``'s autocast accessors (TorchTPU's device module has them): PyTorch's own
#: autocast state for ``tpu``, so a dtype set here is the one ``torch.autocast("tpu")`` uses
AUTOCAST = {"_is_autocast_enabled": _is_autocast_enabled, "_set_autocast_enabled": _set_autocast_enabled,
            "_get_autocast_dtype": _get_autocast_dtype, "_set_autocast_dtype": _set_autocast_dtype}


# flag names only libtpu (XLA's TPU compiler and runtime) defines
_LIBTPU_PREFIXES = ("xla_jf_", "xla_tpu_", "xla_sc_", "xla_mosaic_")


def _libtpu_args() -> list[tuple[str, str | None]]:
    """(name, value) of each flag in ``LIBTPU_INIT_ARGS``, and of each flag in ``sys.argv``
    that one of them or a libtpu-only prefix names (value None for a bare ``--flag``): a
    script's own absl flags are never declared here."""
    found = []
    for arg in os.environ.get("LIBTPU_INIT_ARGS", "").split():
        name, sep, value = arg.lstrip("-").partition("=")
        if name:
            found.append((name, value if sep else None))
    libtpu = {name for name, _ in found}
    for arg in sys.argv[1:]:
        name, sep, value = arg[2:].partition("=")
        if arg.startswith("--") and (name in libtpu or name.startswith(_LIBTPU_PREFIXES)):
            found.append((name, value if sep else None))
    return found


def declare_libtpu_flags(flag_values=None) -> None:
    """Declare to absl the libtpu flags a script put on its command line.

    TorchTPU's notebooks append libtpu's flags (``--xla_jf_dump_to=...``) to ``sys.argv``
    for libtpu to read, then run ``absl.app.run(main)``, whose parse of ``sys.argv``
    stops at a flag absl does not know ("Unknown command line flag"). There is no libtpu
    here; the flags are declared as absl flags that nothing reads, so the parse goes on.
    Called when ``absl.flags`` is imported (the notebooks extend ``sys.argv`` before they
    import absl), or when the device registers if absl was imported before."""
    from absl import flags

    values = flags.FLAGS if flag_values is None else flag_values
    for name, value in _libtpu_args():
        if name in values:
            continue
        help_text = "a libtpu flag: there is no libtpu under tpu_debug's runtime, so nothing reads it"
        if value is None or value.lower() in ("true", "false"):
            flags.DEFINE_bool(name, None, help_text, flag_values=values)
        else:
            flags.DEFINE_string(name, None, help_text, flag_values=values)


def _accelerator_synchronize(tpu_module: Any) -> None:
    """``torch.accelerator.synchronize()`` with ``tpu`` the current accelerator waits for the
    device, as ``torch.tpu.synchronize()`` does.

    PyTorch's accelerator API synchronizes through the backend's C++ device guard
    (``DeviceGuardImplInterface::synchronizeDevice``). A Python backend registers its guard
    with ``torch._C._acc.register_python_privateuseone_device_guard``, whose trampoline
    (torch 2.13) forwards streams, events and devices but not ``synchronizeDevice``, so
    the call raises "Backend doesn't support synchronizing all streams on device". The
    Python function is wrapped instead: for the ``tpu`` accelerator it calls the device
    module's ``synchronize``; otherwise PyTorch's own runs.
    """
    import torch

    accelerator = getattr(torch, "accelerator", None)
    original = getattr(accelerator, "synchronize", None)
    if original is None or getattr(original, "_tpu_debug", False):
        return

    def synchronize(device=None, /) -> None:
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type == "tpu":
            tpu_module.synchronize(device)
            return
        original(device)

    synchronize.__doc__ = original.__doc__
    synchronize._tpu_debug = True  # type: ignore[attr-defined]
    accelerator.synchronize = synchronize


def eager_mode_from_env() -> str | None:
    """The eager mode TorchTPU's variables ask for, unless ``TPU_DEBUG_EAGER_MODE`` is set:
    ``TPU_LAUNCH_BLOCKING=1`` (op by op, each waited for) or ``TORCH_TPU_DEFER_AND_FUSE=1``."""
    if os.environ.get("TPU_DEBUG_EAGER_MODE"):
        return None
    if os.environ.get("TPU_LAUNCH_BLOCKING") == "1":
        return "defer_never_and_launch_blocking"
    if os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        return "defer_and_fuse"
    return None
