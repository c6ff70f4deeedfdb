"""Dynamo's own account of a compile: failed guards, graph breaks, recompile-limit hits.

Read through PyTorch's logging, never by scraping stderr:

- the structured trace logger ``torch.__trace`` (what ``TORCH_TRACE`` and tlparse
  read) gives, per dynamo compile id, the frame being compiled
  (``dynamo_start``), why the cached graphs did not serve the call
  (``recompile_reasons``) and each graph break (``dynamo_graph_break_reason``);
- the ``torch._dynamo.convert_frame`` logger's warning when a function hits
  ``recompile_limit``, whose record arguments carry the limit and last reason.

The handlers are attached while at least one listener is subscribed (a trace,
:func:`tpu_debug.expect_no_recompiles`) and removed with the last one. PyTorch
already builds the structured records (its lazy ``TORCH_TRACE`` handler is
always attached), so listening costs only our handler's own work, at compile
time.

The module also remembers, per dynamo compile id, the guard failure that led to
it, and per frame id the function it compiles: the recompile tracer
(:mod:`.recompiles`) uses both to explain a compiled-mode recompile.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
import logging
import os
import re
import sys
import threading
from typing import Any, Protocol

from tpu_debug.tracers.events import (
    GraphBreakEvent,
    GuardFailureEvent,
    KeyDiff,
    RecompileLimitEvent,
    SourceLocation,
)
from tpu_debug.tracers.location import split_frames, user_location
from tpu_debug.tracers.recording.compiled_names import compiled_name, function_label

from tpu_debug.core.hooks import ErrorLog, deliver, report_failure

__all__ = [
    "DynamoListener",
    "DynamoRecorder",
    "GraphBreak",
    "GuardFailure",
    "RecompileLimit",
    "clean_guard",
    "frame_function",
    "guard_diffs",
    "guard_failure",
    "guard_location",
    "installed",
    "subscribe",
    "unsubscribe",
]

_TRACE_LOGGER = "torch.__trace"
_LIMIT_LOGGER = "torch._dynamo.convert_frame"
_LIMIT_PREFIX = "torch._dynamo hit config."
_MAX_FAILURES = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class GuardFailure:
    """Why dynamo compiled a function again: each cached entry's failed guard.

    ``guards`` holds ``(entry compile id, guard text)`` pairs, most recent entry
    first (``("0/1", "tensor 'x' size mismatch at index 0. expected 8, actual 9")``).
    ``values`` holds ``(source, value)`` pairs: what a value or size guard's source
    (``L['clip']``, ``L['x'].size()[0]``) held in the call that failed it, the guard
    itself giving only the value it was compiled for.
    """

    compile_id: str
    frame: int
    function: str | None
    guards: tuple[tuple[str, str], ...]
    location: SourceLocation | None
    # the user's line the most recent failed guard names (where the guarded value is read or
    # changed inside the compiled function, as dynamo's "User stack trace" gives it)
    at: SourceLocation | None = None
    values: tuple[tuple[str, str], ...] = ()

    def value_of(self, source: str) -> str | None:
        """What ``source`` held in the call that failed the guards, if it was read."""
        return next((value for src, value in self.values if src == source), None)

    def for_entry(self, compile_id: str | None) -> str | None:
        """The guard that failed for the cached entry ``compile_id`` (else the most recent one)."""
        for entry, text in self.guards:
            if entry == compile_id:
                return text
        return self.guards[0][1] if self.guards else None


@dataclasses.dataclass(frozen=True, slots=True)
class GraphBreak:
    """Dynamo split a function for ``reason``.

    ``location`` is the user's line that reached the break: the break itself when it
    is in user code, else the innermost user frame of dynamo's traceback, else the
    user's call of the compiled function (``call_site``). ``context`` is the library
    frame where the break is (None when it is in user code). ``deliberate`` marks a
    break PyTorch's optimizer makes on purpose around code that runs no tensor op
    (``torch._dynamo.graph_break()`` in its step decorator, the ``torch.compiler.disable``d
    step counter an LR scheduler reads, the scheduler's counting wrapper of ``optimizer.step``,
    which dynamo skips while the step it calls compiles as a frame of its own).
    """

    function: str
    reason: str
    location: SourceLocation | None
    call_site: SourceLocation | None
    context: SourceLocation | None = None
    deliberate: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RecompileLimit:
    """A function hit dynamo's ``limit_type`` (``recompile_limit``) and now runs uncompiled."""

    function: str
    limit_type: str
    limit: int
    reason: str
    location: SourceLocation | None  # the guarded line when dynamo names one, else the call
    # what its compiles are known by (their forward graph's identity, see recompile_tracker)
    identity: str | None = None


class DynamoListener(Protocol):
    """What a subscriber implements (every method is optional in practice)."""

    def on_guard_failure(self, failure: GuardFailure) -> None: ...

    def on_graph_break(self, brk: GraphBreak) -> None: ...

    def on_recompile_limit(self, hit: RecompileLimit) -> None: ...

    def on_internal_error(self, method: str, exc: BaseException) -> None: ...


# ---------------------------------------------------------------------------------
# State shared by every listener
# ---------------------------------------------------------------------------------

_lock = threading.Lock()
_listeners: tuple[Any, ...] = ()
_strings: dict[int, str] = {}  # the structured trace interns file names
_frames: dict[int, tuple[str, str]] = {}  # frame id -> (function, file)
_failures: collections.OrderedDict[str, GuardFailure] = collections.OrderedDict()
_saved_level: int | None = None
#: failures of listener methods (bounded: the first ones as text, and a count of all)
internal_errors = ErrorLog()


def installed() -> bool:
    """True while the logging handlers are attached."""
    return bool(_listeners)


def guard_failure(compile_id: str | None) -> GuardFailure | None:
    """The guard failure that made dynamo start compile ``compile_id`` ("0/3"), if seen."""
    return _failures.get(compile_id) if compile_id is not None else None


def frame_function(frame: int | None) -> tuple[str, str] | None:
    """(function name, file) of dynamo frame id ``frame``, if seen while listening."""
    return _frames.get(frame) if frame is not None else None


def subscribe(listener: Any) -> None:
    """Start telling ``listener``; the first subscriber attaches the logging handlers."""
    global _listeners
    with _lock:
        if listener in _listeners:
            return
        if not _listeners:
            _attach()
        _listeners = _listeners + (listener,)


def unsubscribe(listener: Any) -> None:
    """Stop telling ``listener``; the last one detaches the handlers."""
    global _listeners
    with _lock:
        if listener not in _listeners:
            return
        _listeners = tuple(x for x in _listeners if x is not listener)
        if not _listeners:
            _detach()


def _attach() -> None:
    global _saved_level
    trace_log = logging.getLogger(_TRACE_LOGGER)
    _saved_level = trace_log.level
    if trace_log.level == logging.NOTSET or trace_log.level > logging.DEBUG:
        trace_log.setLevel(logging.DEBUG)  # structured records are DEBUG records
    trace_log.addHandler(_trace_handler)
    logging.getLogger(_LIMIT_LOGGER).addHandler(_limit_handler)


def _detach() -> None:
    trace_log = logging.getLogger(_TRACE_LOGGER)
    trace_log.removeHandler(_trace_handler)
    if _saved_level is not None:
        trace_log.setLevel(_saved_level)
    logging.getLogger(_LIMIT_LOGGER).removeHandler(_limit_handler)


def _notify(method: str, item: Any) -> None:
    route = tuple(
        (listener, method, fn) for listener in _listeners if (fn := getattr(listener, method, None)) is not None
    )
    deliver(route, (item,), internal_errors)


# ---------------------------------------------------------------------------------
# Parsing what dynamo logs
# ---------------------------------------------------------------------------------

_ENTRY = re.compile(r"^(\d+/\d+):\s*(.*)$", re.DOTALL)


def clean_guard(text: str) -> tuple[str | None, str]:
    """``"0/1: n == 2   # y = x * n  # f.py:3 in f\\nUser stack..."`` -> ``("0/1", "n == 2")``."""
    m = _ENTRY.match(text.strip())
    entry, body = (m.group(1), m.group(2)) if m else (None, text.strip())
    first = body.splitlines()[0] if body else ""
    if "  #" in first:  # dynamo appends "# <user code>  # <file:line in fn>" to value guards
        first = first.split("  #", 1)[0]
    return entry, first.strip()


def guard_location(text: str) -> SourceLocation | None:
    """The user's line a failed guard names: the innermost user frame of the "User stack trace"
    dynamo appends to a guard on a value read in the compiled code (``self.calls == 3`` names
    the ``self.calls += 1`` line); None for a guard without one (a tensor's size)."""
    if "User stack trace:" not in text:
        return None
    stack = text.split("User stack trace:", 1)[1]
    frames = [SourceLocation(f, int(ln), fn) for f, ln, fn in _FRAME_LINE.findall(stack)]
    user, _ = split_frames(frames)
    return user


def _reasons(payload: str | None) -> list[str]:
    if not payload:
        return []
    text = payload.strip()
    if text.startswith("["):  # several cached entries: a JSON list
        try:
            value = json.loads(text)
        except ValueError:
            return [text]
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return [text]


_BREAK_AT = re.compile(r"Graph break in user code at (.+):(\d+)")
_FRAME_LINE = re.compile(r'File "(.+)", line (\d+), in (\S+)')


def _graph_break_reason(payload: str) -> str:
    """A one-line reason from dynamo's graph-break text: "<what>: <explanation>"."""
    block = payload.split("User code traceback:", 1)[0]
    block = block.split("Graph Break Reason:", 1)[-1]
    lines = [ln.strip() for ln in block.splitlines()]
    title, explanation = "", ""
    for i, ln in enumerate(lines):
        if ln.startswith("Explanation:"):
            explanation = ln.removeprefix("Explanation:").strip()
            title = next((p for p in reversed(lines[:i]) if p), "")
            break
    if not title:
        title = next((ln for ln in lines if ln), "graph break")
    title = title.rstrip(":")
    return f"{title}: {explanation}" if explanation else title


# PyTorch's optimizer splits its compiled step on purpose around Python-only work: its
# step decorator calls torch._dynamo.graph_break() around a grad-mode switch, and the
# step counter an LR scheduler reads is bumped by a torch.compiler.disable'd helper. Neither
# side of those breaks runs a tensor op, so they cost no program launch. Other disabled torch
# code (an optimizer's non-capturable math, say) does run ops, and stays a finding.
_DELIBERATE = ("Call to `torch._dynamo.graph_break()`", "Skip inlining `torch.compiler.disable()`d function")
_DELIBERATE_FILES = (os.path.join("optim", "optimizer.py"),)
# An LR scheduler replaces optimizer.step with a wrapper (in lr_scheduler.py) that only sets
# a flag before calling the real step, and dynamo skips every function of that file: the
# break falls on the wrapper, and the optimizer's own step, called from it, is compiled as a
# frame of its own. The step still runs as one program; the wrapper runs no tensor op.
_SKIPPED = "Attempted to call function marked as skipped"
_SKIPPED_FILE = re.compile(r"in file `([^`]+)`")
_WRAPPER_FILES = (os.path.join("optim", "lr_scheduler.py"),)


def _torch_file(path: str, names: tuple[str, ...]) -> bool:
    import torch  # dynamo is running: torch is imported

    root = os.path.dirname(os.path.realpath(torch.__file__))
    return os.path.realpath(path) in {os.path.join(root, f) for f in names}


def _deliberate(reason: str, context: SourceLocation | None) -> bool:
    if reason.startswith(_SKIPPED):
        m = _SKIPPED_FILE.search(reason)
        return m is not None and _torch_file(m.group(1), _WRAPPER_FILES)
    if context is None or not reason.startswith(_DELIBERATE):
        return False
    return _torch_file(context.file, _DELIBERATE_FILES)


def _user_traceback(payload: str) -> list[SourceLocation]:
    """The frames of dynamo's "User code traceback", outermost first."""
    if "User code traceback:" not in payload:
        return []
    tb = payload.split("User code traceback:", 1)[1].split("Traceback (most recent call last)", 1)[0]
    return [SourceLocation(f, int(ln), fn) for f, ln, fn in _FRAME_LINE.findall(tb)]


def _parse_graph_break(payload: str, frame: int | None) -> GraphBreak:
    call_site = user_location(1)
    reason = _graph_break_reason(payload)
    function = (_frames.get(frame) or ("?", ""))[0] if frame is not None else "?"
    frames = _user_traceback(payload)
    m = _BREAK_AT.search(payload)
    at = None
    if m:
        file, line = m.group(1), int(m.group(2))
        at = next((f for f in reversed(frames) if f.file == file and f.line == line), None)
        at = at or SourceLocation(file, line, function)
        function = at.function
        if not frames or frames[-1] != at:
            frames.append(at)
    user, context = split_frames(frames)
    deliberate = _deliberate(reason, context)
    shown = pretty_function(function)
    if function == "inner":  # OptimizedModule's wrapper around a torch.nn module: the module's name
        named = compiled_name(None)
        shown = named.label() if named is not None else shown
    return GraphBreak(shown, reason, user or call_site, call_site, context, deliberate)


_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+)_at_(\d+)$")


def pretty_function(name: str) -> str:
    """A function's name; dynamo's resume functions named after the function and line they resume."""
    m = _RESUME.match(name)
    return f"{m.group(1)} (after the graph break at line {m.group(2)})" if m else name


def _on_structured(md: dict, payload: str | None) -> None:
    if "str" in md:
        value = md["str"]
        if isinstance(value, (list, tuple)) and len(value) == 2:
            _strings[int(value[1])] = str(value[0])
        return
    frame = md.get("frame_id")
    if "dynamo_start" in md and frame is not None:
        stack = (md["dynamo_start"] or {}).get("stack") or []
        if stack:
            last = stack[-1]
            file = last.get("filename")
            file = _strings.get(file, str(file)) if isinstance(file, int) else str(file)
            _frames[int(frame)] = (pretty_function(str(last.get("name", "?"))), file)
        return
    artifact = md.get("artifact")
    if not isinstance(artifact, dict):
        return
    name = artifact.get("name")
    if name == "recompile_reasons" and frame is not None:
        compile_id = f"{frame}/{md.get('frame_compile_id')}"
        guards = []
        texts = _reasons(payload)
        for text in texts:
            entry, guard = clean_guard(text)
            guards.append((entry or "?", guard))
        known = _frames.get(int(frame))
        at = guard_location(texts[0]) if texts else None
        failure = GuardFailure(
            compile_id,
            int(frame),
            known[0] if known else None,
            tuple(guards),
            user_location(1),
            at,
            _values_now([guard for _, guard in guards]),
        )
        _failures[compile_id] = failure
        while len(_failures) > _MAX_FAILURES:
            _failures.popitem(last=False)
        _notify("on_guard_failure", failure)
    elif name == "dynamo_graph_break_reason" and payload:
        _notify("on_graph_break", _parse_graph_break(payload, int(frame) if frame is not None else None))


# a guard that compares one source with a literal: ``L['clip'] == 3.0``, ``L['x'].size()[0] == 8``
_COMPARED = re.compile(r"^(?P<source>[A-Za-z_]\w*(?:\.\w+(?:\(\))?|\[[^\]]*\])*) == \S+$")
# dynamo's function that logs the recompile reasons: its ``frame`` is the call being compiled
_REASONS_FUNCTION = "get_and_maybe_log_recompilation_reasons"


def _values_now(guards: list[str]) -> tuple[tuple[str, str], ...]:
    """What each compared source holds in the call that failed the guards.

    Read from the frame dynamo is compiling, which the function logging the reasons holds
    (this handler runs inside it); nothing is read when it is not on the stack."""
    sources = [m["source"] for m in map(_COMPARED.match, guards) if m]
    if not sources:
        return ()
    caller = sys._getframe(1)
    while caller is not None and caller.f_code.co_name != _REASONS_FUNCTION:
        caller = caller.f_back
    frame = caller.f_locals.get("frame") if caller is not None else None
    if frame is None:
        return ()
    scope = {"L": frame.f_locals, "G": frame.f_globals}
    out = []
    for source in sources:
        try:
            value = _read_source(ast.parse(source, mode="eval").body, scope)
        except Exception:  # noqa: BLE001, S112 - a source not read is shown without its value
            continue
        if isinstance(value, (bool, int, float, str, type(None))):
            out.append((source, repr(value)))
    return tuple(out)


def _read_source(node: ast.AST, scope: dict[str, Any]) -> Any:
    """A guard's source, read without evaluating code: ``L``/``G`` (the frame's locals and
    globals), a bare name (a local, else a global: dynamo's short form), constant subscripts,
    attributes and ``.size()``; anything else raises ``ValueError``."""
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        local = scope["L"]
        return local[node.id] if node.id in local else scope["G"][node.id]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return _read_source(node.value, scope)[node.slice.value]
    if isinstance(node, ast.Attribute):
        return getattr(_read_source(node.value, scope), node.attr)
    if (
        isinstance(node, ast.Call)
        and not node.args
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "size"
    ):
        return tuple(_read_source(node.func.value, scope).size())
    raise ValueError(f"not a guard source: {ast.dump(node)}")


_FUNC_INFO = re.compile(r"^'(.+)' \((.+):(\d+)\)$")


def _on_limit(record: logging.LogRecord) -> None:
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) < 4:
        return
    limit_type, limit, func, reason = args[:4]
    m = _FUNC_INFO.match(str(func))
    function = pretty_function(m.group(1)) if m else str(func)
    identity = None
    if m:  # the user's name for it: the module being called, else the function and its line
        code = (m.group(2), int(m.group(3)), m.group(1))
        named = compiled_name(code)
        function = named.label() if named is not None else function_label(code[2], code[0], code[1])
        identity = f"{function} (forward)"
    try:
        value = int(limit)
    except (TypeError, ValueError):
        value = -1
    _, guard = clean_guard(str(reason))
    where = guard_location(str(reason)) or user_location(1)
    _notify("on_recompile_limit", RecompileLimit(function, str(limit_type), value, guard, where, identity))


class _TraceHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            md = getattr(record, "metadata", None)
            if isinstance(md, dict):
                _on_structured(md, getattr(record, "payload", None))
        except Exception as exc:  # noqa: BLE001 - never break dynamo's compile
            for listener in _listeners:
                report_failure(listener, "structured trace", exc, internal_errors)


class _LimitHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            if isinstance(record.msg, str) and record.msg.startswith(_LIMIT_PREFIX):
                _on_limit(record)
        except Exception as exc:  # noqa: BLE001 - never break dynamo's compile
            for listener in _listeners:
                report_failure(listener, "recompile limit", exc, internal_errors)


_trace_handler = _TraceHandler(logging.DEBUG)
_limit_handler = _LimitHandler(logging.WARNING)


# ---------------------------------------------------------------------------------
# Guard text -> structured differences
# ---------------------------------------------------------------------------------

def _guarded(aspect: str, before: str, now: str, **where: Any) -> KeyDiff:
    return KeyDiff(aspect, before, now, source="guard", **where)


_GUARD_FORMS: tuple[tuple[re.Pattern, Any], ...] = (
    (
        re.compile(r"^tensor '(.+?)' size mismatch at index (\d+)\. expected (\S+), actual (\S+)$"),
        lambda m: _guarded("shape", m[3], m[4], arg_name=m[1], dims=(int(m[2]),)),
    ),
    (
        re.compile(r"^tensor '(.+?)' stride mismatch at index (\d+)\. expected (\S+), actual (\S+)$"),
        lambda m: _guarded("layout", m[3], m[4], arg_name=m[1], dims=(int(m[2]),), detail="stride"),
    ),
    (
        re.compile(r"^tensor '(.+?)' dtype mismatch\. expected (\S+), actual (\S+)$"),
        lambda m: _guarded("dtype", m[2], m[3], arg_name=m[1]),
    ),
    (
        re.compile(r"^tensor '(.+?)' rank mismatch\. expected (\S+), actual (\S+)$"),
        lambda m: _guarded("shape", m[2], m[3], arg_name=m[1], detail="rank"),
    ),
    (
        re.compile(r"^tensor '(.+?)' requires_grad mismatch\. expected requires_grad=(\d)$"),
        lambda m: _guarded("grad", str(m[2] == "1"), str(m[2] != "1"), arg_name=m[1], detail="requires_grad"),
    ),
    (
        re.compile(r"^tensor '(.+?)' device mismatch\. expected (.+), actual (.+)$"),
        lambda m: _guarded("layout", m[2], m[3], arg_name=m[1], detail="device"),
    ),
    (
        re.compile(r"^GLOBAL_STATE changed: (.+)$"),
        lambda m: _guarded("grad", m[1].strip().replace("_", " "), "changed", detail="global state"),
    ),
    (
        re.compile(
            r"^([A-Za-z_][\w.]*|L\['[^']+'\](?:\.\w+)*) == (-?\d+(?:\.\d*)?(?:e-?\d+)?|True|False|-?inf|nan)$"
        ),
        lambda m: _guarded("scalar", m[2], "changed", arg_name=_local_name(m[1])),
    ),
)


def _local_name(source: str) -> str:
    m = re.fullmatch(r"L\['([^']+)'\](.*)", source)
    return m.group(1) + m.group(2) if m else source


def guard_diffs(guard: str, failure: GuardFailure | None = None) -> list[KeyDiff]:
    """Structured differences for one failed guard (``"dynamo guard"`` when its form is unknown).

    A value guard gives the value it was compiled for; ``failure`` (the guard failure it
    is part of) gives the value the call passed instead, when it was read.

    Example:
        >>> guard_diffs("tensor 'x' size mismatch at index 0. expected 8, actual 9")[0].field
        "tensor 'x' dim 0"
    """
    for pattern, make in _GUARD_FORMS:
        m = pattern.match(guard)
        if m:
            diff = make(m)
            if diff.aspect == "scalar" and failure is not None:
                now = failure.value_of(m[1])
                diff = dataclasses.replace(diff, now=now) if now is not None else diff
            return [diff]
    return [_guarded("guard", guard, "failed")]


# ---------------------------------------------------------------------------------
# Into the run store
# ---------------------------------------------------------------------------------


class DynamoRecorder:
    """A listener that records dynamo's events into a run (``RunWriter``).

    Args:
        writer: the run's writer.
        clock: seconds since the run started (the recorder's clock).
        record_error: keeps a tracer failure in the run, ``(where, message)``.
    """

    def __init__(self, writer: Any, clock: Any, record_error: Any) -> None:
        self.writer = writer
        self.clock = clock
        self.record_error = record_error

    def _head(self, location: SourceLocation | None) -> tuple:
        return (self.writer.new_id(), self.clock(), "compiled", threading.get_native_id(), location)

    def on_guard_failure(self, failure: GuardFailure) -> None:
        name = failure.function or f"frame {failure.frame}"
        guards = tuple(f"{entry}: {text}" for entry, text in failure.guards)
        self.writer.put(GuardFailureEvent(*self._head(failure.location), name, failure.compile_id, guards))

    def on_graph_break(self, brk: GraphBreak) -> None:
        context = str(brk.context) if brk.context is not None else ""
        self.writer.put(
            GraphBreakEvent(
                *self._head(brk.location or brk.call_site), brk.function, brk.reason, context, brk.deliberate
            )
        )

    def on_recompile_limit(self, hit: RecompileLimit) -> None:
        self.writer.put(
            RecompileLimitEvent(
                *self._head(hit.location), hit.function, hit.limit_type, hit.limit, hit.reason, hit.identity
            )
        )

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        self.record_error(f"DynamoRecorder.{method}", f"{type(exc).__name__}: {exc}")
