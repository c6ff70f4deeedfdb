"""A compiled program's peak read back: how its buffers are written, and what to change by kind.

The program memory tracer (``tracers/recording/program_memory_tracer.py``) records one
:class:`~tpu_debug.tracers.events.ProgramMemoryEvent` per program: its buffers at the peak,
each with its kind (:data:`KINDS`). The report, the TUI, ``diff``, ``fit`` and the advisor
write them with these functions, and :func:`remedies` says what to change for each kind of
the peak's bytes, with the need that change would leave.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tpu_debug.core.format import format_bytes, format_location
from tpu_debug.tracers.events import MemoryHolder, ProgramBuffer, ProgramMemoryEvent

__all__ = [
    "KINDS",
    "KIND_TEXT",
    "LOGITS_WIDTH",
    "PADDING_SHARE",
    "Remedy",
    "holder_remedies",
    "made_by",
    "made_where",
    "peak_headline",
    "remedies",
    "remedy_text",
    "shape_text",
    "sharing_text",
    "sum_text",
]

#: what a buffer at the peak is, in the order the report lists kinds
KINDS = ("parameter", "optimizer_state", "gradient", "activation", "temporary", "collective", "host", "input",
         "output", "other", "unused")
KIND_TEXT = {
    "parameter": "parameters",
    "optimizer_state": "optimizer state",
    "gradient": "gradients",
    "activation": "activations kept for backward",
    "temporary": "temporaries",
    "collective": "collective buffers",
    "host": "offloaded to host",
    "input": "inputs",
    "output": "outputs",
    "other": "constants and scalars",
    "unused": "heap fragmentation",
}

def shape_text(b: ProgramBuffer) -> str:
    """``f32[512,256]`` (``-`` for a folded row, ``tuple`` for a tuple's table)."""
    if b.count > 1 or b.kind == "unused":
        return "-"
    return f"{b.dtype}[{','.join(map(str, b.shape))}]" if b.dtype != "tuple" else "tuple"


def made_where(b: ProgramBuffer, cwd: str | None = None) -> str:
    """The PyTorch line that made a buffer (``train.py:12``; a library's line says so), else
    what it is in words (an input made before the trace, XLA's own scalar), or what a folded
    row holds; never a graph node's name."""
    if b.count > 1:
        return f"{b.count} smaller buffers"
    if b.kind == "unused":
        return "between the buffers (the heap's layout)"
    if b.file:
        where = format_location(b.file, b.line, None, cwd=cwd)
        return f"{where} (library)" if b.library else where
    return b.note or "no line: not made by a PyTorch op"


def made_by(b: ProgramBuffer) -> str:
    """What made a buffer, for a table's column: the op (``_softmax|aten::_softmax.default``) or
    an input's name (``qkv.weight``); "" for a folded row and for what no PyTorch op made."""
    if b.count > 1 or not b.op or not (b.file or b.opcode == "parameter"):
        return ""
    return _shortened(b.op)


def sharing_text(b: ProgramBuffer) -> str:
    """How a buffer's bytes are held where that is not plain: reserved for a value written at
    another point, or in an allocation shared over time; "" otherwise."""
    if b.reserved:
        return b.note
    if b.allocation_bytes:
        return (f"in a {format_bytes(b.allocation_bytes)} output allocation shared over time with a larger value "
                "written at another point")
    return ""


def _shortened(name: str, width: int = 56) -> str:
    """A long name (dynamo's attribute for an optimizer's state) cut in its middle."""
    return name if len(name) <= width else f"{name[:width // 2 - 1]}…{name[-(width // 2):]}"


def peak_headline(e: ProgramMemoryEvent) -> str:
    """``g1/train_step on v5e: 18.50 GiB at its peak, while mm|aten::mm runs (point 1 of 3)``."""
    where = f" on {e.target}" if e.target else ""
    at = f", while {e.peak_op} runs" if e.peak_op else ""
    point = f" (point {e.peak_position} of {e.length})" if e.peak_position >= 0 else ""
    text = f"{e.name}{where}: {format_bytes(e.total_bytes)} at its peak{at}{point}"
    if e.status == "hbm_oom":
        text += (f"; the TPU compiler refused it: {format_bytes(e.required_bytes)} needed, "
                 f"{format_bytes(e.available_bytes)} there")
    return text


def sum_text(e: ProgramMemoryEvent) -> str:
    """How the buffers add up, against the compiler's own figures."""
    whose = "the TPU compiler's" if e.source == "target" else "this machine's compiler's"
    text = f"the buffers add up to {format_bytes(e.total_bytes)}, {whose} buffer assignment"
    if e.unused_bytes:
        text += f" ({format_bytes(e.unused_bytes)} of it unused between them)"
    if e.compiler_bytes is not None and e.compiler_bytes != e.total_bytes:
        text += (f"; the executable counts {format_bytes(e.compiler_bytes)} (arguments + outputs - aliased + "
                 "temporaries: no constants, its own rounding of the temporaries)")
    if e.host_bytes:
        text += f"; {format_bytes(e.host_bytes)} more in host memory (offloaded)"
    return text


# -- what to change, by kind ---------------------------------------------------------------------

#: a buffer at least this wide in its last dimension, made by the forward or the loss, is taken
#: for a vocabulary's logits (Llama 3: 128256; GPT-2: 50257)
LOGITS_WIDTH = 32768
#: a buffer whose padding is this fraction of its bytes or more is worth a shape that pads less
PADDING_SHARE = 0.2


@dataclasses.dataclass(frozen=True, slots=True)
class Remedy:
    """What to change for one kind of the bytes at a program's peak.

    ``kind``: ``"activation"``, ``"logits"``, ``"optimizer_state"``, ``"parameter"``,
    ``"gradient"``, ``"temporary"`` or ``"padding"``; ``nbytes`` the peak's bytes of it;
    ``estimate_bytes`` the peak with them gone (an estimate, not a bound: what the change keeps
    instead is not counted, and the peak may move to another point); ``change`` what to do in
    PyTorch; ``lines`` where they are made.
    """

    kind: str
    nbytes: int
    estimate_bytes: int
    change: str
    lines: tuple[str, ...] = ()


_CHANGES = {
    "activation": "activation checkpointing of the blocks that make them (torch.utils.checkpoint, or "
                  "create_selective_checkpoint_contexts to keep only the matmuls): the backward recomputes them",
    "logits": "a chunked (fused linear) cross-entropy, so that no whole [tokens, vocabulary] logits or their "
              "gradient exist at once (torchtune's chunked loss, Liger's LigerFusedLinearCrossEntropyLoss)",
    "optimizer_state": "shard the optimizer state over more chips (FSDP: fully_shard), or keep it in bfloat16 / "
                       "use an optimizer with less state",
    "parameter": "shard the parameters over more chips (FSDP: fully_shard), or keep them in bfloat16",
    "gradient": "reduce the gradients to their shards (FSDP) instead of keeping each whole",
    "temporary": "a smaller batch (the step's temporaries scale with it)",
    "padding": "shapes that pad less: the dimensions the tiles pad to a multiple of 128 (8 for a batch)",
}


def _is_logits(b: ProgramBuffer) -> bool:
    return b.kind in ("activation", "temporary") and len(b.shape) >= 2 and b.shape[-1] >= LOGITS_WIDTH


def remedies(e: ProgramMemoryEvent, cwd: str | None = None) -> tuple[Remedy, ...]:
    """What to change for each kind of the peak's bytes, the largest first, each with the need
    it would leave (``Remedy.estimate_bytes``: the total less that kind's bytes)."""
    parts: dict[str, list[ProgramBuffer]] = {}
    for b in e.buffers:
        kind = "logits" if _is_logits(b) else b.kind
        if kind in _CHANGES:
            parts.setdefault(kind, []).append(b)
    padded = [b for b in e.buffers if b.count == 1 and b.padding_bytes >= PADDING_SHARE * b.nbytes > 0]
    if padded:
        parts["padding"] = padded
    out = []
    for kind, group in parts.items():
        saved = sum(b.padding_bytes for b in group) if kind == "padding" else sum(b.nbytes for b in group)
        lines = tuple(dict.fromkeys(made_where(b, cwd) for b in group if b.file))[:4]
        out.append(Remedy(kind, saved, e.total_bytes - saved, _CHANGES[kind], lines))
    return tuple(sorted(out, key=lambda r: -r.nbytes))


def holder_remedies(holders: Iterable[MemoryHolder], required: int, cwd: str | None = None) -> tuple[Remedy, ...]:
    """What to change for each kind of the tensors held at an eager run's peak
    (``MemoryHolder`` records with their ``kind``), the largest first, each with the need it
    would leave of ``required``."""
    parts: dict[str, list[MemoryHolder]] = {}
    for h in holders:
        wide = len(h.shape) >= 2 and h.shape[-1] >= LOGITS_WIDTH and h.kind in ("activation", "temporary")
        kind = "logits" if wide else h.kind
        if kind in _CHANGES:
            parts.setdefault(kind, []).append(h)
    out = []
    for kind, group in parts.items():
        saved = sum(h.nbytes for h in group)
        lines = tuple(dict.fromkeys(format_location(h.file, h.line, None, cwd=cwd) for h in group if h.file))[:4]
        out.append(Remedy(kind, saved, max(required - saved, 0), _CHANGES[kind], lines))
    return tuple(sorted(out, key=lambda r: -r.nbytes))


def remedy_text(r: Remedy) -> str:
    """``activations kept for backward (8.00 GiB at model.py:12): <change>; without them the peak
    would be about 12.50 GiB``."""
    what = KIND_TEXT.get(r.kind, "the vocabulary's logits" if r.kind == "logits" else r.kind)
    at = f" at {', '.join(r.lines)}" if r.lines else ""
    return (f"{what} ({format_bytes(r.nbytes)}{at}): {r.change}; without them the peak would be about "
            f"{format_bytes(r.estimate_bytes)} (an estimate: what the change keeps instead, and a peak that moves "
            "elsewhere, are not counted)")


