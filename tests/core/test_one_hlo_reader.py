"""One reader of HLO text: no module but ``core/hlo_text.py`` holds a pattern that reads HLO.

The check reads the source with ``ast`` (nothing is imported) over every module the wheel
holds. It finds the calls of ``re``'s functions (``re.compile``, ``re.search``, ...; also
through ``import re as r`` and ``from re import compile``), folds each call's pattern when it
is written in the module (string literals, ``+`` of literals, f-strings, and module-level
names bound to those), and flags a pattern that holds one of HLO's markers: an instruction or
computation name's ``%``, an element type and its dimensions (``f32\\[``, ``[a-z0-9]*)\\[``,
``[0-9,]``, ``[<=\\d,]``), a layout or group brace followed by digits, the iota's ``<=``, a
header or table word (``ENTRY``, ``ROOT``, ``HloModule``, ``StackFrames``), a collective's
opcode (``all-reduce``...), a layout's tile items (``[A-Z#]``), the mesh form of replica groups
(``mesh\\[``), or an attribute name (``replica_groups``, ``metadata``, ``op_name``, ``sharding``,
``calls=``...).

Its limits, said plainly: a pattern built at run time from values the module does not bind
to literals (``re.compile(re.escape(term))``), HLO read with ``str`` methods (``split``,
``startswith("ENTRY")``), and a pattern that reads HLO through none of the markers are not
seen. StableHLO (MLIR) text is another format and is not looked for. Tests are not checked:
they may read the compiler's text on their own, as independent references.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READER = "tpu_debug.core.hlo_text"

_FUNCTIONS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
_WORDS = ("ENTRY", "ROOT", "HloModule", "FileLocations", "StackFrames", "replica_groups", "source_target_pairs",
          "metadata", "op_name", "source_file", "source_line", "stack_frame_id", "channel_id", "calls=", "to_apply",
          "contracting_dims", "dim_labels", "operand_precision", "algorithm=dot", "feature_group_count", "window=",
          "sharding", "devices=", "num_partitions", "replica_count", "backend_config", "<=", "mesh\\[", "A-Z#",
          "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_SIGNS = (
    re.compile(r"%(?:\[|\(|\\)"),  # an instruction's name: %([\w.\-]+), %[\w.\-]+, %\S+
    re.compile(r"\b(?:pred|bf16|[sufc]\d+|f8\w*)\\\["),  # an element type and its dimensions: f32\[
    re.compile(r"\*\)?\\\["),  # any element type: ([a-z][a-z0-9]*)\[
    re.compile(r"\[(?:<=)?(?:\\d|0-9),"),  # a dimension or group list: [0-9,] [\d,] [<=\d,]
    re.compile(r"\\\{\(?\[(?:\\d|0-9)"),  # a layout or a group in braces: \{[\d,:A-Z()]*\}, \{([0-9,\s]*)\}
)


def hlo_marker(pattern: str) -> str | None:
    """The first HLO marker ``pattern`` holds, or None."""
    word = next((w for w in _WORDS if w in pattern), None)
    if word is not None:
        return word
    sign = next((m for m in (s.search(pattern) for s in _SIGNS) if m), None)
    return sign.group() if sign else None


def _names_of_re(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the ``re`` module, names bound to its functions) in ``tree``."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name == "re")
        elif isinstance(node, ast.ImportFrom) and node.module == "re":
            functions.update(a.asname or a.name for a in node.names if a.name in _FUNCTIONS)
    return modules, functions


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level names bound once to an expression (``_SHARDING = r"(\\{...\\})"``)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _fold(node: ast.expr | None, names: dict[str, ast.expr], depth: int = 0) -> str | None:
    """The text of a pattern written in the module, or None when it is made at run time."""
    if node is None or depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return _fold(names[node.id], names, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left, names, depth + 1), _fold(node.right, names, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts and the values it can fold
        parts = [_fold(v.value if isinstance(v, ast.FormattedValue) else v, names, depth + 1) for v in node.values]
        return "".join(p or "" for p in parts)
    return None


_IMPORTS_RE = re.compile(r"^\s*(?:import [^\n]*\bre\b|from re import)", re.MULTILINE)


def hlo_patterns(source: str) -> list[tuple[int, str, str]]:
    """(line, pattern, marker) of each pattern in ``source`` that reads HLO."""
    if not _IMPORTS_RE.search(source):  # no pattern without the module (the parse is the slow part)
        return []
    tree = ast.parse(source)
    modules, functions = _names_of_re(tree)
    names = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        is_re = (isinstance(func, ast.Attribute) and func.attr in _FUNCTIONS and isinstance(func.value, ast.Name)
                 and func.value.id in modules) or (isinstance(func, ast.Name) and func.id in functions)
        if not is_re:
            continue
        argument = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "pattern"), None)
        pattern = _fold(argument, names)
        marker = hlo_marker(pattern) if pattern is not None else None
        if marker is not None:
            found.append((node.lineno, pattern, marker))
    return found


def _library_modules() -> dict[str, Path]:
    """Module name -> source file, for every module the wheel holds."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {}
    for package, folder in setuptools["package-dir"].items():
        for source in (ROOT / folder).rglob("*.py"):
            parts = [*package.split("."), *source.relative_to(ROOT / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = source
    return found


def test_no_module_but_the_reader_holds_an_hlo_pattern():
    modules = _library_modules()
    assert READER in modules and len(modules) > 100
    outside = [f"{source.relative_to(ROOT)}:{line}: {pattern!r} ({marker})"
               for name, source in sorted(modules.items()) if name != READER
               for line, pattern, marker in hlo_patterns(source.read_text())]
    assert not outside, (
        "HLO text read by a pattern outside core/hlo_text.py: read it through tpu_debug.core.hlo_text "
        "(parse_module, parse_instruction, parse_shape, parse_sharding...), adding what it lacks there:\n"
        + "\n".join(outside)
    )


def test_the_reader_itself_is_what_the_check_sees():
    # the markers find the reader's own patterns: the check looks for what reading HLO takes
    found = hlo_patterns(_library_modules()[READER].read_text())
    assert len(found) >= 5, found


_PLANTED = '''
import os, re
import re as regex
from re import compile as make, findall

_GROUPS = r"\\{([0-9,\\s]*)\\}"
_SHARDING = r"(\\{(?:[^{}]|\\{[^{}]*\\})*\\})"
_A = re.compile(r"replica_groups=(\\{[^}]*\\})")  # HLO
_B = regex.compile(r"\\b([a-z][a-z0-9]*)\\[([0-9,]*)\\]")  # HLO
_C = make("go from sharding " + _SHARDING)  # HLO
_D = re.compile(rf"^\\s+(?:ROOT\\s+)?%?([\\w.\\-]+)\\s*=")  # HLO
_E = re.compile(r"\\s(?:all-gather|all-reduce)(?:-start)?\\(([^)]*)\\)")  # HLO

def f(attrs):
    return findall(_GROUPS, attrs)  # HLO

def g(line):
    return re.search(pattern=r"lhs_contracting_dims=\\{([\\d,]*)\\}", string=line)  # HLO

_RANK = re.compile(r"rank_(\\d+)")
_STAMP = re.compile(r"^\\d{8}T\\d{6}\\.\\d{3}Z-")
_GUARD = re.compile(r"^(?P<tensor>\\S+)\\.size\\(\\)\\[(?P<dim>\\d+)\\] == (?P<value>\\d+)$")
_FRAME = re.compile(r'File "([^"]+)", line (\\d+), in (.+)')
_TERM = re.compile(re.escape("term"))
'''


def test_the_check_finds_planted_hlo_patterns_and_passes_the_rest():
    found = hlo_patterns(_PLANTED)
    planted = [i for i, line in enumerate(_PLANTED.splitlines(), 1) if line.endswith("# HLO")]
    assert sorted(line for line, _, _ in found) == planted and len(planted) == 7, found
    assert found[0][2] == "replica_groups"
