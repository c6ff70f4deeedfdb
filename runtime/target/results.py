"""What a target compile gives: the program's memory and cost per device, or the compiler's
refusal, and the parser of the compiler's error text.

Plain records (standard library only): the tracers and the roofline read them without loading
the compiler (:mod:`.compile` makes them).
"""

from __future__ import annotations

import dataclasses
import re

from tpu_debug.core.buffers import BufferAssignment
from tpu_debug.runtime.target.error_codes import classify, pointed_instruction, pointed_source
from tpu_debug.runtime.target.hardware import Target

__all__ = ["CompileError", "CostStats", "MemoryStats", "TargetCompile", "parse_compile_error"]


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStats:
    """What one device holds for a program, from XLA's buffer assignment (bytes).

    Attributes:
        argument_bytes: the inputs, in their TPU layouts (padded to tiles).
        output_bytes: the outputs.
        alias_bytes: outputs that reuse an input's buffer (donation).
        temp_bytes: intermediates live at once, at the peak of the schedule.
        generated_code_bytes: the program's code.
        host_bytes: what the program places in the host's memory space per device (its host
            arguments + outputs - aliased + temporaries: the activations a checkpoint policy
            offloads), outside the HBM figures above; None when not read (a compile cached
            by a version that did not keep it).
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    host_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        """Arguments + outputs - aliased + temporaries + code: the HBM the program needs."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.generated_code_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class CostStats:
    """XLA's TPU cost analysis of a program, per device.

    Attributes:
        flops: floating-point operations (a matmul counts 2*m*n*k, on logical shapes).
        transcendentals: exp, log, tanh, ... evaluations.
        bytes_accessed: bytes read and written by the program's instructions.
        optimal_seconds: the compiler's own estimate of the run time on the
            target (its cost model), when it gives one.
    """

    flops: float
    transcendentals: float
    bytes_accessed: float
    optimal_seconds: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CompileError:
    """Why the TPU compiler refused a program.

    Attributes:
        kind: ``"hbm_oom"`` (the program does not fit the device's HBM) or
            ``"compile_error"`` (anything else the compiler rejected).
        status: XLA's status code (``"RESOURCE_EXHAUSTED"``, ``"INVALID_ARGUMENT"``).
        code: XLA's error id and name when it gives one (``"E1000: CompileTimeHbmOom"``).
        message: the compiler's message, first line.
        required_bytes: for an HBM out-of-memory, what the program needs (as the
            compiler prints it: to 10 MiB or so).
        available_bytes: for an HBM out-of-memory, what one device offers.
        what: what the requirement covers (``"HLO temporaries"``).
        code_printed: the compiler printed ``code``; False when the code was recognised from
            the message (``runtime/target/error_codes.py``: this libtpu prints its HBM and
            scoped-VMEM refusals without their codes).
        instruction: the HLO instruction the message is about, when it names one (a kernel
            whose scoped VMEM does not fit), or the Pallas kernel's custom call a Mosaic refusal
            is about.
        source_file, source_line, source_function: the Python line the message's location
            names: the line of a Pallas kernel whose operation Mosaic refused.
    """

    kind: str
    status: str
    message: str
    code: str | None = None
    required_bytes: int | None = None
    available_bytes: int | None = None
    what: str | None = None
    code_printed: bool = False
    instruction: str | None = None
    source_file: str | None = None
    source_line: int | None = None
    source_function: str | None = None

    @property
    def excess_bytes(self) -> int | None:
        if self.required_bytes is None or self.available_bytes is None:
            return None
        return self.required_bytes - self.available_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class TargetCompile:
    """One program compiled (or refused) for a TPU target.

    Attributes:
        target: the slice compiled for.
        program: the module's name (``jit_train_step``).
        seconds: time the TPU compiler took (of the compile that produced this
            result, when it comes from the cache).
        hlo: the TPU's optimized HLO text (after all passes, with TPU layouts); for a refusal
            before the passes ended (a Pallas kernel's, by Mosaic), the module as the compiler
            was given it.
        memory: per-device memory (None when the compile failed).
        cost: the compiler's cost analysis (None when the compile failed).
        error: the compiler's refusal, None on success.
        cached: the result was read from the on-disk cache.
        buffers: the compiler's buffer assignment (``core/buffers.py``): where every value of
            the program lives and when, read from its own report. A refusal for HBM keeps
            the assignment the compiler had made when it gave up, which is what its message
            adds up. None when the compiler wrote none.
        hlo_proto: the optimized module and its buffer assignment as XLA's ``HloProto``
            (serialized), the form xprof's memory viewer reads; None when not dumped.
    """

    target: Target
    program: str
    seconds: float
    hlo: str | None = None
    memory: MemoryStats | None = None
    cost: CostStats | None = None
    error: CompileError | None = None
    cached: bool = False
    buffers: BufferAssignment | None = None
    hlo_proto: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def fits(self) -> bool | None:
        """True if it compiled, False on an HBM out-of-memory, None on another error."""
        if self.error is None:
            return True
        return False if self.error.kind == "hbm_oom" else None


# -- errors --------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = r"([\d.]+)\s*([KMGTP]?)i?B?"
# jax 0.10 / libtpu: "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory
# on HBM, the total memory required for HLO temporaries (36.52G) exceeds available HBM (15.75G)."
_OOM = re.compile(
    r"total memory required for (?P<what>.+?) \(" + _SIZE + r"\) exceeds available HBM \(" + _SIZE + r"\)"
)
# older libtpu: "Ran out of memory in memory space hbm. Used 20.50G of 15.48G hbm."
_OOM_USED = re.compile(r"Used " + _SIZE + r" of " + _SIZE + r" hbm")
_CODE = re.compile(r"\b(E\d{3,5}): (\w+)")
_CODE_ENDS = re.compile(r"\bE\d{4}: \w+:\s*$")


def _bytes(number: str, unit: str) -> int:
    # XLA prints sizes with 1024-based suffixes (HumanReadableNumBytes): "15.75G" is GiB
    return int(float(number) * _UNITS[unit.upper()])


def parse_compile_error(message: str) -> CompileError:
    """The structure of a TPU compiler error message (an HBM out-of-memory parsed into figures).

    Example:
        >>> e = parse_compile_error("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, "
        ...     "the total memory required for HLO temporaries (36.52G) exceeds available HBM (15.75G).")
        >>> e.kind, e.available_bytes
        ('hbm_oom', 16911433728)
    """
    text = message.strip()
    lines = text.splitlines()
    first = lines[0] if text else ""
    if _CODE_ENDS.search(first):  # "...: E2002: CompileTimeMosaicMisalignedBlockAndTiling:" then the words
        detail = next((line.strip() for line in lines[1:] if line.strip()), "")
        if detail and not detail.startswith("See http"):
            first = f"{first} {detail}"
    status = first.split(":", 1)[0].strip() if ":" in first else ""
    if not re.fullmatch(r"[A-Z_]+", status):
        status = "UNKNOWN"
    code = _CODE.search(first)
    known, printed = classify(text)
    if code:
        code_text: str | None = f"{code.group(1)}: {code.group(2)}"
    else:
        code_text = f"{known.code}: {known.name}" if known is not None else None
    source = pointed_source(text)
    extra = {"code_printed": bool(code) or printed, "instruction": pointed_instruction(text),
             "source_file": source[0] if source else None, "source_line": source[1] if source else None,
             "source_function": source[2] if source else None}
    m = _OOM.search(text)
    if m:
        return CompileError("hbm_oom", status, first, code_text, _bytes(m.group(2), m.group(3)),
                            _bytes(m.group(4), m.group(5)), m.group("what"), **extra)
    m = _OOM_USED.search(text)
    if m:
        return CompileError("hbm_oom", status, first, code_text, _bytes(m.group(1), m.group(2)),
                            _bytes(m.group(3), m.group(4)), "program", **extra)
    if status == "RESOURCE_EXHAUSTED" and "HBM" in text.upper() and "VMEM" not in text.upper():
        return CompileError("hbm_oom", status, first, code_text, **extra)
    return CompileError("compile_error", status, first, code_text, **extra)
