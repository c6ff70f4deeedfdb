"""The structure docs/architecture.md describes, checked on the source: the layers import only
downward, no import cycles between modules, no private name taken from another package, and no
library function longer than a screen or two.

Every import counts: at module level, inside functions (deferred, run when the function is) and
under ``if TYPE_CHECKING:``; a deferred import still ties the importer to what it imports. All of
it reads the source with ``ast`` (nothing is imported), over every package that ``pyproject.toml``'s
``[tool.setuptools.package-dir]`` maps, which is what the wheel holds.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# The layers, lowest first: a module imports only from its own layer or one below. A module
# belongs to the layer of the longest prefix naming it. docs/architecture.md quotes this table
# (test_the_doc_quotes_the_layer_order).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("tpu_debug.core",)),
    ("runtime", ("tpu_debug.runtime",)),
    ("tracers", ("tpu_debug.tracers",)),
    ("face", ("tpu_debug", "tpu_debug.fit")),
    ("tui", ("tpu_debug.tui",)),
    ("entry points", ("tpu_debug.cli", "tpu_debug.__main__", "tpu_debug.pytest_plugin")),
)

@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement between two of our modules."""

    importer: str
    target: str
    line: int
    names: tuple[str, ...]  # the names a ``from`` import takes; () for ``import x``
    deferred: bool  # inside a function or under ``if TYPE_CHECKING:``


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> ast.Module:
    """A source's tree, parsed once for all the checks that read it (none changes a tree)."""
    return ast.parse(text)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package)."""
    found = {}
    for package, folder in _PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        for source in (ROOT / folder).rglob("*.py"):
            parts = [*package.split("."), *source.relative_to(ROOT / folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (source, is_package)
    return found


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: top level, and inside top-level ``if``/``try``
    (but not ``if TYPE_CHECKING:``); an import inside a function runs when the function does."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        inner = ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]
        yield from (n for n in inner if isinstance(n, (ast.Import, ast.ImportFrom)))


def _imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: Mapping) -> set[str]:
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


def scan(sources: Mapping[str, tuple[str, bool]]) -> list[Import]:
    """Every import between the modules of ``sources`` (module name -> (source text, is a
    package)), module-level and deferred alike."""
    found = []
    for name, (text, is_package) in sources.items():
        tree = _parse(text)
        at_import = {id(node) for node in _module_level_imports(tree)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = tuple(a.name for a in node.names) if isinstance(node, ast.ImportFrom) else ()
            for target in sorted(_imported(name, is_package, node, sources) - {name}):
                found.append(Import(name, target, node.lineno, names, id(node) not in at_import))
    return found


def _project_imports() -> list[Import]:
    return scan({name: (source.read_text(), is_package) for name, (source, is_package) in _modules().items()})


def import_graph(imports: list[Import] | None = None, *, deferred: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports (with ``deferred``, also those imported inside
    functions). A submodule's import also runs its parent package's ``__init__``; that is
    Python's package mechanism, not an edge here."""
    project = imports is None
    imports = _project_imports() if imports is None else imports
    graph: dict[str, set[str]] = {name: set() for name in _modules()} if project else {}
    for imp in imports:
        graph.setdefault(imp.importer, set())
        graph.setdefault(imp.target, set())
        if deferred or not imp.deferred:
            graph[imp.importer].add(imp.target)
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to."""
    best, index = "", -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def upward_imports(imports: list[Import]) -> list[Import]:
    """Imports from a higher layer than the importer's."""
    return [imp for imp in imports if layer_of(imp.target) > layer_of(imp.importer)]


def package_of(module: str) -> str:
    """The distribution's package (a ``package-dir`` key) holding ``module``."""
    roots = _PYPROJECT["tool"]["setuptools"]["package-dir"]
    return max((r for r in roots if module == r or module.startswith(r + ".")), key=len, default=module)


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_imports(imports: list[Import]) -> list[Import]:
    """Imports that take a private name (``_x``, or a module under a ``_x`` path) from another
    package: what another package uses is part of its public surface and is spelled so."""
    found = []
    for imp in imports:
        home = package_of(imp.target)
        if home == package_of(imp.importer):
            continue
        path = imp.target.removeprefix(home).split(".")
        if any(map(_private, path)) or any(map(_private, imp.names)):
            found.append(imp)
    return found


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


def _show(imports: list[Import]) -> str:
    return "\n".join(
        f"{i.importer}:{i.line} -> {i.target} {', '.join(i.names)}{' (deferred)' if i.deferred else ''}"
        for i in imports
    )


# a core module that imports a tracer inside a function, the tracer importing it back, a
# TYPE_CHECKING import from the runtime up to a tracer, a tracer taking the runtime's private name
_PLANTED = {
    "tpu_debug.core.a": ("def f():\n    from tpu_debug.tracers.b import g\n", False),
    "tpu_debug.tracers.b": ("from tpu_debug.core.a import f\n\ndef g():\n    pass\n", False),
    "tpu_debug.tracers.c": ("def h():\n    from tpu_debug.runtime.d import _helper\n", False),
    "tpu_debug.runtime.d": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..tracers import c\n",
        False,
    ),
    "tpu_debug.runtime.e": ("from tpu_debug.runtime.d import _helper\n", False),
    "tpu_debug.runtime": ("from tpu_debug.runtime import e\n", True),
}


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_checkers_find_planted_deferred_faults():
    imports = scan(_PLANTED)
    assert {(i.importer, i.target) for i in upward_imports(imports)} == {
        ("tpu_debug.core.a", "tpu_debug.tracers.b"),
        ("tpu_debug.runtime.d", "tpu_debug.tracers.c"),
    }
    assert all(i.deferred for i in upward_imports(imports))
    graph = import_graph(imports)
    assert sorted(cycles(graph)) == [
        ["tpu_debug.core.a", "tpu_debug.tracers.b"],
        ["tpu_debug.runtime.d", "tpu_debug.tracers.c"],
    ]
    assert cycles(import_graph(imports, deferred=False)) == []
    # the runtime's own module may take the runtime's private name; a tracer may not
    taken = [(i.importer, i.names) for i in private_imports(imports)]
    assert taken == [("tpu_debug.tracers.c", ("_helper",))]


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"tpu_debug", "tpu_debug.runtime.eager", "tpu_debug.tracers.store", "tpu_debug.tui.app"} <= set(graph)
    assert "tpu_debug.runtime.eager" in graph["tpu_debug.runtime.device"]
    assert sum(i.deferred for i in _project_imports()) > 0


def test_layers_import_downward():
    found = list(upward_imports(_project_imports()))
    order = " < ".join(name for name, _ in LAYERS)
    assert not found, (
        f"imports against the layer order {order} (move the shared part down a layer, or pass a "
        "callable in):\n" + _show(found)
    )


def _import_loops(graph: dict[str, set[str]]) -> list[str]:
    """What :func:`test_no_import_loops` reports: one line per loop."""
    return [" <-> ".join(component) for component in cycles(graph)]


def test_no_import_loops():
    found = _import_loops(import_graph())
    assert not found, (
        "import loops, deferred imports included (move the shared part into a module both import, "
        "or pass a callable in):\n" + "\n".join(found)
    )


def test_the_loop_check_fails_on_a_planted_loop():
    """A loop planted in the project's own graph through a deferred import (the probes calling
    into memory tracking, which imports them) is reported: no list lets it through."""
    sources = {name: (source.read_text(), is_package) for name, (source, is_package) in _modules().items()}
    probes_text, _ = sources["tpu_debug.runtime.probes"]
    sources["tpu_debug.runtime.probes"] = (
        probes_text + "\n\ndef _planted():\n    from tpu_debug.runtime import memory_ledger\n", False
    )
    assert _import_loops(import_graph(scan(sources))) == ["tpu_debug.runtime.memory_ledger <-> tpu_debug.runtime.probes"]


def test_no_private_names_across_packages():
    found = list(private_imports(_project_imports()))
    assert not found, "private names taken from another package (give them a public spelling):\n" + (
        _show(found)
    )


def test_the_doc_quotes_the_layer_order():
    rows = "\n".join(f"| {name} | {', '.join(f'`{p}`' for p in prefixes)} |" for name, prefixes in LAYERS)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert rows in doc, f"docs/architecture.md should hold the layer table, lowest first:\n{rows}"


def test_core_imports_only_the_standard_library():
    """core/ is what every layer shares: importing it, or calling it, pulls no device, torch, jax or layer."""
    outside = []
    for name, (source, _) in _modules().items():
        if not name.startswith("tpu_debug.core"):
            continue
        for node in ast.walk(_parse(source.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for target in targets:
                inside = target == "tpu_debug.core" or target.startswith("tpu_debug.core.")
                if target.split(".")[0] not in sys.stdlib_module_names and not inside:
                    outside.append(f"{source.relative_to(ROOT)}:{node.lineno}: {target}")
    assert not outside, "core/ imports outside the standard library:\n" + "\n".join(outside)


def probe_records(probes_text: str) -> dict[str, str]:
    """Each :class:`~tpu_debug.runtime.probes.Probe` method that takes an ``info`` record ->
    the record's type, as ``runtime/probes.py`` declares it (``on_compile`` -> ``CompileInfo``)."""
    probe = next(n for n in ast.parse(probes_text).body if isinstance(n, ast.ClassDef) and n.name == "Probe")
    return {
        method.name: ast.unparse(arg.annotation)
        for method in probe.body
        if isinstance(method, ast.FunctionDef)
        for arg in method.args.args
        if arg.arg == "info" and arg.annotation is not None
    }


def untyped_callbacks(sources: Mapping[str, tuple[str, bool]], records: Mapping[str, str]) -> list[str]:
    """Methods named as a probe callback whose ``info`` is not annotated with that callback's
    record (``Any``, another type, or nothing): the runtime-tracer boundary is typed."""
    found = []
    for name, (text, _) in sources.items():
        for cls in (n for n in ast.walk(_parse(text)) if isinstance(n, ast.ClassDef)):
            for method in cls.body:
                if not isinstance(method, ast.FunctionDef) or method.name not in records:
                    continue
                for arg in method.args.args:
                    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if arg.arg == "info" and annotation.rsplit(".", 1)[-1] != records[method.name]:
                        found.append(f"{name}:{method.lineno} {cls.name}.{method.name}(info: {annotation or '?'}), "
                                     f"not {records[method.name]}")
    return found


def test_probe_callbacks_take_the_typed_records():
    modules = _modules()
    records = probe_records(modules["tpu_debug.runtime.probes"][0].read_text())
    assert {"on_compile", "on_transfer", "on_alloc", "on_collective_desync"} <= set(records)
    found = untyped_callbacks({name: (src.read_text(), pkg) for name, (src, pkg) in modules.items()}, records)
    assert not found, "probe callbacks not taking their record from runtime/probes.py:\n" + "\n".join(found)


def test_the_callback_check_finds_a_planted_any():
    records = {"on_alloc": "AllocInfo", "on_free": "FreeInfo"}
    planted = {
        "tpu_debug.tracers.x": (
            (
                "from typing import Any\n"
                "from tpu_debug.runtime import probes\n"
                "class T:\n"
                "    def on_alloc(self, info: Any) -> None: ...\n"
                "    def on_free(self, info: probes.FreeInfo) -> None: ...\n"
            ),
            False,
        )
    }
    assert untyped_callbacks(planted, records) == ["tpu_debug.tracers.x:4 T.on_alloc(info: Any), not AllocInfo"]


def lazy_names(text: str) -> set[str]:
    """The names a package's ``lazy_exports(globals(), {module: names})`` call hands out lazily."""
    names = set()
    for call in ast.walk(_parse(text)):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "lazy_exports":
            for names_of_module in call.args[1].values:
                names |= {element.value for element in names_of_module.elts}
    return names


def test_no_lazy_name_is_a_submodule():
    """A package's lazily exported name that is also one of its submodules' names would become
    the module once anything imports that submodule (Python binds a submodule on its package),
    so such a name is imported eagerly instead."""
    modules = _modules()
    clashes = [
        f"{name}.{attribute}"
        for name, (source, is_package) in modules.items()
        if is_package
        for attribute in lazy_names(source.read_text())
        if f"{name}.{attribute}" in modules
    ]
    assert any(lazy_names(source.read_text()) for source, _ in modules.values())
    assert not clashes, "lazy names that are submodules too (import them eagerly):\n" + "\n".join(clashes)


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
        for node in ast.walk(_parse(source.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                long.append(f"{source.relative_to(ROOT)}:{node.lineno} {name} ({_body_lines(node)} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_the_doc_maps_every_module():
    """docs/architecture.md's module map names every module of the wheel by its path, so a new
    module is placed on the map when it is added."""
    doc = (ROOT / "docs" / "architecture.md").read_text().split("## Module map", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        str(source.relative_to(ROOT))
        for name, (source, _) in _modules().items()
        if name.count(".") >= 1 and f"`{source.relative_to(ROOT)}`" not in doc
    )
    assert not missing, "modules missing from docs/architecture.md's module map:\n" + "\n".join(missing)


# -- recording and reading ----------------------------------------------------------------------

# What reads a recorded run (queries, analyses, the advisor, the report, the TUI, diff, the
# session and the run listings) and what both directions share: none of them may reach the
# recording side, by any import (deferred ones too), directly or through another module, so a
# reader never pays for a probe and a probe's imports never hide behind a function.
READERS = (
    "tpu_debug.tracers.reading",
    "tpu_debug.tracers.advisor",
    "tpu_debug.report",
    "tpu_debug.tui",
    "tpu_debug.diff",
    "tpu_debug.session",
    "tpu_debug.runs",
    "tpu_debug.ranks",
)
SHARED = tuple(
    f"tpu_debug.tracers.{name}"
    for name in ("events", "store", "hlo", "location", "liveness", "xplane", "collective_journal")
)
RECORDING = "tpu_debug.tracers.recording"


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def recording_reached(graph: Mapping[str, set[str]]) -> list[str]:
    """For each reader or shared module that reaches a recording module, the chain of imports
    that gets there (``reader -> ... -> recording module``)."""
    found = []
    for start in sorted(m for m in graph if _under(m, READERS + SHARED)):
        came_from: dict[str, str | None] = {start: None}
        queue = [start]
        while queue:
            module = queue.pop(0)
            if _under(module, (RECORDING,)):
                chain = [module]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])  # type: ignore[arg-type]
                found.append(" -> ".join(reversed(chain)))
                break
            for target in sorted(graph.get(module, ())):
                if target not in came_from:
                    came_from[target] = module
                    queue.append(target)
    return found


def test_readers_never_reach_the_recording_side():
    found = recording_reached(import_graph())
    assert not found, (
        "readers (or what both sides share) that reach the recording side: move what they need to "
        "tracers/reading/ (an analysis of recorded events) or to a shared module:\n" + "\n".join(found)
    )


def test_the_direction_check_fails_on_a_planted_reader():
    """A report section that imports the recorder inside a function, and an analysis that reaches
    the step tracker through a shared module, are both found."""
    planted = {
        "tpu_debug.report.planted": ("def data(run):\n    from tpu_debug.tracers.recording.recorder import Recorder\n", False),
        "tpu_debug.tracers.recording.recorder": ("class Recorder: ...\n", False),
        "tpu_debug.tracers.reading.planted": ("from tpu_debug.tracers.events import X\n", False),
        "tpu_debug.tracers.events": ("from tpu_debug.tracers.recording.step_tracker import StepTracker\nX = 1\n", False),
        "tpu_debug.tracers.recording.step_tracker": ("class StepTracker: ...\n", False),
    }
    assert recording_reached(import_graph(scan(planted))) == [
        "tpu_debug.report.planted -> tpu_debug.tracers.recording.recorder",
        "tpu_debug.tracers.events -> tpu_debug.tracers.recording.step_tracker",
        "tpu_debug.tracers.reading.planted -> tpu_debug.tracers.events -> tpu_debug.tracers.recording.step_tracker",
    ]


# -- typed records and runs -----------------------------------------------------------------------

# a parameter of one of these names is a runtime record (``info``) or a recorded run: it carries
# its type (the record, ``RunView``, ``Session``), never ``Any`` and never nothing
TYPED_PARAMETERS = ("info", "session")


def untyped_parameters(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Parameters named in :data:`TYPED_PARAMETERS` that are annotated ``Any`` or not at all
    (``self`` and ``cls`` aside), as ``module:line function(name: annotation)``."""
    found = []
    for name, (text, _) in sources.items():
        for node in ast.walk(_parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                if arg.arg not in TYPED_PARAMETERS:
                    continue
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if annotation in ("", "Any", "typing.Any", "'Any'"):
                    found.append(f"{name}:{node.lineno} {node.name}({arg.arg}: {annotation or '?'})")
    return found


def test_records_and_runs_are_typed_parameters():
    sources = {name: (src.read_text(), pkg) for name, (src, pkg) in _modules().items()}
    found = untyped_parameters(sources)
    assert not found, (
        "parameters that take a runtime record or a run as Any (name the record, or RunView):\n" + "\n".join(found)
    )


def test_the_typed_parameter_check_finds_a_planted_any():
    planted = {
        "tpu_debug.tracers.recording.x": (
            "from typing import Any\n"
            "from tpu_debug.core.records import TransferInfo\n"
            "def _site(info: Any) -> None: ...\n"
            "def _kept(info: TransferInfo) -> None: ...\n"
            "def rows(session, *, limit: int = 3): ...\n",
            False,
        )
    }
    assert untyped_parameters(planted) == [
        "tpu_debug.tracers.recording.x:3 _site(info: Any)",
        "tpu_debug.tracers.recording.x:5 rows(session: ?)",
    ]


# -- deferred imports ---------------------------------------------------------------------------

#: the most imports between our modules that may run inside a function (or under TYPE_CHECKING)
DEFERRED_MAX = 40
#: why an import may wait for the function that uses it; the comment ``# deferred: <reason>: <why>``
#: on the import's first line (or the line above it) names one of these
DEFERRED_REASONS = {
    "heavy": "the target loads torch or jax and the importer must not (the reading side, "
    "`import tpu_debug`, the light part of the runtime, a command that may not need it)",
    "optional": "the target needs what torch or the machine may lack (torch.distributed, libtpu)",
    "autoload": "it runs while torch's backend autoload is importing torch",
    "entry": "an entry point imports its command's module only when that command runs",
}
_REASON = re.compile(r"#\s*deferred:\s*(\w+)")
_HEAVY_LIBRARIES = ("torch", "jax", "jaxlib", "libtpu")


def lazy_targets(text: str) -> dict[str, str]:
    """A package's lazily exported names -> the module that holds each (``lazy_exports``)."""
    out = {}
    for call in ast.walk(_parse(text)):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "lazy_exports":
            for module, names in zip(call.args[1].keys, call.args[1].values):
                out.update({element.value: module.value for element in names.elts})
    return out


def heavy_modules(sources: Mapping[str, tuple[str, bool]]) -> set[str]:
    """Our modules whose import loads torch, jax or libtpu, itself or through a module it imports
    at module level."""
    direct = set()
    for name, (text, is_package) in sources.items():
        tree = _parse(text)
        for node in _module_level_imports(tree):
            roots = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if not getattr(node, "level", 0) and any(r.split(".")[0] in _HEAVY_LIBRARIES for r in roots):
                direct.add(name)
    edges: dict[str, set[str]] = {name: set() for name in sources}
    for imp in scan(sources):
        if not imp.deferred:
            edges[imp.importer].add(imp.target)
    heavy = set(direct)
    changed = True
    while changed:
        changed = False
        for name, targets in edges.items():
            if name not in heavy and targets & heavy:
                heavy.add(name)
                changed = True
    return heavy


def deferred_imports(sources: Mapping[str, tuple[str, bool]]) -> list[tuple[Import, str | None]]:
    """Every deferred import between our modules with the reason its comment names (None: none)."""
    out = []
    for imp in (i for i in scan(sources) if i.deferred):
        lines = sources[imp.importer][0].splitlines()
        here = lines[imp.line - 1] if imp.line <= len(lines) else ""
        above = lines[imp.line - 2] if imp.line >= 2 else ""
        found = _REASON.search(here) or (_REASON.search(above) if above.lstrip().startswith("#") else None)
        out.append((imp, found.group(1) if found else None))
    return out


def unjustified_deferred(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Deferred imports with no reason, an unknown reason, or "heavy" for a module whose import
    loads neither torch nor jax (a package's lazily exported name counts as the module holding it)."""
    heavy = heavy_modules(sources)
    lazy = {name: lazy_targets(text) for name, (text, is_package) in sources.items() if is_package}
    found = []
    for imp, reason in deferred_imports(sources):
        where = f"{imp.importer}:{imp.line} -> {imp.target}"
        if reason is None:
            found.append(f"{where}: no '# deferred: <reason>' comment")
        elif reason not in DEFERRED_REASONS:
            found.append(f"{where}: unknown reason {reason!r} (one of {', '.join(DEFERRED_REASONS)})")
        elif reason == "heavy":
            held = {lazy.get(imp.target, {}).get(n, imp.target) for n in imp.names} or {imp.target}
            if not held & heavy:
                found.append(f"{where}: deferred as heavy, but it loads neither torch nor jax (import it at module level)")
    return found


def test_deferred_imports_are_few_and_each_has_its_reason():
    sources = {name: (src.read_text(), pkg) for name, (src, pkg) in _modules().items()}
    found = unjustified_deferred(sources)
    assert not found, "deferred imports without a reason that holds:\n" + "\n".join(found)
    count = len(deferred_imports(sources))
    assert count <= DEFERRED_MAX, f"{count} deferred imports (at most {DEFERRED_MAX}): import at module level instead"


def test_the_deferred_check_finds_planted_faults():
    planted = {
        "tpu_debug.report.a": (
            "def f():\n"
            "    from tpu_debug.tracers.reading import b\n"  # no reason
            "def g():\n"
            "    from tpu_debug.tracers.reading import b  # deferred: heavy: it is not\n"
            "def h():\n"
            "    # deferred: heavy: the device loads torch\n"
            "    from tpu_debug.runtime import device\n"
            "def k():\n"
            "    from tpu_debug.runtime import device  # deferred: because\n",
            False,
        ),
        "tpu_debug.tracers.reading.b": ("import json\n", False),
        "tpu_debug.runtime.device": ("import torch\n", False),
        "tpu_debug.runtime": ("", True),
        "tpu_debug.tracers.reading": ("", True),
    }
    assert unjustified_deferred(planted) == [
        "tpu_debug.report.a:2 -> tpu_debug.tracers.reading.b: no '# deferred: <reason>' comment",
        "tpu_debug.report.a:4 -> tpu_debug.tracers.reading.b: deferred as heavy, but it loads neither torch nor "
        "jax (import it at module level)",
        "tpu_debug.report.a:9 -> tpu_debug.runtime.device: unknown reason 'because' (one of heavy, optional, "
        "autoload, entry)",
    ]


# What must import without torch and jax: the package, the CLI (every verb's module: the reading
# verbs start without them), the reading side and what it shares, the runtime's light face, the
# pytest plugin (pytest loads it in every project). tests/cli/test_startup.py checks the same in a
# fresh process; this finds the module that pulls them in.
LIGHT = ("tpu_debug.cli", "tpu_debug.core", "tpu_debug.trace_config", "tpu_debug.trace_signals",
         "tpu_debug.pytest_plugin", "tpu_debug.runtime.probes", "tpu_debug.runtime.config") + READERS + SHARED


def test_the_light_side_loads_neither_torch_nor_jax():
    sources = {name: (src.read_text(), pkg) for name, (src, pkg) in _modules().items()}
    heavy = heavy_modules(sources)
    found = sorted(m for m in heavy if m == "tpu_debug" or _under(m, LIGHT))
    assert not found, "modules that must stay light but load torch or jax at import:\n" + "\n".join(found)


def test_the_doc_quotes_the_deferred_reasons():
    rows = "\n".join(f"| {name} | {why} |" for name, why in DEFERRED_REASONS.items())
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert rows in doc, f"docs/architecture.md should hold the reasons for a deferred import:\n{rows}"
    assert f"`DEFERRED_MAX` ({DEFERRED_MAX})" in doc
