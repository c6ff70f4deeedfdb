"""Where an uploaded tensor came from: drawn or built on the host by a factory, read from the user's code.

A host-to-device copy carries no history: PyTorch keeps no record of the
function that made a CPU tensor (a factory's result is a leaf with no
``grad_fn``), and the runtime sees only its bytes. The user's line does say it:
``torch.randn(16, 32).to("tpu")`` uploads a random draw made on the host, and so
does ``noise.to("tpu")`` two lines after ``noise = torch.randn(16, 32)``. Such
data could be made on the device instead (``torch.randn(..., device="tpu")``,
``torch.randn_like(x)``), which copies nothing.

:func:`upload_origin` reads it at the moment of the copy, from the user frame's
current call: the ``ast.Call`` whose source span is the call instruction's
(``.to(...)``, ``.copy_(src)``, ``torch.tensor(...)``), the expression it
moves, and, for a plain name, the latest assignment to that name above the line
in the same function. The expression is host-made when it is a call of a
factory of :data:`FACTORIES` (PyTorch's or NumPy's random draws, ``arange``,
``ones``, ``full``, ...), or a method chain, arithmetic or comparison whose
tensor operands are all host-made (``torch.rand(n) < p``, a mask;
``0.1 * torch.randn(n)``).

Limits: it is a reading of the source, not of the program's values. A tensor
made in another function (a helper that returns ``torch.randn(...)``), kept in
an attribute or a container, or assigned in a branch the program did not take
is read as the code says, or not at all; slices of host data (``data[i]``, a
batch of a dataset made before the loop) are never host-made here. A file whose
source cannot be read gives no verdict. Verdicts are cached per code object and
instruction, so a line uploading at every step is read once.
"""

from __future__ import annotations

import ast
import linecache
from types import CodeType
from typing import Any

__all__ = ["FACTORIES", "upload_origin"]

# functions that make a tensor or an array from nothing but their arguments, by the last
# part of their name, under the modules that hold them
FACTORIES = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
    "bernoulli", "multinomial", "poisson", "uniform", "choice", "permutation", "random", "integers",
    "standard_normal", "arange", "linspace", "logspace", "ones", "zeros", "full", "eye", "empty",
    "ones_like", "zeros_like", "full_like", "empty_like", "tril_indices", "triu_indices",
})
_MODULES = frozenset({"torch", "np", "numpy", "random", "rng", "generator"})
# calls that make a tensor of their first argument's values: host-made when it is
_WRAPPERS = frozenset({"from_numpy", "as_tensor", "tensor", "tril", "triu", "asarray", "array"})
# what moves data to the device, by the callee's name, and which operand it moves
_MOVES = {"to": "receiver", "cuda": "receiver", "tpu": "receiver", "copy_": "argument"}
_DEPTH = 4  # names followed back through assignments

_trees: dict[str, tuple[ast.Module, dict[tuple, ast.Call]] | None] = {}
_verdicts: dict[tuple[CodeType, int], str | None] = {}


def upload_origin(code: CodeType, lasti: int, positions: Any) -> str | None:
    """The factory that made the tensor the user's code ``code`` is uploading at instruction
    ``lasti`` (a frame's ``f_lasti``; ``positions``: that instruction's source span, from
    ``dis``), e.g. ``"torch.randn"``; None when the code does not show one (see the module
    docstring)."""
    key = (code, lasti)
    if key not in _verdicts:
        try:
            _verdicts[key] = _origin(code.co_filename, positions)
        except Exception:  # noqa: BLE001 - unreadable source or an unexpected tree: no verdict
            _verdicts[key] = None
    return _verdicts[key]


def _origin(filename: str, pos: Any) -> str | None:
    if pos is None or None in (pos.lineno, pos.end_lineno, pos.col_offset, pos.end_col_offset):
        return None
    parsed = _tree(filename)
    if parsed is None:
        return None
    tree, calls = parsed
    call = calls.get((pos.lineno, pos.col_offset, pos.end_lineno, pos.end_col_offset))
    moved = _moved(call) if call is not None else None
    if moved is None:
        return None
    return _made(moved, _scope(tree, pos.lineno), pos.lineno, _DEPTH)


def _tree(filename: str) -> tuple[ast.Module, dict[tuple, ast.Call]] | None:
    if filename not in _trees:
        lines = linecache.getlines(filename)
        tree = ast.parse("".join(lines)) if lines else None
        calls = {}
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    calls[(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)] = node
        _trees[filename] = (tree, calls) if tree is not None else None
    return _trees[filename]


def _moved(call: ast.Call) -> ast.expr | None:
    """The expression a call copies to the device: ``x`` of ``x.to(...)`` and
    ``dst.copy_(x)``, the data of ``torch.tensor(x, device=...)``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    which = _MOVES.get(name or "")
    if which == "receiver" and isinstance(func, ast.Attribute):
        return func.value
    if which == "argument" and call.args:
        return call.args[0]
    if name in ("tensor", "as_tensor") and call.args:
        return call.args[0]
    return None


def _scope(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function holding ``line`` (the module outside every function)."""
    found: ast.AST = tree
    for node in ast.walk(tree):
        inside = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0)
        if inside and (found is tree or node.lineno >= found.lineno):  # type: ignore[attr-defined]
            found = node
    return found


def _dotted(expr: ast.expr) -> str | None:
    """``torch.randn`` for the callee ``torch.randn``; None for a callee that is no dotted name."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _made(expr: ast.expr, scope: ast.AST, line: int, depth: int) -> str | None:
    """The factory that made ``expr``'s value on the host, or None."""
    if isinstance(expr, ast.Call):
        return _made_by_call(expr, scope, line, depth)
    if isinstance(expr, ast.Name) and depth > 0:
        value = _assigned(scope, expr.id, line)
        return _made(value[0], scope, value[1], depth - 1) if value is not None else None
    if isinstance(expr, ast.Compare):
        # a mask: a draw compared with thresholds, which may be names of numbers (a parameter p)
        made = _made(expr.left, scope, line, depth)
        known = [_made(c, scope, line, depth) for c in expr.comparators if _known(c, scope, line)]
        return made if made is not None and all(k is not None for k in known) else None
    operands: list[ast.expr] = []
    if isinstance(expr, ast.BinOp):
        operands = [expr.left, expr.right]
    elif isinstance(expr, ast.UnaryOp):
        operands = [expr.operand]
    found = None
    for operand in operands:
        if isinstance(operand, ast.Constant):
            continue
        made = _made(operand, scope, line, depth)
        if made is None:
            return None  # host data mixed with data from elsewhere: not made here alone
        found = found or made
    return found


def _known(expr: ast.expr, scope: ast.AST, line: int) -> bool:
    """Whether ``expr`` is more than a constant or a name this function never assigns (a
    parameter, a global): a value the code shows."""
    if isinstance(expr, ast.Constant):
        return False
    return not isinstance(expr, ast.Name) or _assigned(scope, expr.id, line) is not None


def _made_by_call(call: ast.Call, scope: ast.AST, line: int, depth: int) -> str | None:
    name = _dotted(call.func)
    head, _, last = (name or "").rpartition(".")
    if head and head.split(".")[0] in _MODULES:  # a library's function: torch.randn, np.random.rand
        if last in FACTORIES and not _on_device(call):
            return name
        if last in _WRAPPERS and call.args:
            return _made(call.args[0], scope, line, depth)
        return None
    if isinstance(call.func, ast.Attribute):
        # a method of a value: torch.randn(n).float(), noise.unsqueeze(0), torch.rand(n).lt(p)
        return _made(call.func.value, scope, line, depth)
    return None


def _on_device(call: ast.Call) -> bool:
    """A factory call told to make its tensor on a device other than the CPU."""
    for kw in call.keywords:
        if kw.arg == "device":
            value = kw.value
            return not (isinstance(value, ast.Constant) and value.value in ("cpu", None))
    return False


def _assigned(scope: ast.AST, name: str, line: int) -> tuple[ast.expr, int] | None:
    """The value last assigned to ``name`` above ``line`` in ``scope`` (and its line)."""
    best: tuple[ast.expr, int] | None = None
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign) or node.lineno >= line:
            continue
        for target in node.targets:
            value = _value_for(target, node.value, name)
            if value is not None and (best is None or node.lineno >= best[1]):
                best = (value, node.lineno)
    return best


def _value_for(target: ast.expr, value: ast.expr, name: str) -> ast.expr | None:
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            if isinstance(t, ast.Name) and t.id == name:
                return v
    return None
