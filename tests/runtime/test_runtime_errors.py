"""Mistakes the runtime reports: each a TpuDebugError subclass that is also the builtin
PyTorch raises for the same mistake (code catching PyTorch's error keeps working), with
the fact, the offending value and the fix in the message."""

from __future__ import annotations

import pytest
import torch

from tpu_debug.core.errors import (
    DeviceMismatchError,
    DeviceTakenError,
    TpuArgumentError,
    TpuDebugError,
    UnsupportedDtypeError,
    UnsupportedError,
)
from tpu_debug.runtime import DeviceTakenError as RuntimeDeviceTakenError


def test_cpu_tensor_in_a_tpu_op():
    with pytest.raises(DeviceMismatchError, match=r"found at least two devices, tpu:0 and cpu! Move the CPU tensor"):
        torch.ones(3, device="tpu") + torch.ones(3)
    assert issubclass(DeviceMismatchError, RuntimeError)


def test_op_without_lowering_names_it_and_the_fix():
    lib = torch.library.Library("tpu_debug_errors_test", "DEF")
    try:
        lib.define("nolowering(Tensor x) -> Tensor")
        lib.impl("nolowering", lambda x: x + 1, "CPU")
        op = torch.ops.tpu_debug_errors_test.nolowering.default
        torch.testing.assert_close(op(torch.zeros(2)), torch.ones(2))
        with pytest.raises(UnsupportedError, match=r"nolowering has no tpu lowering or decomposition\. Set "
                           r"tpu_debug\.runtime\.config\.cpu_fallback = True"):
            op(torch.zeros(2, device="tpu"))
    finally:
        lib._destroy()
    assert issubclass(UnsupportedError, NotImplementedError)  # the public contract (DESIGN.md)


def test_unsupported_dtype():
    with pytest.raises(UnsupportedDtypeError, match=r"dtype torch\.complex32 is not supported on the tpu device; use one of"):
        torch.empty(3, dtype=torch.complex32, device="tpu")
    assert issubclass(UnsupportedDtypeError, TypeError)


def test_dtype_reinterpreting_view():
    t = torch.ones(4, 2, device="tpu")[:, 0].view(torch.int32)  # a strided view read by gather
    with pytest.raises(UnsupportedError, match=r"use \.to\(dtype\) instead of \.view\(dtype\)"):
        t.cpu()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: torch.tpu.precision.set("ultra"), r"precision 'ultra' is not one of highest, high, medium"),
        (lambda: torch.tpu.set_device(1), r"tpu:1 requested; the eager runtime runs on tpu:0"),
        (lambda: torch.tpu.set_eager_mode("lazy"),
         r"eager mode 'lazy' is not one of torch\.tpu\.EagerMode\.DEFER_AND_FUSE, DEFER_NEVER, "
         r"DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        (lambda: torch.tpu.set_rng_state(torch.zeros(3)), r"tpu RNG state must be the uint8 tensor of 16 bytes"),
    ],
)
def test_torch_tpu_arguments(call, message):
    with pytest.raises(TpuArgumentError, match=message):
        call()
    assert issubclass(TpuArgumentError, ValueError)


def test_every_runtime_error_class_is_a_tpu_debug_error():
    for cls in (DeviceMismatchError, DeviceTakenError, TpuArgumentError, UnsupportedDtypeError, UnsupportedError):
        assert issubclass(cls, TpuDebugError)
    assert RuntimeDeviceTakenError is DeviceTakenError
