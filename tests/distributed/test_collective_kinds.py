"""The one declaration of collective kinds (core/collective_kinds.py) covers what the code runs."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tpu_debug.core import collective_kinds
from tpu_debug.core.collective_kinds import KINDS, CollectiveKind, of_c10d, of_opcode


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
