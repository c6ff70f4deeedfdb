"""Every error tpu_debug raises on purpose: one base class, one subclass per kind of mistake.

Messages give the fact, the offending value and the fix (see CONTRIBUTING.md), so the
CLI can print ``str(error)`` as its single line.
"""

from __future__ import annotations

__all__ = [
    "TpuDebugError",
    "ConfigError",
    "TraceActiveError",
    "RunNotFoundError",
    "RunDamagedError",
    "SchemaVersionError",
    "RunBusyError",
    "NotRecordedError",
    "CommandError",
    "ReportSectionError",
    "RecompileError",
    "TransferGuardError",
    "LoweringError",
    "NoLoweringError",
    "DeviceTakenError",
    "UnsupportedError",
    "DeviceMismatchError",
    "UnsupportedDtypeError",
    "TpuArgumentError",
    "OutputMismatchError",
    "MissingPayloadError",
    "LoweringBugError",
    "DeviceAssertError",
    "OpArgumentError",
    "OpIndexError",
]


class TpuDebugError(Exception):
    """Base of every error tpu_debug raises for a user-facing reason."""


class ConfigError(TpuDebugError, ValueError):
    """An option or ``TPU_DEBUG_*`` variable holds a value tpu_debug does not accept."""


class TraceActiveError(TpuDebugError, RuntimeError):
    """A trace was started while another one is recording."""


class RunNotFoundError(TpuDebugError, FileNotFoundError):
    """No run where one was asked for."""


class RunDamagedError(TpuDebugError):
    """A run database that cannot be read: damaged, truncated or not a run at all."""


class SchemaVersionError(TpuDebugError):
    """A run written with a store layout this tpu_debug does not read."""


class RunBusyError(TpuDebugError):
    """A run database that another live process is writing."""


class NotRecordedError(TpuDebugError, LookupError):
    """A query asked for something the run did not record (an op with no HLO, say)."""

    def __str__(self) -> str:  # LookupError would quote the message like a KeyError key
        return str(self.args[0]) if self.args else ""


class CommandError(TpuDebugError):
    """A CLI command failed; carries the process exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ReportSectionError(TpuDebugError, ValueError):
    """A report section registered under a title another section already has."""


# -- guards ----------------------------------------------------------------------------
# ``stops_program`` marks an error a guard raises on purpose from inside a probe:
# ``tpu_debug.core.hooks.deliver`` lets it through instead of recording it as a tracer failure.


class RecompileError(TpuDebugError, RuntimeError):
    """Something compiled again where recompiles are forbidden (``expect_no_recompiles()``,
    ``trace(fail_on_recompile=True)``); the message holds the diff against the closest key."""

    stops_program = True


class TransferGuardError(TpuDebugError, RuntimeError):
    """A host<->device transfer that a transfer guard set to ``"disallow"`` forbids."""

    stops_program = True


# -- the runtime -------------------------------------------------------------------------
# Several also derive from the builtin PyTorch raises for the same mistake, so code that
# catches PyTorch's error (``except RuntimeError``) catches the runtime's too.


class DeviceTakenError(TpuDebugError, RuntimeError):
    """PrivateUse1 already belongs to another backend (a real TorchTPU, say)."""


class UnsupportedError(TpuDebugError, NotImplementedError):
    """The `tpu` runtime does not do this: an aten op with no lowering, a dtype-reinterpreting
    view, ``generator=`` on an op that draws no random numbers."""


class DeviceMismatchError(TpuDebugError, RuntimeError):
    """An op got a CPU tensor where it needs a `tpu` one (PyTorch's own check is a RuntimeError)."""


class UnsupportedDtypeError(TpuDebugError, TypeError):
    """A dtype the `tpu` device has no XLA type for."""


class TpuArgumentError(TpuDebugError, ValueError):
    """A ``torch.tpu`` function got a value it does not accept: a precision, a device index,
    an eager mode, an RNG state or generator."""


class OutputMismatchError(TpuDebugError, RuntimeError):
    """An in-place or ``out=`` result does not fit its destination (a dtype that cannot be
    cast, a shape that cannot be resized): PyTorch raises a RuntimeError there too."""


class MissingPayloadError(TpuDebugError, RuntimeError):
    """A `tpu` tensor holding no data: made by a fake or meta path, not through tpu_debug."""


class DeviceAssertError(TpuDebugError, RuntimeError):
    """A device-side assertion in a compiled graph (``torch._assert_async``, as PyTorch's
    ``one_hot`` makes one) found its condition false."""


class OpArgumentError(TpuDebugError, RuntimeError):
    """An op call PyTorch's CPU kernel refuses (a negative convolution padding, an index out
    of range, a probability below zero), refused with the message CPU gives: the text a
    script or a test written against PyTorch matches, which names the fact and the value."""


class OpIndexError(TpuDebugError, IndexError):
    """An index PyTorch refuses with an IndexError (``x[i]``, ``embedding``, ``take`` out of
    range), with the message CPU gives."""


class LoweringBugError(TpuDebugError, RuntimeError):
    """A lowering broke its contract (an output of the wrong shape): a tpu_debug bug, to report
    with the op and shapes the message names."""


# -- the op registry and lowerings -----------------------------------------------------


class LoweringError(TpuDebugError):
    """An op lowering registered wrongly: twice for one overload, or for something that is
    not an aten overload. A mistake in tpu_debug's own op tables (or in a user's addition
    to them), found when the lowerings load."""


class NoLoweringError(UnsupportedError):
    """An op, or an op with these arguments, that the tpu runtime has no lowering for.

    A ``NotImplementedError`` too, so code that handles PyTorch's own "not implemented
    for this backend" errors handles it the same way."""


class RunAccessError(TpuDebugError, PermissionError):
    """A run that exists but that this user may not read."""


class RunWriteError(TpuDebugError):
    """A run database that cannot be written: no space left, no permission, a read-only or failing disk."""
