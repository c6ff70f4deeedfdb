"""Transfers: what the user did that moved data, whether they asked for it, and where.

The runtime reports *how* data moved (``TransferInfo.op``: ``"item"``,
``"to"``, ``"copy"``, ``"scalar"``, ``"fallback:<op>"``). :func:`classify`
turns that into the *cause* a user recognises by looking at the Python stack
at that moment:

==============  =========  ======================================================
cause           implicit   the user wrote
==============  =========  ======================================================
``item``        yes        ``t.item()``
``tolist``      yes        ``t.tolist()``
``print``       yes        ``print(t)``, ``repr(t)``, ``f"{t}"``
``bool``        yes        ``bool(t)``, ``if t:``, ``while t:``, ``t and x``
``float``       yes        ``float(t)`` (``int``: ``int(t)``, ``range(t)``)
``index``       yes        ``xs[t]`` (a tensor used as a Python index)
``scalar``      yes        a CPU scalar operand uploaded for a device op
``fallback:op`` yes        an op with no lowering ran on CPU
``cpu``         no         ``t.cpu()``
``to``          no         ``t.to("cpu")``, ``t.to("tpu")``, ``model.to(...)``
``tensor``      no         ``torch.tensor(data, device="tpu")``
``copy``        no         ``dst.copy_(src)`` across devices
==============  =========  ======================================================

C methods (``.item()``, ``.tolist()``, ``__bool__``, ``__float__``) leave no
Python frame, so the caller's current bytecode instruction tells them apart
(a conditional jump is ``if t:``, a call whose callee was loaded as ``item``
is ``.item()``); print is recognised by PyTorch's tensor-formatting frames.
Both verdicts are cached per code object and instruction, so classifying is a
short walk up the stack.

:func:`call_sites` groups recorded transfers by source line (the ledger the
report prints, with loop detection and advice).
"""

from __future__ import annotations

import dataclasses
import dis
import linecache
import os
import re
import sys
from collections.abc import Iterable
from types import CodeType, FrameType

from tpu_debug.tracers.events import SourceLocation, TransferEvent
from tpu_debug.tracers.host_origin import upload_origin
from tpu_debug.tracers.location import _is_library, is_own_file, is_user_frame, location_of, user_frame_location

__all__ = [
    "CAUSE_TEXT",
    "IMPLICIT",
    "LOOP_MIN",
    "USER_CAUSED",
    "CallSite",
    "CausedRead",
    "advice_for",
    "call_sites",
    "classify",
    "classify_site",
    "classify_upload",
    "instruction_at",
    "is_implicit",
    "user_caused",
]

@dataclasses.dataclass(frozen=True, slots=True)
class CausedRead:
    """A read inside library code that the user's call decides: an argument that asks for it
    (``cause="argument"``), a call made more often than the value is needed
    (``cause="cadence"``), or a check the library makes by default and has a switch for
    (``cause="validation"``). ``file`` is the library file under the torch package, ``function``
    the frame that reads (as a transfer's ``context`` names it)."""

    file: str
    function: str
    cause: str
    what: str
    fix: str


USER_CAUSED: tuple[CausedRead, ...] = (
    CausedRead(
        "nn/utils/clip_grad.py",
        "_get_total_norm",
        "argument",
        "clip_grad_norm_(..., error_if_nonfinite=True) reads the total norm back to the host to test it",
        "drop error_if_nonfinite=True (the default, False, reads nothing): clipping stays on the device; to "
        "catch a non-finite norm, keep the norm clip_grad_norm_ returns and test it where the loss is "
        "already read (every N steps), or with torch.isfinite(norm) on the device",
    ),
    CausedRead(
        "optim/lr_scheduler.py",
        "ReduceLROnPlateau.step",
        "cadence",
        "ReduceLROnPlateau.step(metric) reads the metric back to the host (float(metrics)) at each call",
        "call it once per epoch with a validation metric, as ReduceLROnPlateau is meant to be used (its "
        "patience counts calls, so calling it every step also shortens the patience to steps): each call "
        "waits for the device",
    ),
    # torch.distributions checks its arguments by default (Distribution._validate_args is
    # __debug__): the constraint check of each parameter at construction, and of the value given
    # to log_prob, ends in `if not valid.all():`, a read of a device value
    CausedRead(
        "distributions/distribution.py",
        "Distribution.__init__",
        "validation",
        "torch.distributions checks the distribution's parameters against their constraints when it is "
        "built, which reads the check's result back to the host",
        "build it with validate_args=False (Categorical(logits=..., validate_args=False)), or switch the "
        "checks off once at start-up with torch.distributions.Distribution.set_default_validate_args(False): "
        "the checks only test that the parameters are valid, and each one waits for the device",
    ),
    CausedRead(
        "distributions/distribution.py",
        "Distribution._validate_sample",
        "validation",
        "torch.distributions checks the value given to log_prob() against the distribution's support, "
        "which reads the check's result back to the host",
        "build the distribution with validate_args=False, or switch the checks off once at start-up with "
        "torch.distributions.Distribution.set_default_validate_args(False): the check only tests that the "
        "value is in the support, and each one waits for the device",
    ),
)


def user_caused(context: str | None) -> CausedRead | None:
    """The :class:`CausedRead` a library frame (``"/.../torch/nn/utils/clip_grad.py:109 in
    _get_total_norm"``) is, or None for a read that is the library's own business."""
    if not context:
        return None
    where, _, function = context.rpartition(" in ")
    file = where.rpartition(":")[0].replace(os.sep, "/")
    for read in USER_CAUSED:
        if function == read.function and file.endswith("/torch/" + read.file):
            return read
    return None


IMPLICIT = frozenset({"item", "tolist", "print", "bool", "float", "int", "index", "scalar", "numpy", "shape"})

# how the report names each cause
CAUSE_TEXT = {
    "item": ".item()",
    "tolist": ".tolist()",
    "print": "print/repr",
    "bool": "bool() / if t:",
    "float": "float()",
    "int": "int()",
    "index": "tensor as index",
    "scalar": "scalar operand",
    "numpy": ".numpy()",
    "shape": "a data-dependent shape (boolean mask, nonzero)",
    "cpu": ".cpu()",
    "to": ".to()",
    "tensor": "torch.tensor(device=)",
    "copy": "copy_()",
}

# a call site that moved data at least this many times is reported as a loop
LOOP_MIN = 3


def is_implicit(cause: str) -> bool:
    """True when the user did not ask for the copy: a sync to read a value, an
    uploaded scalar operand, a CPU fallback."""
    return cause in IMPLICIT or cause.startswith("fallback:")


_CALLEES = {
    "item": "item",
    "tolist": "tolist",
    "cpu": "cpu",
    "to": "to",
    "tpu": "to",
    "numpy": "numpy",
    "bool": "bool",
    "any": "bool",
    "all": "bool",
    "max": "bool",
    "min": "bool",
    "float": "float",
    "complex": "float",
    "int": "int",
    "range": "int",
    "tensor": "tensor",
    "as_tensor": "tensor",
    "copy_": "copy",
    "print": "print",
    "str": "print",
    "repr": "print",
    "format": "print",
}
_LOADS = frozenset(
    {"LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST", "LOAD_SUPER_ATTR"}
)
# where the expression the call belongs to cannot reach back past
_STATEMENT_ENDS = frozenset({"POP_TOP", "RETURN_VALUE", "RETURN_CONST", "JUMP_BACKWARD", "JUMP_FORWARD"})
_SCAN = 40

_instructions: dict[CodeType, tuple[list[dis.Instruction], dict[int, int]]] = {}
_verdicts: dict[tuple[CodeType, int], str | None] = {}
_frame_kinds: dict[CodeType, str] = {}


def _code_instructions(code: CodeType) -> tuple[list[dis.Instruction], dict[int, int]]:
    found = _instructions.get(code)
    if found is None:
        instrs = list(dis.get_instructions(code))
        found = (instrs, {ins.offset: i for i, ins in enumerate(instrs)})
        _instructions[code] = found
    return found


def instruction_at(code: CodeType, lasti: int) -> dis.Instruction | None:
    """The instruction of ``code`` at offset ``lasti`` (a frame's ``f_lasti``), or None."""
    instrs, index = _code_instructions(code)
    i = index.get(lasti)
    return instrs[i] if i is not None else None


def _instruction_cause(code: CodeType, lasti: int) -> str | None:
    key = (code, lasti)
    if key in _verdicts:
        return _verdicts[key]
    verdict = None
    try:
        instrs, index = _code_instructions(code)
        i = index.get(lasti)
        if i is not None:
            verdict = _cause_at(instrs, i, code.co_filename)
    except Exception:  # noqa: BLE001 - an unreadable code object just goes unclassified
        verdict = None
    _verdicts[key] = verdict
    return verdict


_NAME_AT_END = re.compile(r"([A-Za-z_]\w*)\s*$")


def _call_source_name(filename: str, ins: dis.Instruction) -> str | None:
    """The callee's name from the call's source text: ``x.sum().item()`` -> ``item``."""
    pos = ins.positions
    if pos is None or None in (pos.lineno, pos.end_lineno, pos.col_offset, pos.end_col_offset):
        return None
    lines = linecache.getlines(filename)
    if not lines or pos.end_lineno > len(lines):
        return None
    chunk = [ln.encode() for ln in lines[pos.lineno - 1 : pos.end_lineno]]  # offsets count UTF-8 bytes
    chunk[-1] = chunk[-1][: pos.end_col_offset]
    chunk[0] = chunk[0][pos.col_offset :]
    text = b"".join(chunk).decode(errors="replace").rstrip()
    if not text.endswith(")"):
        return None
    depth = 0
    for j in range(len(text) - 1, -1, -1):  # the argument list is the last balanced (...)
        ch = text[j]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                m = _NAME_AT_END.search(text[:j])
                return m.group(1) if m else None
    return None


def _cause_at(instrs: list[dis.Instruction], i: int, filename: str = "") -> str | None:
    op = instrs[i].opname
    if op.startswith(("POP_JUMP", "JUMP_IF_")) or op in ("UNARY_NOT", "TO_BOOL"):
        return "bool"
    if op in ("BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR", "BINARY_SLICE", "STORE_SLICE"):
        return "index"
    if op in ("FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"):
        return "print"
    if op.startswith("CALL") or op == "PRECALL":
        name = _call_source_name(filename, instrs[i]) if filename else None
        if name is not None:
            return _CALLEES.get(name)
        # no source: the callee was loaded before its arguments, the nearest known name back is it
        for j in range(i - 1, max(-1, i - _SCAN), -1):
            prev = instrs[j]
            if prev.opname in _STATEMENT_ENDS or prev.opname.startswith("STORE_"):
                break
            if prev.opname in _LOADS and isinstance(prev.argval, str):
                cause = _CALLEES.get(prev.argval)
                if cause is not None:
                    return cause
    return None


def _frame_kind(code: CodeType) -> str:
    """``"own"`` (tpu_debug, dynamo's disable wrapper), ``"print"`` (tensor formatting),
    ``"library"`` or ``"user"``."""
    kind = _frame_kinds.get(code)
    if kind is None:
        name = code.co_name
        norm = os.path.realpath(code.co_filename).replace(os.sep, "/")
        if is_own_file(code.co_filename) or "/torch/_dynamo/" in norm:
            kind = "own"
        elif norm.endswith("/torch/_tensor_str.py") or (
            norm.endswith("/torch/_tensor.py") and name in ("__repr__", "__str__", "__format__")
        ):
            kind = "print"
        else:
            kind = "library" if _is_library(code) else "user"
        _frame_kinds[code] = kind
    return kind


def classify(op: str, depth: int = 1) -> tuple[str, bool, SourceLocation | None]:
    """(cause, implicit, user line) of a transfer the runtime reports as ``op`` (see
    :func:`classify_site`, which also names the library frame that made it)."""
    cause, implicit, location, _context = classify_site(op, depth + 1)
    return cause, implicit, location


def classify_site(op: str, depth: int = 1) -> tuple[str, bool, SourceLocation | None, SourceLocation | None]:
    """(cause, implicit, user line, library frame) of a transfer the runtime reports as ``op``.

    The library frame is the first frame outside tpu_debug when it is not the user's own
    (a ``.item()`` inside transformers' ``generate``, reached from the user's line), else None.

    Args:
        op: the runtime's ``TransferInfo.op``.
        depth: frames to skip above the caller before looking.

    Example::

        classify("item")   # called under `loss.item()` in train.py
        # ('item', True, SourceLocation('train.py', 20, 'train'))
    """
    cause, implicit, location, context, _frame = _walk(op, depth + 1)
    return cause, implicit, location, context


def classify_upload(op: str, depth: int = 1) -> tuple[str, bool, SourceLocation | None, SourceLocation | None, str | None]:
    """:func:`classify_site`'s verdict on a host-to-device copy, and the factory that made the
    data on the host when the user's line shows one (``"torch.randn"``; see
    :mod:`tpu_debug.tracers.host_origin`), else None."""
    cause, implicit, location, context, frame = _walk(op, depth + 1)
    origin = None
    if frame is not None and not implicit and context is None:
        ins = instruction_at(frame.f_code, frame.f_lasti)
        origin = upload_origin(frame.f_code, frame.f_lasti, ins.positions if ins is not None else None)
    return cause, implicit, location, context, origin


def _walk(op: str, depth: int) -> tuple[str, bool, SourceLocation | None, SourceLocation | None, FrameType | None]:
    """The stack walk of :func:`classify_site`, which also gives the user frame it stopped at."""
    try:
        frame: FrameType | None = sys._getframe(depth + 1)
    except ValueError:
        frame = None
    user_frame = None
    cause: str | None = op if op.startswith("fallback:") or op == "scalar" else None
    # a value read for a data-dependent shape: the formatting of a printed tensor (print wins),
    # else whatever the user's instruction was (a boolean mask as an index) reads for its size
    shape = op == "shape"
    caller_seen = False
    location = context = None
    while frame is not None:
        kind = _frame_kind(frame.f_code)
        if kind != "own":
            if kind == "print" and cause is None:
                cause = "print"
            user = kind == "user" and is_user_frame(frame)
            if not caller_seen:
                caller_seen = True
                if cause is None and not shape:
                    cause = _instruction_cause(frame.f_code, frame.f_lasti)
                if not user and kind != "print" and not frame.f_code.co_filename.startswith("<"):
                    context = location_of(frame)  # library code moved the data, not the user's line
            if user:
                location = user_frame_location(frame)
                user_frame = frame
                break
        frame = frame.f_back
    if cause is None:
        cause = {"copy": "copy", "to": "to", "item": "item"}.get(op, op)
    return cause, is_implicit(cause), location, context if location is not None else None, user_frame


# ---------------------------------------------------------------------------------
# The ledger, by call site
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CallSite:
    """The transfers of one source line with one direction and cause, added up.

    ``calls`` counts the times the line moved data: one per transfer, except
    for ``print``, where one call copies a tensor element by element (a run of
    transfers from the line with no other transfer between counts once).
    """

    location: SourceLocation | None
    direction: str
    cause: str
    implicit: bool
    count: int
    nbytes: int
    seconds: float
    shapes: tuple[str, ...]
    calls: int = 0

    @property
    def loop(self) -> bool:
        """The line synced on many calls: it sits in a loop (explicit copies, such as
        uploading each batch, are not syncs and are not flagged)."""
        return self.implicit and (self.calls or self.count) >= LOOP_MIN


def call_sites(transfers: Iterable[TransferEvent]) -> list[CallSite]:
    """Transfers grouped by (line, direction, cause): implicit first, then loops,
    then the most frequent, then the slowest."""
    groups: dict[tuple, list[TransferEvent]] = {}
    runs: dict[tuple, int] = {}
    previous = None
    for t in sorted(transfers, key=lambda t: t.id):
        key = (t.location, t.direction, t.op, t.implicit)
        groups.setdefault(key, []).append(t)
        if key != previous:
            runs[key] = runs.get(key, 0) + 1
        previous = key
    out = []
    for (location, direction, cause, implicit), items in groups.items():
        shapes: dict[str, None] = {}
        for t in items:
            shapes.setdefault(f"{t.dtype}[{','.join(map(str, t.shape))}]", None)
        out.append(
            CallSite(
                location,
                direction,
                cause,
                implicit,
                len(items),
                sum(t.nbytes for t in items),
                sum(t.seconds for t in items),
                tuple(shapes)[:4],
                runs[(location, direction, cause, implicit)] if cause == "print" else len(items),
            )
        )
    out.sort(key=lambda s: (not s.implicit, not s.loop, -(s.calls or s.count), -s.seconds))
    return out


def advice_for(site: CallSite) -> str:
    """What to do about a call site that syncs in a loop."""
    cause = site.cause
    if cause in ("item", "float", "int"):
        return (
            "each call waits for the device to finish; keep the running value on the device "
            "(total += loss.detach()) and read it once, after the loop or every N steps"
        )
    if cause == "print":
        return "printing a tensor copies it to the host (element by element); print a reduced value every N steps"
    if cause == "bool":
        return "a tensor in a Python condition waits for the device; use torch.where, or check once outside the loop"
    if cause == "tolist":
        return "tolist() copies the whole tensor to the host; keep the data on the device or copy once after the loop"
    if cause == "index":
        return "a tensor used as a Python index is read back to the host; index with the tensor on the device instead"
    if cause == "shape":
        return (
            "the result's size depends on the data, so the host waits for the device to count it and "
            "each new size compiles again; keep the shape fixed: torch.where or masked_fill instead of "
            "selecting with a mask, ignore_index or a weighted loss instead of dropping elements"
        )
    if cause == "scalar":
        return "a CPU scalar tensor is uploaded on every call; make it a Python number or create it on the device once"
    if cause.startswith("fallback:"):
        return f"aten::{cause.removeprefix('fallback:')} has no tpu lowering and runs on CPU; add one under runtime/ops/"
    if site.direction == "h2d":
        return "data is uploaded on every iteration; move it to the device once, before the loop"
    return "data is copied to the host on every iteration; copy once, after the loop"
