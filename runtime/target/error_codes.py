"""XLA's numbered error codes: what each means for a PyTorch program and what to change.

XLA names its errors by a code and a name (``E1000: CompileTimeHbmOom``), each with a page of
openxla's error documentation, ``https://openxla.org/xla/errors/error_<number>``. A compiler
that annotates its refusals prints ``E1000: CompileTimeHbmOom:`` before the message. The
libtpu JAX pins (0.0.42.1) prints the codes of a Pallas kernel's refusals by its Mosaic
compiler (E2001-E2003) but its HBM and scoped-VMEM refusals without them, in the words each
code's page quotes as its sample messages ("Ran out of memory on HBM", "Allocation (size=...)
would exceed memory ... space=vmem"). :func:`classify` reads the code when it is printed and
otherwise recognises the message, and says which it did; :func:`pointed_instruction` and
:func:`pointed_source` read the HLO instruction and the Python line a message is about.

Standard library only: the report and the TUI read it.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["CODES", "XlaErrorCode", "by_code", "classify", "doc_url", "pointed_instruction", "pointed_source"]


@dataclasses.dataclass(frozen=True, slots=True)
class XlaErrorCode:
    """One of XLA's error codes.

    Attributes:
        code: ``"E1000"``.
        name: XLA's name of it (``"CompileTimeHbmOom"``).
        when: ``"compile"`` (the compiler refuses the program: a dry run or ``--target`` meets
            it) or ``"runtime"`` (a device meets it while running).
        meaning: what it means, for a PyTorch program.
        fix: what to change in the PyTorch program.
        message: how a message without the code is recognised (a regular expression of the
            compiler's words); None when only the printed code says it.
    """

    code: str
    name: str
    when: str
    meaning: str
    fix: str
    message: str | None = None

    @property
    def url(self) -> str:
        return doc_url(self.code)


def doc_url(code: str) -> str:
    """The page of openxla's error documentation for ``code`` (``"E1000"``)."""
    return f"https://openxla.org/xla/errors/error_{code.removeprefix('E')}"


#: every code XLA declares beyond the generic status codes (E0000-E0015), in its order
CODES: tuple[XlaErrorCode, ...] = (
    XlaErrorCode(
        "E0100", "RuntimeBufferAllocationFailure", "runtime",
        "the TPU runtime found no free block of HBM for a buffer (a tensor moved to the device, or a "
        "program's output): the tensors held then, plus the new one, exceed the HBM, or what is free is "
        "scattered in blocks too small",
        "hold fewer tensors at once (free references to tensors no longer needed; a smaller batch or "
        "sequence), shard the parameters over more chips (FSDP: fully_shard), or keep them in bfloat16",
        r"Error allocating device buffer: Attempting to allocate"),
    XlaErrorCode(
        "E0101", "RuntimeProgramAllocationFailure", "runtime",
        "the TPU runtime could not load a compiled program: its code and static buffers find no room in "
        "the HBM the held tensors leave",
        "hold fewer tensors while the program loads, or make the program smaller (fewer distinct "
        "programs: mark_dynamic or padded shapes instead of one program per shape)",
        r"Attempting to reserve .* at the bottom of memory"),
    XlaErrorCode(
        "E0102", "RuntimeProgramInputMismatch", "runtime",
        "a program was given a buffer whose size or TPU layout differs from the one it was compiled for "
        "(a checkpoint written under another XLA version or configuration, another topology)",
        "load the tensors through the same torch_tpu / XLA version and topology the program was compiled "
        "for, or compile again for the buffers you have",
        r"expected parameter \d+ of size \d+ .* but got buffer with incompatible size"),
    XlaErrorCode(
        "E0200", "RuntimeUnexpectedCoreHalt", "runtime",
        "a TPU core halted while running a program (an out-of-bounds access in a custom kernel, a hardware "
        "fault)",
        "run the program's custom kernels (Pallas) in interpret mode to find an out-of-bounds access; "
        "if there are none, report it with the program's HLO",
        r"unexpected(ly)? (core )?halt"),
    XlaErrorCode(
        "E1000", "CompileTimeHbmOom", "compile",
        "the compiled program needs more HBM than one device has: its inputs, outputs and temporaries "
        "(activations kept for the backward, gradients, the largest intermediate values) at the "
        "program's peak",
        "hold less at the peak: activation checkpointing (torch.utils.checkpoint) of the blocks whose "
        "activations the backward keeps, a smaller batch or sequence, bfloat16 activations, or shard the "
        "program over more chips (FSDP, tensor parallel); the program's peak buffers say which lines hold "
        "the most",
        r"Ran out of memory (on HBM|in memory space hbm)|exceeds available HBM|Hbm usage: .* exceeding available"),
    XlaErrorCode(
        "E1001", "CompileTimeScopedVmemOom", "compile",
        "a kernel (a Pallas kernel, or one of XLA's own) asks for more of the TPU core's on-chip VMEM than "
        "its scoped limit: its blocks, and the values live inside it, are too large",
        "give the Pallas kernel smaller blocks (BlockSpec block shapes, a grid over the rest), or raise "
        "its limit: pltpu.CompilerParams(vmem_limit_bytes=...) (at most the core's VMEM)",
        r"would exceed memory \(size=\d+\).*space=vmem|[Ss]coped allocation with size .* and limit"
        r"|Ran out of memory in memory space vmem"),
    XlaErrorCode(
        "E1200", "CompileTimeHostOffloadOutputLocationMismatch", "compile",
        "a tensor offloaded to the host's memory is returned by the program, whose output is declared in "
        "device memory",
        "move the tensor back to the device before returning it, or declare that output in host memory",
        r"moved to host .* returned from the entry computation but the layout for this output is not set "
        r"to host memory"),
    XlaErrorCode(
        "E2001", "CompileTimeMosaicUnsupportedRhsType", "compile",
        "a Pallas kernel multiplies by a right-hand operand whose type the target's matrix unit does not "
        "take",
        "cast the kernel's matmul operands to a type the target multiplies (bfloat16 or float32; int8 on "
        "generations with an int8 unit)",
        r"Unsupported matmul RHS type"),
    XlaErrorCode(
        "E2002", "CompileTimeMosaicMisalignedBlockAndTiling", "compile",
        "a Pallas kernel's block or slice does not fall on the TPU's tiles (multiples of 8 rows and 128 "
        "lanes for 32-bit values)",
        "make the kernel's block shapes multiples of the tile (8 x 128 for float32, 16 x 128 for "
        "bfloat16), or the whole dimension",
        r"must be aligned to tiling|is not divisible by tiling evenly nor matches the full shape"),
    XlaErrorCode(
        "E2003", "CompileTimeMosaicUnprovenMemoryAccessAlignment", "compile",
        "a Pallas kernel reads or writes at an offset the compiler cannot prove falls on a tile",
        "index with offsets it can prove aligned (pl.multiple_of(i, 8) on a dynamic start), or blocks "
        "that make them so",
        r"cannot statically prove that index .* is a multiple of"),
    XlaErrorCode(
        "E3000", "CompileTimeSparseCoreAllocationFailure", "compile",
        "a SparseCore program (an embedding lookup or an offloaded collective) found no room in one of "
        "the SparseCore's memories",
        "shard the embedding tables over more chips, or lower the limits on ids per partition",
        r"exceeds the legitimate user allocatable offset upper bound"),
    XlaErrorCode(
        "E3001", "CompileTimeSparseCoreInvalidReplicaCount", "compile",
        "a SparseCore program was compiled for a number of replicas it cannot run on",
        "compile for a slice whose chip count the embedding's sharding divides",
        None),
)

_BY_CODE = {c.code: c for c in CODES}
_PRINTED = re.compile(r"\b(E\d{4}): (\w+)")
# where a message names the instruction it is about: "... :: big.1" at its end (an allocation
# of an instruction), "allocating on stack for %kernel.3 = ..." (a scoped VMEM refusal),
# "Hlo-Op: result.1:" (a SparseCore op), "(starting from tuple.64)"
_INSTRUCTION = (re.compile(r"::\s*([\w.\-]+)\s*$"), re.compile(r"allocating on stack for %([\w.\-]+) ="),
                re.compile(r"Hlo-Op: ([\w.\-]+):"), re.compile(r"\(starting from ([\w.\-]+)\)"))
# a Mosaic refusal's MLIR location: 'at location: loc("get:"("get/get"(callsite("k3"("/x.py":15:17
# to :38) at ...' - the innermost frame is the kernel's line the refused operation came from
_LOCATION = re.compile(r"at location: loc\((.*)")
_FRAME = re.compile(r'"([^"()]+)"\("([^"]+)":(\d+):\d+')


def by_code(code: str) -> XlaErrorCode | None:
    """The code ``"E1000"`` (or ``"E1000: CompileTimeHbmOom"``), None for one XLA does not declare."""
    return _BY_CODE.get(code.split(":", 1)[0].strip())


def classify(message: str) -> tuple[XlaErrorCode | None, bool]:
    """Which error code a compiler or runtime message is, and whether it printed the code.

    Example:
        >>> code, printed = classify("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
        ...                          "required for HLO temporaries (18.50G) exceeds available HBM (15.75G).")
        >>> code.code, code.name, printed
        ('E1000', 'CompileTimeHbmOom', False)
    """
    m = _PRINTED.search(message)
    if m:
        known = _BY_CODE.get(m.group(1))
        if known is not None:
            return known, True
    for c in CODES:
        if c.message is not None and re.search(c.message, message, flags=re.DOTALL):
            return c, False
    return None, False


def pointed_instruction(message: str) -> str | None:
    """The HLO instruction a message is about, when it names one (a kernel whose allocation does
    not fit: ``... :: big.1``), else None."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    for pattern in _INSTRUCTION:
        m = pattern.search(first)
        if m:
            return m.group(1)
    return None


def pointed_source(message: str) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the Python line a message's MLIR location names (the line of
    a Pallas kernel whose operation Mosaic refused: ``at location: loc(... callsite("kernel"(
    "/src/k.py":15:17 ...``), else None.

    Example:
        >>> pointed_source('INTERNAL: Mosaic failed to compile TPU kernel: E2003: ...\\n'
        ...                'at location: loc("get:"("get/get"(callsite("k3"("/src/k.py":15:17 to :38) '
        ...                'at "k3"("/src/k.py":15:17 to :38)))))')
        ('/src/k.py', 15, 'k3')
    """
    m = _LOCATION.search(message)
    if m is None:
        return None
    frame = _FRAME.search(m.group(1))
    return (frame.group(2), int(frame.group(3)), frame.group(1)) if frame else None
