"""Transfer sites: what the user did that moved data, whether they asked for it, and where.

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

What the causes are called, and the ledger of recorded transfers by line, are read
back by ``tracers/reading/transfer_causes.py``.
"""

from __future__ import annotations

import dis
import linecache
import os
import re
import sys
from types import CodeType, FrameType
from typing import NamedTuple

from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import is_library_code, is_own_file, is_user_frame, location_of, user_frame_location
from tpu_debug.tracers.reading.transfer_causes import is_implicit
from tpu_debug.tracers.recording.host_origin import upload_origin

__all__ = ["Upload", "classify", "classify_site", "classify_upload", "frame_kind", "instruction_at"]


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
# by file too: code objects compare equal across files, and a verdict reads the code's own
# file (the source line of a call, a frame's kind)
_verdicts: dict[tuple[str, CodeType, int], str | None] = {}
frame_kinds: dict[tuple[str, CodeType], str] = {}


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
    key = (code.co_filename, code, lasti)
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


def frame_kind(code: CodeType) -> str:
    """``"own"`` (tpu_debug, dynamo's disable wrapper), ``"print"`` (tensor formatting),
    ``"library"`` or ``"user"``."""
    key = (code.co_filename, code)
    kind = frame_kinds.get(key)
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
            kind = "library" if is_library_code(code) else "user"
        frame_kinds[key] = kind
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


class Upload(NamedTuple):
    """:func:`classify_site`'s verdict on a host-to-device copy (``cause``, ``implicit``,
    ``location``, ``context``), and what the user's line shows made the data: ``origin``, the
    factory that made it on the host in the step (``"torch.randn"``), ``follows``, the tensor
    whose shape or device it takes, and ``module``, the ``nn.Module`` class whose method
    uploads it (see :mod:`tpu_debug.tracers.recording.host_origin`); None when not shown."""

    cause: str
    implicit: bool
    location: SourceLocation | None
    context: SourceLocation | None
    origin: str | None = None
    follows: str | None = None
    module: str | None = None
    made_line: int | None = None  # the line of the user's file that made it, when not the upload's


def classify_upload(op: str, depth: int = 1) -> Upload:
    """:func:`classify_site`'s verdict on a host-to-device copy, with what made its data (:class:`Upload`)."""
    cause, implicit, location, context, frame = _walk(op, depth + 1)
    if frame is None or implicit or context is not None:
        return Upload(cause, implicit, location, context)
    ins = instruction_at(frame.f_code, frame.f_lasti)
    made = upload_origin(frame.f_code, frame.f_lasti, ins.positions if ins is not None else None)
    if made is None:
        return Upload(cause, implicit, location, context)
    made_line = made.line if location is not None and made.line != location.line else None
    return Upload(cause, implicit, location, context, made.factory, made.follows, _module_of(frame), made_line)


def _module_of(frame: FrameType) -> str | None:
    """The class of the ``nn.Module`` whose method ``frame`` runs (its ``self``), else None: data
    made inside a model's forward is the model's work, never a stand-in for a batch."""
    if "self" not in frame.f_code.co_varnames[: frame.f_code.co_argcount]:
        return None
    module = sys.modules.get("torch.nn")
    owner = frame.f_locals.get("self")
    if module is None or not isinstance(owner, module.Module):
        return None
    return type(owner).__qualname__


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
        kind = frame_kind(frame.f_code)
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


