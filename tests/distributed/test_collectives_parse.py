"""Reading collectives from optimized HLO text (core/collectives.py over core/hlo_text.py), format by format.

The modules below are written in the forms XLA prints (jaxlib 0.10): replica groups
as explicit lists, as iota reshapes and as mesh axes, asynchronous start/done pairs,
combined (tuple) all-reduces, and the stack-frame tables metadata points into. The
expected figures follow from the shapes and groups written in each instruction.
"""

from __future__ import annotations

import pytest
from tpu_debug.core.collectives import module_devices, parse_collectives
from tpu_debug.core.hlo_text import parse_module, parse_shape

MODULE = """\
HloModule jit_fn, is_scheduled=true, entry_computation_layout={(f32[4,16]{1,0})->f32[]}, num_partitions=8

FileNames
1 "/home/user/train.py"
2 "/site/tpu_debug/runtime/ops/linalg.py"

FunctionNames
1 "<module>"
2 "step"
3 "mm"

FileLocations
1 {file_name_id=1 function_name_id=1 line=40 end_line=40 column=1 end_column=1}
2 {file_name_id=1 function_name_id=2 line=12 end_line=12 column=5 end_column=5}
3 {file_name_id=2 function_name_id=3 line=150 end_line=150 column=11 end_column=11}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}


%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

ENTRY %main.0_spmd (param: f32[4,16]) -> f32[] {
  %param = f32[4,16]{1,0} parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %all-reduce = f32[4,8]{1,0} all-reduce(%param), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(fn)/addmm_1|aten::addmm.default/dot_general" stack_frame_id=3}
  %all-gather = f32[16,16]{1,0} all-gather(%param), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(fn)/mul_2|aten::mul.Tensor/mul"}
  %reduce-scatter = f32[1,16]{1,0} reduce-scatter(%param), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, to_apply=%add, metadata={op_name="jit(fn)/sum_1|aten::sum.dim_IntList/reduce_sum"}
  %all-reduce.8 = (f32[8,16]{1,0}, f32[8]{0}) all-reduce(%param, %param), channel_id=4, replica_groups={}, to_apply=%add, metadata={op_name="jit(fn)/(mm_2|aten::mm.default/dot_general:sum_2|aten::sum.dim_IntList/reduce_sum)"}
  %all-gather-start = (bf16[2,64]{1,0}, bf16[8,64]{1,0}) all-gather-start(%param), channel_id=5, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %all-gather-done = bf16[8,64]{1,0} all-gather-done(%all-gather-start)
  %collective-permute = f32[4,1,8,2]{3,2,1,0} collective-permute(%param), channel_id=6, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}, metadata={op_name="jit(traced)/aten::cat/concatenate" source_file="/home/user/model.py" source_line=33}
  %all-to-all = s32[8,4]{1,0} all-to-all(%param), channel_id=7, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
  ROOT %r = f32[] constant(0)
}
"""


@pytest.mark.quick
def test_every_collective_with_its_groups_bytes_and_origin():
    found = parse_collectives(MODULE, user_file=lambda f: f.startswith("/home/user/"),
                              node_lines={"mul_2": ("/home/user/model.py", 21, "forward")})
    assert [c.opcode for c in found] == [
        "all-reduce", "all-gather", "reduce-scatter", "all-reduce", "all-gather", "collective-permute", "all-to-all"
    ]
    ar, ag, rs, combined, ag_async, permute, a2a = found
    # all-reduce of f32[4,8] (128 bytes) in 2 groups of 4: a ring sends 2*(4-1)/4 of it
    assert (ar.shape, ar.nbytes, ar.wire_bytes, ar.group_size, ar.groups) == ("f32[4,8]", 128, 192, 4, 2)
    assert (ar.node, ar.op) == ("addmm_1", "aten::addmm.default")
    # its line: the innermost user frame of stack frame 3 (linalg.py is a library frame)
    assert (ar.file, ar.line, ar.function) == ("/home/user/train.py", 12, "step")
    # iota groups [2,4]<=[8]: 2 groups of 4; the gathered result is the data each device gets
    assert (ag.group_size, ag.groups, ag.nbytes, ag.wire_bytes) == (4, 2, 1024, 768)
    assert (ag.file, ag.line) == ("/home/user/model.py", 21)  # from its FX node
    # mesh axes: groups along axis_1 (4 devices), 2 of them; the input is 4x the result
    assert (rs.group_size, rs.groups, rs.nbytes, rs.wire_bytes) == (4, 2, 256, 192)
    # {}: one group of every device; a combined all-reduce counts all of its buffers and nodes
    assert (combined.group_size, combined.groups, combined.nbytes) == (8, 1, 8 * 16 * 4 + 8 * 4)
    assert combined.node == "mm_2,sum_2" and combined.op == "aten::mm.default"
    assert combined.shape == "(f32[8,16], f32[8])"
    # an asynchronous all-gather: counted once, at its start, by its result (the second array)
    assert ag_async.asynchronous and ag_async.nbytes == 8 * 64 * 2 and ag_async.shape == "(bf16[2,64], bf16[8,64])"
    # a permute sends its buffer once; source_file/source_line metadata gives the line
    assert (permute.nbytes, permute.wire_bytes, permute.group_size) == (256, 256, 4)
    assert (permute.op, permute.file, permute.line) == ("aten::cat", "/home/user/model.py", 33)
    assert (a2a.group_size, a2a.groups, a2a.nbytes, a2a.wire_bytes) == (2, 4, 128, 64)
    assert ar.describe() == "all-reduce f32[4,8] over 4 devices x2 groups"


def test_module_devices_and_shape_sizes():
    assert module_devices(MODULE) == 8
    assert module_devices("HloModule jit_f, entry_computation_layout={()->f32[]}\n") == 1
    assert [a.nbytes for a in parse_shape("(f32[2,3]{1,0}, bf16[4]{0}, pred[], s4[3])").arrays] == [24, 8, 1, 2]


def test_stack_frames_walk_to_the_root():
    module = parse_module(MODULE)
    # frame 3 (linalg.py mm) was called from frame 2 (train.py step), called from frame 1 (<module>)
    assert module.stack(3) == (
        ("/site/tpu_debug/runtime/ops/linalg.py", 150, "mm"),
        ("/home/user/train.py", 12, "step"),
        ("/home/user/train.py", 40, "<module>"),
    )
    assert module.stack(99) == ()


def test_a_program_without_collectives():
    assert parse_collectives("HloModule m, num_partitions=2\n\nENTRY %e (p: f32[2]) -> f32[2] {\n"
                             "  ROOT %p = f32[2]{0} parameter(0)\n}\n") == ()
