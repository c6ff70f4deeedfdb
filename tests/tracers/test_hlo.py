from __future__ import annotations

import re

import pytest
import torch
from tpu_debug.tracers.events import SourceLocation
from tpu_debug.tracers.hlo import (
    elide_literals,
    fx_nodes_from,
    instruction_lines,
    make_program,
    map_nodes,
    parse_instructions,
    program_hash,
)

import tpu_debug
from tpu_debug.core.errors import NotRecordedError

OPTIMIZED = """HloModule jit_fn, is_scheduled=true

%fused_computation (param_0: f32[8,8]) -> f32[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  %constant.0 = f32[] constant(0)
  %max.1 = f32[8,8]{1,0} broadcast(%constant.0), dimensions={}, metadata={op_name="jit(fn)/relu|aten::relu.default/max"}
  ROOT %max.0 = f32[8,8]{1,0} maximum(%param_0, %max.1), metadata={op_name="jit(fn)/relu|aten::relu.default/max"}
}

ENTRY %main.1 (x: f32[8,8], w: f32[8,8]) -> (f32[8,8], s32[]) {
  %x = f32[8,8]{1,0} parameter(0), metadata={op_name="x"}
  %w = f32[8,8]{1,0} parameter(1), metadata={op_name="w"}
  %dot.0 = f32[8,8]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(fn)/mm|aten::mm.default/dot_general"}
  %fusion = f32[8,8]{1,0} fusion(%dot.0), kind=kLoop, calls=%fused_computation, metadata={op_name="jit(fn)/relu|aten::relu.default/max"}
  %c = s32[] constant(1)
  ROOT %tuple.1 = (f32[8,8]{1,0}, s32[]) tuple(%fusion, %c)
}
"""


def test_parse_instructions():
    ins = parse_instructions(OPTIMIZED)
    assert [(i.computation, i.name, i.opcode) for i in ins] == [
        ("fused_computation", "param_0", "parameter"),
        ("fused_computation", "constant.0", "constant"),
        ("fused_computation", "max.1", "broadcast"),
        ("fused_computation", "max.0", "maximum"),
        ("main.1", "x", "parameter"),
        ("main.1", "w", "parameter"),
        ("main.1", "dot.0", "dot"),
        ("main.1", "fusion", "fusion"),
        ("main.1", "c", "constant"),
        ("main.1", "tuple.1", "tuple"),
    ]
    assert ins[6].op_name == "jit(fn)/mm|aten::mm.default/dot_general"


def test_a_large_constant_is_stored_elided_and_hashed_whole():
    small = '%c = stablehlo.constant dense<"0x0001"> : tensor<2xi8>'
    big = '%c_0 = stablehlo.constant dense<"0x' + "0A" * 8192 + '"> : tensor<8192xi8>'
    other = big.replace("0A", "0B", 8000)  # the same program but for the constant's values
    text, changed = f"{small}\n{big}\n", f"{small}\n{other}\n"
    stored = make_program("lazy", "g", text, "")
    assert small in stored.stablehlo and "tensor<8192xi8>" in stored.stablehlo
    assert f"0x{'0A' * 32}…({2 * 8192 - 64} hex digits elided)" in stored.stablehlo
    assert len(stored.stablehlo) < 300
    # the program's identity is its whole text: a different constant is a different program
    assert stored.hash == program_hash(text, "") != make_program("lazy", "g", changed, "").hash
    assert elide_literals(small) == small


def test_fx_nodes_map_to_their_instructions():
    pairs = map_nodes(parse_instructions(OPTIMIZED), ["mm", "relu", "unused"])
    assert sorted(pairs) == [("mm", "dot.0"), ("relu", "fusion"), ("relu", "max.0"), ("relu", "max.1")]
    text = instruction_lines(OPTIMIZED, ["dot.0"])
    assert text.splitlines()[0].startswith("ENTRY %main.1")
    assert "%dot.0 = f32[8,8]{1,0} dot(%x, %w)" in text and "fusion" not in text


def test_fx_node_records_in_every_form(tmp_path):
    class Node:  # the runtime's record: name, target, stack_trace
        name, target = "mm", "aten.mm.default"
        stack_trace = (
            '  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 10, in _call\n'
            "    return f()\n"
            f'  File "{tmp_path}/model.py", line 7, in forward\n'
            "    y = x @ w\n"
        )

    nodes = fx_nodes_from(
        [Node(), {"name": "relu", "target": "aten.relu.default", "location": ("m.py", 3)}, "add"]
    )
    assert [(n.name, n.target) for n in nodes] == [
        ("mm", "aten.mm.default"),
        ("relu", "aten.relu.default"),
        ("add", ""),
    ]
    assert nodes[0].location == SourceLocation(f"{tmp_path}/model.py", 7, "forward")
    assert nodes[1].location == SourceLocation("m.py", 3, "")
    program = make_program("compiled", "g1/forward", "module {}", OPTIMIZED, [Node()])
    assert program.node_instructions == (("mm", "dot.0"),) and program.instructions == 10


def test_hlo_recorded_for_eager_ops(logdir, cold_cache):
    a_cpu, b_cpu = torch.randn(4, 8), torch.randn(4, 8)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        out = torch.mul(a, b)
        out2 = torch.relu(out)
    torch.testing.assert_close(out2.cpu(), torch.relu(a_cpu * b_cpu))
    hlo = session.programs.hlo(torch.ops.aten.mul.Tensor)
    assert hlo.startswith("HloModule ")
    assert re.search(r"multiply\(", hlo) and 'op_name="jit(traced)/aten::mul.Tensor/mul"' in hlo
    assert "stablehlo.multiply" in session.programs.hlo("aten::mul.Tensor", stage="stablehlo")
    assert session.programs.hlo("mul") == hlo  # a packet name picks among the overloads
    assert "maximum" in session.programs.hlo("relu")
    (compile_ev,) = session.compiles(name="mul.Tensor")
    assert compile_ev.signature == "mul.Tensor(float32[4,8], float32[4,8])"
    assert compile_ev.location.file == __file__
    assert compile_ev.seconds > 0 and compile_ev.program is not None
    programs = {p.name: p for p in session.programs()}
    assert programs["mul.Tensor"].count == 1 and programs["mul.Tensor"].compiles == 1
    assert session.programs.hlo(programs["relu"].id) == session.programs.hlo("relu")


def test_hlo_off_records_compiles_without_text(logdir, cold_cache):
    x = torch.ones(3).to("tpu")
    with tpu_debug.trace(logdir=logdir, hlo=False) as session:
        y = x * 3.0
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]
    assert [c.program for c in session.compiles()] == [None]
    assert session.programs() == []
    with pytest.raises(NotRecordedError, match="This run recorded no HLO"):
        session.programs.hlo("mul.Tensor")


def test_each_signature_gets_its_own_program(logdir, cold_cache):
    x = torch.ones(3).to("tpu")
    y = torch.ones(3, dtype=torch.float32).to("tpu")
    with tpu_debug.trace(logdir=logdir) as session:
        for _ in range(3):
            z = x + y
        z = torch.ones(5).to("tpu") + torch.ones(5).to("tpu")  # new shape: a second program
    assert z.cpu().tolist() == [2.0] * 5
    assert len(session.compiles(name="add.Tensor")) == 2
    progs = session.programs(name="add.Tensor")
    assert sorted(p.count for p in progs) == [1, 3]
    assert session.ops(name="add.Tensor")[0].count == 4


def test_compiled_graph_nodes_map_to_hlo(logdir):
    def f(x, w):
        y = x @ w
        return torch.relu(y) + 1.0

    x_cpu, w_cpu = torch.randn(8, 8), torch.randn(8, 8)
    cf = torch.compile(f, backend="tpu_debug")
    with tpu_debug.trace(logdir=logdir) as session:
        out = cf(x_cpu.to("tpu"), w_cpu.to("tpu"))
        out = cf(x_cpu.to("tpu"), w_cpu.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x_cpu, w_cpu))
    # programs compiled by earlier tests are known to the run (replayed), but only this one ran
    (program,) = [p for p in session.programs(mode="compiled") if p.count]
    assert program.count == 2 and program.compiles == 1
    nodes = {n.name: n for n in session.programs.fx_nodes(program.id)}
    assert nodes["mm"].location.file == __file__
    assert nodes["mm"].location.line == f.__code__.co_firstlineno + 1
    assert session.programs.node_instructions(program.id, "mm")
    text = session.programs.hlo("mm", graph=program.name)
    assert "dot" in text and 'op_name="jit(fn)/mm|aten::mm.default' in text
    assert "maximum" not in text
    assert session.programs.hlo(program.name).startswith("HloModule ")
