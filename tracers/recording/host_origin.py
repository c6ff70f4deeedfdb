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

Only what the step makes counts: a name is followed to the binding that reaches
the upload, which is the latest one above it of any kind (an assignment, a ``for``
target, a ``with ... as``, a parameter), and when the upload sits in a loop that
binding must be inside the same loop. A tensor made once before the loop (a
synthetic dataset drawn with ``torch.randint`` at start-up) and a name rebound by
the loop (``for ids, labels in loader:``) are data, never made here.

:class:`HostOrigin` also says what the host-made tensor goes with when the code
shows it: ``follows`` is the tensor whose shape or device it takes
(``torch.randn(x.shape).to(x.device)`` follows ``x``), the mark of noise, masks and
timesteps made for a tensor already on the device, as opposed to a stand-in for a
batch of data.

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
from typing import Any, NamedTuple

__all__ = ["FACTORIES", "HostOrigin", "upload_origin"]


class HostOrigin(NamedTuple):
    """What made an uploaded tensor on the host: the ``factory`` (``"torch.randn"``), the
    tensor it ``follows`` when its shape or device is read from one (``"x_start"``), else None,
    and the ``line`` that made it (the upload's own, or the assignment its name was followed to)."""

    factory: str
    follows: str | None = None
    line: int | None = None


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
# by (file, code, instruction): code objects compare equal across files, and the verdict
# reads the code's own file
_verdicts: dict[tuple[str, CodeType, int], HostOrigin | None] = {}
# a binding of a name that gives no value the code shows (a loop target, a parameter, an
# unpacked call's result): the name is rebound there, and what it holds is not read
_OPAQUE = ast.Constant(value=None)


def upload_origin(code: CodeType, lasti: int, positions: Any) -> HostOrigin | None:
    """What made the tensor the user's code ``code`` is uploading at instruction ``lasti`` (a
    frame's ``f_lasti``; ``positions``: that instruction's source span, from ``dis``), e.g.
    ``HostOrigin("torch.randn", "x")``; None when the code does not show a factory in the step
    (see the module docstring)."""
    key = (code.co_filename, code, lasti)
    if key not in _verdicts:
        try:
            _verdicts[key] = _origin(code.co_filename, positions)
        except Exception:  # noqa: BLE001 - unreadable source or an unexpected tree: no verdict
            _verdicts[key] = None
    return _verdicts[key]


def _origin(filename: str, pos: Any) -> HostOrigin | None:
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
    scope = _scope(tree, pos.lineno)
    loop = _loop(scope, pos.lineno)
    made = _made(moved, scope, pos.lineno, _DEPTH, loop)
    if made is None:
        return None
    follows = _device_of(call) or _shape_source(moved, scope, pos.lineno, _DEPTH)  # type: ignore[arg-type]
    return HostOrigin(made, follows, _made_at(moved, scope, pos.lineno, _DEPTH))


def _made_at(expr: ast.expr, scope: ast.AST, line: int, depth: int) -> int | None:
    """The line that made ``expr``'s value: a name followed to the assignment it was made by,
    as :func:`_made` follows it; the expression's own line otherwise."""
    while isinstance(expr, ast.Name) and depth > 0:
        value = _assigned(scope, expr.id, line)
        if value is None or value[0] is _OPAQUE:
            return None
        expr, line, depth = value[0], value[1], depth - 1
    return getattr(expr, "lineno", line)


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


def _loop(scope: ast.AST, line: int) -> ast.AST | None:
    """The innermost ``for`` or ``while`` loop of ``scope`` whose body holds ``line``."""
    found = None
    for node in _walk_scope(scope):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.body:
            if node.body[0].lineno <= line <= (node.end_lineno or 0):
                if found is None or node.lineno >= found.lineno:  # type: ignore[attr-defined]
                    found = node
    return found


def _within(node: ast.AST, loop: ast.AST | None) -> bool:
    """``node`` (a binding) runs at every iteration of ``loop`` (None: no loop to be in)."""
    if loop is None:
        return True
    first = loop.body[0].lineno  # type: ignore[attr-defined]
    return first <= node.lineno <= (loop.end_lineno or 0)  # type: ignore[attr-defined]


def _made(expr: ast.expr, scope: ast.AST, line: int, depth: int, loop: ast.AST | None = None) -> str | None:
    """The factory that made ``expr``'s value on the host, or None. ``loop``: the loop the upload
    runs in, which the first binding followed must be inside (made at every step, not before)."""
    if isinstance(expr, ast.Call):
        return _made_by_call(expr, scope, line, depth)
    if isinstance(expr, ast.Name) and depth > 0:
        value = _assigned(scope, expr.id, line)
        if value is None or value[0] is _OPAQUE or not _within(value[2], loop):
            return None
        return _made(value[0], scope, value[1], depth - 1)
    if isinstance(expr, ast.Compare):
        # a mask: a draw compared with thresholds, which may be names of numbers (a parameter p)
        made = _made(expr.left, scope, line, depth, loop)
        known = [_made(c, scope, line, depth, loop) for c in expr.comparators if _known(c, scope, line)]
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
        made = _made(operand, scope, line, depth, loop)
        if made is None:
            return None  # host data mixed with data from elsewhere: not made here alone
        found = found or made
    return found


def _known(expr: ast.expr, scope: ast.AST, line: int) -> bool:
    """Whether ``expr`` is more than a constant or a name this function never assigns (a
    parameter, a global): a value the code shows."""
    if isinstance(expr, ast.Constant):
        return False
    if not isinstance(expr, ast.Name):
        return True
    value = _assigned(scope, expr.id, line)
    return value is not None and value[0] is not _OPAQUE


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


def _walk_scope(scope: ast.AST):
    """The nodes of ``scope``, not those of the functions and classes defined inside it (their
    names are their own)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _assigned(scope: ast.AST, name: str, line: int) -> tuple[ast.expr, int, ast.AST] | None:
    """The value of the binding of ``name`` that reaches ``line`` in ``scope``: the latest above
    it (its value, its line and the binding statement). A binding whose value the code does
    not show (a loop target, a parameter, an unpacked call) gives :data:`_OPAQUE`."""
    best: tuple[ast.expr, int, ast.AST] | None = None
    for node in _walk_scope(scope):
        # a comprehension's own variable (``{k: v.to(dev) for k, v in batch.items()}``)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            if node.lineno <= line <= (node.end_lineno or 0) and any(_binds(g.target, name) for g in node.generators):
                return (_OPAQUE, line, node)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = scope.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        if any(a is not None and a.arg == name for a in params):
            best = (_OPAQUE, scope.lineno, scope)
    for node in _walk_scope(scope):
        lineno = getattr(node, "lineno", None)
        if lineno is None or lineno >= line or (best is not None and lineno < best[1]):
            continue
        value = _binding(node, name)
        if value is not None:
            best = (value, lineno, node)
    return best


def _binding(node: ast.AST, name: str) -> ast.expr | None:
    """What ``node`` binds ``name`` to: its value, :data:`_OPAQUE` for a value the code does
    not show, None when it does not bind ``name``."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            value = _value_for(target, node.value, name)
            if value is not None:
                return value
        return None
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        if isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value if isinstance(node, ast.AnnAssign) and node.value is not None else _OPAQUE
        return None
    if isinstance(node, ast.NamedExpr):
        return node.value if node.target.id == name else None
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _OPAQUE if _binds(node.target, name) else None
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return _OPAQUE if any(i.optional_vars is not None and _binds(i.optional_vars, name) for i in node.items) else None
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _OPAQUE if any((a.asname or a.name).split(".")[0] == name for a in node.names) else None
    return None


def _binds(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _value_for(target: ast.expr, value: ast.expr, name: str) -> ast.expr | None:
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                found = _value_for(t, v, name)
                if found is not None:
                    return found
            return None
        return _OPAQUE if _binds(target, name) else None  # unpacked from a value the code does not show
    return None


def _device_of(call: ast.Call) -> str | None:
    """The tensor whose device a move names: ``x`` of ``.to(x.device)``, ``.to(device=x.device)``."""
    for arg in [*call.args[:1], *(k.value for k in call.keywords if k.arg == "device")]:
        if isinstance(arg, ast.Attribute) and arg.attr == "device":
            return _dotted(arg.value)
    return None


def _shape_source(expr: ast.expr, scope: ast.AST, line: int, depth: int) -> str | None:
    """The tensor whose shape the factory making ``expr`` reads (``x`` of ``torch.randn(x.shape)``,
    ``torch.randint(0, T, (x.shape[0],))``, ``torch.rand(x.size(0))``), following names as
    :func:`_made` does; None when its sizes come from elsewhere."""
    if isinstance(expr, ast.Name) and depth > 0:
        value = _assigned(scope, expr.id, line)
        if value is None or value[0] is _OPAQUE:
            return None
        return _shape_source(value[0], scope, value[1], depth - 1)
    if isinstance(expr, ast.Call):
        name = _dotted(expr.func) or ""
        head, _, last = name.rpartition(".")
        if head and head.split(".")[0] in _MODULES and last in FACTORIES:
            for arg in [*expr.args, *(k.value for k in expr.keywords if k.arg in ("size", "shape"))]:
                for node in ast.walk(arg):
                    if isinstance(node, ast.Attribute) and node.attr == "shape":
                        return _dotted(node.value)
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "size"):
                        return _dotted(node.func.value)
            return None
        if isinstance(expr.func, ast.Attribute):
            return _shape_source(expr.func.value, scope, line, depth)
    if isinstance(expr, ast.BinOp):
        return _shape_source(expr.left, scope, line, depth) or _shape_source(expr.right, scope, line, depth)
    if isinstance(expr, ast.UnaryOp):
        return _shape_source(expr.operand, scope, line, depth)
    if isinstance(expr, ast.Compare):
        return _shape_source(expr.left, scope, line, depth)
    return None
