"""The structure docs/architecture.md describes, checked on the source: no import cycles
between modules, and no library function longer than a screen or two.

Both read the source with ``ast`` (nothing is imported), over every package that
``pyproject.toml``'s ``[tool.setuptools.package-dir]`` maps, which is what the wheel holds.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package)."""
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in roots.items():
        for source in (ROOT / folder).rglob("*.py"):
            parts = [*package.split("."), *source.relative_to(ROOT / folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (source, is_package)
    for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["py-modules"]:
        found[name] = (ROOT / f"{name}.py", False)
    return found


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: top level, and inside top-level ``if``/``try``
    (but not ``if TYPE_CHECKING:``); an import inside a function runs when the function does."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        inner = ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]
        yield from (n for n in inner if isinstance(n, (ast.Import, ast.ImportFrom)))


def _imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    # 'from pkg import sub' imports the submodule; 'from pkg import name' runs pkg/__init__.py
    subs = {f"{base}.{alias.name}" for alias in node.names}
    found = {sub for sub in subs if sub in modules}
    if len(found) < len(subs) and base in modules:
        found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules its import runs. A submodule's import also runs its
    parent package's ``__init__``; that is Python's package mechanism, not an edge here."""
    modules = _modules()
    graph = {}
    for name, (source, is_package) in modules.items():
        tree = ast.parse(source.read_text(), str(source))
        edges = set()
        for node in _module_level_imports(tree):
            edges |= _imported(name, is_package, node, modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"tpu_debug", "tpu_debug.runtime.eager", "tpu_debug.tracers.store", "tpu_debug.tui.app"} <= set(graph)
    assert "tpu_debug.runtime.eager" in graph["tpu_debug.runtime.device"]


def test_no_import_cycles_between_modules():
    found = cycles(import_graph())
    assert not found, "import cycles (move the shared part into a module both import):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_core_imports_only_the_standard_library():
    """core/ is what every layer shares: importing it must pull no device, torch, jax or layer."""
    modules = _modules()
    outside = []
    for name, (source, _) in modules.items():
        if not name.startswith("tpu_debug.core"):
            continue
        for node in _module_level_imports(ast.parse(source.read_text(), str(source))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for target in targets:
                top = target.split(".")[0]
                inside = target == "tpu_debug.core" or target.startswith("tpu_debug.core.")
                if getattr(node, "level", 0) == 0 and top not in sys.stdlib_module_names and not inside:
                    outside.append(f"{source.relative_to(ROOT)}: {target}")
    assert not outside, "core/ imports outside the standard library:\n" + "\n".join(outside)


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
    if has_docstring and len(body) > 1:
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def test_no_library_function_over_80_lines():
    """A function a reader cannot see whole is split, docstring excluded."""
    long = []
    for name, (source, _) in _modules().items():
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                long.append(f"{source.relative_to(ROOT)}:{node.lineno} {node.name} ({_body_lines(node)} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
