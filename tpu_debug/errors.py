"""Every error tpu_debug raises on purpose: one base class, one subclass per kind of mistake.

Messages give the fact, the offending value and the fix (STYLE.md 10), so the
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
    "RecompileError",
    "TransferGuardError",
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


# -- guards (issue 5) ------------------------------------------------------------------
# ``stops_program`` marks an error a guard raises on purpose from inside a probe:
# ``runtime.probes.emit`` lets it through instead of recording it as a tracer failure.


class RecompileError(TpuDebugError, RuntimeError):
    """Something compiled again where recompiles are forbidden (``expect_no_recompiles()``,
    ``trace(fail_on_recompile=True)``); the message holds the diff against the closest key."""

    stops_program = True


class TransferGuardError(TpuDebugError, RuntimeError):
    """A host<->device transfer that a transfer guard set to ``"disallow"`` forbids."""

    stops_program = True
