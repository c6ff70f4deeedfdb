"""The one declaration of collective kinds (core/collective_kinds.py) covers what the code runs."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap
from pathlib import Path

import pytest

from tpu_debug.core import collective_kinds
from tpu_debug.core.collective_kinds import FLIGHT_RECORDER_NAMES, KINDS, CollectiveKind, of_c10d, of_opcode

# the modules that run c10d calls or write and read their Flight Recorder entries
# every other module that reads c10d calls: Flight Recorder's writer and reader, the desync texts,
# the reading side's and the report's, the advisor's and the TUI's views of the ranks' calls
_C10D_READERS = (
    "tpu_debug.runtime.distributed.flight_recorder", "tpu_debug.tracers.recording.flight_recorder_import",
    "tpu_debug.core.desync", "tpu_debug.tracers.reading.collective_calls", "tpu_debug.report.ranks",
    "tpu_debug.tracers.advisor.collective_rules", "tpu_debug.tui.screens.ranks",
)


def _c10d_calls() -> set[str]:
    """The c10d method names the tpu process group runs its collectives under (the first
    argument of its ``_run`` and ``_reduce_scatter`` calls)."""
    from tpu_debug.runtime.distributed.c10d import TpuProcessGroup

    tree = ast.parse(textwrap.dedent(inspect.getsource(TpuProcessGroup)))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("_run", "_reduce_scatter") and node.args
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    }


def test_every_collective_the_tpu_process_group_runs_is_declared_once():
    from tpu_debug.runtime.distributed.c10d import TpuProcessGroup

    runs = _c10d_calls()
    assert "allreduce" in runs and "send" in runs  # the walk finds the calls
    declared = {m for k in KINDS for m in k.c10d}
    assert runs == declared
    assert all(callable(getattr(TpuProcessGroup, m)) for m in declared)
    assert {of_c10d(m).name for m in ("send", "recv", "recv_anysource")} == {"point-to-point"}
    with pytest.raises(KeyError, match=r"^'all_reduce_twice'$"):
        of_c10d("all_reduce_twice")


def test_every_opcode_maps_to_its_kind_its_start_too():
    assert of_opcode("all-gather-start") is of_opcode("all-gather") is of_c10d("all_gather_single")
    assert of_opcode("add") is None
    assert len(collective_kinds.HLO_OPCODES) == len(set(collective_kinds.HLO_OPCODES))
    assert "ragged-all-to-all" in collective_kinds.HLO_OPCODES
    assert "ragged-all-to-all" not in collective_kinds.DATA_OPERAND_OPCODES


def test_a_kind_with_an_unknown_wire_model_or_a_stray_ragged_method_is_refused():
    with pytest.raises(ValueError, match=r"^collective kind tree: wire='tree'; use one of reduce, ring, once$"):
        CollectiveKind("tree", wire="tree")
    with pytest.raises(ValueError, match=r"^collective kind x: ragged \('y',\) are not among its c10d methods$"):
        CollectiveKind("x", c10d=("x",), ragged=("y",))


def _sources(*modules: str) -> dict[str, str]:
    """Module file -> its source, found without importing the module (a package: each of its modules)."""
    out = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        files = (sorted(Path(spec.submodule_search_locations[0]).glob("*.py")) if spec.submodule_search_locations
                 else [Path(spec.origin)])
        out.update({str(f): f.read_text() for f in files})
    return out


def _strings(node: ast.AST) -> set[str]:
    """The string literals of an expression: a string, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {s for element in node.elts for s in _strings(element)}
    return set()


def name_tests(source: str) -> list[str]:
    """Where ``source`` decides something by a c10d method's name (``name == "send"``, ``op in
    ("send", "recv")``, ``name.startswith("allreduce")``) instead of reading its kind's property."""
    names = {m for k in KINDS for m in k.c10d} | set(FLIGHT_RECORDER_NAMES.values())
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            named = {s for n in (node.left, *node.comparators) for s in _strings(n)} & names
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "endswith"):
            test = str.startswith if node.func.attr == "startswith" else str.endswith
            named = {s for a in node.args for s in _strings(a) if any(test(m, s) for m in names)}
        else:
            continue
        if named:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_name_test_finder_finds_planted_ones():
    planted = textwrap.dedent("""
        if name.startswith(("allreduce", "broadcast")) or info.op == "send" or op not in ("recv", "x"):
            pass
        if state == "called" and key.startswith("tpu_debug/") and backend != "nccl":
            pass
    """)
    assert [f.split(":", 1)[1].strip() for f in name_tests(planted)] == [
        "name.startswith(('allreduce', 'broadcast'))", "info.op == 'send'", "op not in ('recv', 'x')",
    ]


def test_c10d_reads_each_kinds_properties_from_the_table_never_from_its_name():
    sources = _sources("tpu_debug.runtime.distributed.c10d", *_C10D_READERS)
    assert any(f.endswith("process_group.py") for f in sources) and len(sources) > 3
    found = {f: tests for f, text in sources.items() if (tests := name_tests(text))}
    assert not found, "decided by a c10d method's name (declare it on the kind in core/collective_kinds.py):\n" + (
        "\n".join(f"{f} {t}" for f, tests in found.items() for t in tests)
    )


def test_flight_recorder_records_each_calls_tensors_by_its_kind():
    recorded = {m: of_c10d(m).flight_recorder_arguments(m) for k in KINDS for m in k.c10d}
    assert recorded["allreduce"] == recorded["broadcast"] == recorded["reduce"] == ((0,), (0,))  # in place
    assert recorded["reduce_scatter_single"] == recorded["alltoall_base"] == ((1,), (0,))  # (output, input)
    assert recorded["send"] == ((0,), ()) and recorded["recv"] == recorded["recv_anysource"] == ((), (0,))
    assert recorded["barrier"] == ((), ())
    assert collective_kinds.SENDS == {"send"} and collective_kinds.RECEIVES == {"recv", "recv_anysource"}


def test_the_roofline_leaves_out_exactly_the_kinds_tables_opcodes():
    from tpu_debug.runtime.target import parse_target
    from tpu_debug.runtime.target.roofline import op_by_op

    link = collective_kinds.LINK_OPCODES
    assert set(collective_kinds.HLO_OPCODES) <= link and {"ragged-all-to-all", "collective-broadcast"} <= link
    # every opcode of the table, and each asynchronous half, takes no time on the roofline;
    # the one add does
    body = [f"  c{i}_{j} = f32[8]{{0}} {op}{half}(p)" for i, op in enumerate(sorted(link))
            for j, half in enumerate(("", "-start", "-done"))]
    hlo = "\n".join(["HloModule m", "", "ENTRY main {", "  p = f32[8]{0} parameter(0)", *body,
                      "  ROOT r = f32[8]{0} add(p, p)", "}", ""])
    assert op_by_op(hlo, parse_target("v5e")).ops == 1
    # and the roofline keeps no list of its own
    (roofline_source,) = _sources("tpu_debug.runtime.target.roofline").values()
    named = {s for node in ast.walk(ast.parse(roofline_source)) for s in _strings(node)}
    assert not named & link, f"runtime/target/roofline.py names collective opcodes itself: {sorted(named & link)}"
