"""The user's names for what dynamo compiles: a module by its class, the name the user's code calls
it by and the line that compiled it; a function by its name and the line it starts at.

Dynamo knows a compiled frame only by its code object. For a module that is the class's
``forward``, or, for a module of ``torch.nn`` itself (``torch.compile(nn.Sequential(...))``),
the ``inner`` wrapper in ``torch/_dynamo/external_utils.py`` that ``OptimizedModule`` puts
around it: a name no user wrote. While dynamo compiles a call, the call is on the stack: the
module being called (the innermost ``Module.__call__`` frame's ``self``, unwrapped from its
``OptimizedModule``), and above it the user's line that calls it, whose call expression is
the name the user gives it (``f``, ``model``, ``self.encoder``). The line that compiled it is
read from the source of that line's file: the assignment of ``torch.compile(...)`` to that
name (``f = torch.compile(model)``, ``self.encoder = torch.compile(Encoder())``), or the
name's in-place ``.compile()``.

:func:`compiled_name` answers while dynamo compiles (the recompile tracker names a graph's
identity with it, the dynamo recorder a recompile-limit hit and a graph break); nothing is
read when no module is being called, and a compiled function keeps its own name.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import re
import sys
from types import FrameType

from tpu_debug.core.format import format_location
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.location import is_user_frame, user_frame_location
from tpu_debug.tracers.recording.transfer_sites import instruction_at

__all__ = ["CompiledName", "compiled_name", "function_label"]

_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+)_at_(\d+)$")
_WRAPPER = ("external_utils.py", "inner")  # OptimizedModule's wrapper around a torch.nn module


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledName:
    """A compiled module as the user knows it: its class, the expression the user's code
    calls it by (None when the call is not a plain call of a name or attribute), the line
    that compiled it (None when the source does not show one) and the line that called it."""

    cls: str
    callee: str | None
    compiled_at: SourceLocation | None
    called_at: SourceLocation | None

    def label(self) -> str:
        """``MLP 'f' compiled at train.py:18``."""
        text = self.cls + (f" '{self.callee}'" if self.callee else "")
        if self.compiled_at is not None:
            text += f" compiled at {format_location(self.compiled_at.file, self.compiled_at.line)}"
        return text


def function_label(name: str, file: str, line: int) -> str:
    """A compiled function as the user knows it: ``step in train.py:30``; a resume function
    dynamo made after a graph break is named after the function and line it resumes."""
    m = _RESUME.match(name)
    shown = f"{m.group(1)} (after the graph break at line {m.group(2)})" if m else name
    return f"{shown} in {os.path.basename(file)}:{line}"


def compiled_name(code: tuple[str, int, str] | None, depth: int = 1) -> CompiledName | None:
    """The module dynamo is compiling a call of, if ``code`` (the compiled function's file,
    first line and name; None: not known) is that module's own: its ``forward``, a resume
    function of it, or ``OptimizedModule``'s wrapper. None when the call is no module's (a
    compiled function, even one called inside a module's forward)."""
    try:
        frame: FrameType | None = sys._getframe(depth + 1)
    except ValueError:
        return None
    nn = sys.modules.get("torch.nn")
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if nn is None:
        return None
    calls = {nn.Module._call_impl.__code__, nn.Module._wrapped_call_impl.__code__}
    optimized = getattr(eval_frame, "OptimizedModule", None)
    while frame is not None and frame.f_code not in calls:
        frame = frame.f_back
    if frame is None:
        return None
    owner = frame.f_locals.get("self")
    if optimized is not None and isinstance(owner, optimized):
        module = owner._orig_mod
    elif isinstance(owner, nn.Module) and code is not None and _owns(owner, code):
        module = owner  # compiled in place (module.compile()), or the module an OptimizedModule wraps
    else:
        return None
    user = frame.f_back
    while user is not None and not is_user_frame(user):
        user = user.f_back
    called_at = user_frame_location(user) if user is not None else None
    callee = _callee(user) if user is not None else None
    compiled_at = _compiled_at(user.f_code.co_filename, callee, called_at.line) if user is not None and callee else None
    return CompiledName(type(module).__qualname__, callee, compiled_at, called_at)


def _owns(module: object, code: tuple[str, int, str]) -> bool:
    """``code`` is ``module``'s forward (or a resume function of it), or the wrapper dynamo
    compiles for a torch.nn module."""
    file, line, name = code
    if os.path.basename(file) == _WRAPPER[0] and name == _WRAPPER[1]:
        return True
    forward = getattr(type(module).forward, "__code__", None)
    if forward is None or os.path.realpath(forward.co_filename) != os.path.realpath(file):
        return False
    m = _RESUME.match(name)
    return (m.group(1) if m else name) == forward.co_name and (m is not None or line == forward.co_firstlineno)


def _callee(frame: FrameType) -> str | None:
    """The callee expression of the call ``frame`` is making (``f``, ``self.encoder``)."""
    ins = instruction_at(frame.f_code, frame.f_lasti)
    pos = ins.positions if ins is not None else None
    if pos is None or None in (pos.lineno, pos.end_lineno, pos.col_offset, pos.end_col_offset):
        return None
    calls = _calls(frame.f_code.co_filename)
    call = calls.get((pos.lineno, pos.col_offset, pos.end_lineno, pos.end_col_offset)) if calls else None
    if call is None or not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    return ast.unparse(call.func)


_parsed: dict[str, tuple[ast.Module, dict[tuple, ast.Call]] | None] = {}


def _source(filename: str) -> ast.Module | None:
    if filename not in _parsed:
        try:
            lines = linecache.getlines(filename)
            tree = ast.parse("".join(lines)) if lines else None
        except (SyntaxError, ValueError):
            tree = None
        calls = {}
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    calls[(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)] = node
        _parsed[filename] = (tree, calls) if tree is not None else None
    found = _parsed[filename]
    return found[0] if found is not None else None


def _calls(filename: str) -> dict[tuple, ast.Call] | None:
    _source(filename)
    found = _parsed.get(filename)
    return found[1] if found is not None else None


def _compiles(node: ast.expr) -> bool:
    """``node`` is a call of ``torch.compile`` (or any ``<module>.compile``, ``tpu_debug.compile``)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "compile"
        and isinstance(node.func.value, ast.Name)
    )


def _compiled_at(filename: str, callee: str, line: int) -> SourceLocation | None:
    """The line of ``filename`` that compiled what ``callee`` names: ``callee = torch.compile(...)``
    or ``callee.compile(...)``; the last such line above ``line``, else the first below it."""
    tree = _source(filename)
    if tree is None:
        return None
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _compiles(node.value):
            if any(ast.unparse(t) == callee for t in node.targets):
                found.append((node.lineno, _function_at(tree, node.lineno)))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "compile" and ast.unparse(func.value) == callee:
                found.append((node.lineno, _function_at(tree, node.lineno)))
    if not found:
        return None
    above = [f for f in found if f[0] <= line]
    lineno, function = max(above) if above else min(found)
    return SourceLocation(filename, lineno, function)


def _function_at(tree: ast.Module, line: int) -> str:
    """The qualified name of the function holding ``line`` (``<module>`` outside every one)."""
    best: tuple[int, str] | None = None

    def visit(node: ast.AST, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if child.lineno <= line <= (child.end_lineno or 0):
                    if not isinstance(child, ast.ClassDef) and (best is None or child.lineno >= best[0]):
                        best = (child.lineno, name)
                    visit(child, name + ".")
    visit(tree, "")
    return best[1] if best is not None else "<module>"
