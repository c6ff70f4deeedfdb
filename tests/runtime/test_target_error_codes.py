"""XLA's numbered error codes (runtime/target/error_codes.py): each read from a message, printed
or not, and the ones a program can reach on the TPU target provoked there by a program made to
meet them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from tpu_debug.runtime.target import compile_for_target, parse_compile_error
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tpu_debug.runtime.target.error_codes import (
    CODES,
    by_code,
    classify,
    doc_url,
    pointed_instruction,
    pointed_source,
)

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


@pytest.fixture(autouse=True)
def target_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))


def test_every_code_xla_declares_past_the_generic_ones_is_explained_once():
    # XLA's table (xla/error/error_codes.h) past E0000-E0015, in its order
    assert [(c.code, c.name) for c in CODES] == [
        ("E0100", "RuntimeBufferAllocationFailure"), ("E0101", "RuntimeProgramAllocationFailure"),
        ("E0102", "RuntimeProgramInputMismatch"), ("E0200", "RuntimeUnexpectedCoreHalt"),
        ("E1000", "CompileTimeHbmOom"), ("E1001", "CompileTimeScopedVmemOom"),
        ("E1200", "CompileTimeHostOffloadOutputLocationMismatch"), ("E2001", "CompileTimeMosaicUnsupportedRhsType"),
        ("E2002", "CompileTimeMosaicMisalignedBlockAndTiling"),
        ("E2003", "CompileTimeMosaicUnprovenMemoryAccessAlignment"),
        ("E3000", "CompileTimeSparseCoreAllocationFailure"), ("E3001", "CompileTimeSparseCoreInvalidReplicaCount"),
    ]
    for c in CODES:
        assert c.meaning and c.fix and c.when in ("compile", "runtime")
        assert c.url == doc_url(c.code) == f"https://openxla.org/xla/errors/error_{c.code[1:]}"
        assert by_code(f"{c.code}: {c.name}") is c


# messages in the forms XLA writes them (the shapes of its documented samples, other figures)
UNPRINTED = {
    "E0100": "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 4.00G. That was not "
             "possible. There are 1.25G free.; (0x0x0_HBM0)",
    "E0102": "INVALID_ARGUMENT: Executable(jit_step) expected parameter 3 of size 4096 (f32[8,128]{1,0:T(8,128)}) "
             "but got buffer with incompatible size 2048 (f32[8,128]{0,1:T(8,128)})",
    "E1000": "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
             "(20.00G) exceeds available HBM (15.75G).",
    "E1001": "RESOURCE_EXHAUSTED: Allocation (size=33554432) would exceed memory (size=16777216) :: #allocation7 "
             "[shape = 'u8[33554432]{0}', space=vmem, size = 0x2000000, scoped, tag = 'input window'] :: kernel.3",
    "E1200": "INVALID_ARGUMENT: Tensor which is moved to host (starting from copy.12) is returned from the entry "
             "computation but the layout for this output is not set to host memory.",
    "E2001": "INTERNAL: Mosaic failed to compile TPU kernel: Unsupported matmul RHS type on target: "
             "'vector<256x256xi4>'",
    "E2002": "INTERNAL: Mosaic failed to compile TPU kernel: Slice shape along dimension 0 must be aligned to "
             "tiling (8), but is 3.",
    "E2002 window": "UNIMPLEMENTED: Mosaic failed to compile TPU kernel: Failed to set window params for input 1: "
                    "Operand of shape (..., 512, 4096) has tiling (32, 128), but its block shape (..., 8, 4096) is "
                    "not divisible by tiling evenly nor matches the full shape.",
    "E1001 stack": "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for "
                   "%attn.7 = bf16[4096,4096]{1,0:T(8,128)(2,1)} custom-call(%p0), custom_call_target=\"tpu_custom_call\"",
    "E2003": "INTERNAL: Mosaic failed to compile TPU kernel: cannot statically prove that index in dimension 1 "
             "is a multiple of 128",
}


@pytest.mark.parametrize("code", sorted(UNPRINTED))
def test_a_message_without_its_code_is_recognised(code):
    found, printed = classify(UNPRINTED[code])
    assert found is by_code(code.split()[0]) and printed is False
    assert parse_compile_error(UNPRINTED[code]).code == f"{found.code}: {found.name}"


def test_a_printed_code_is_read_as_printed():
    text = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nScoped allocation with size 36.25M and limit "
            "32.00M exceeded scoped vmem limit\nSee https://openxla.org/xla/errors/error_1001 for more details.")
    found, printed = classify(text)
    assert (found.code, printed) == ("E1001", True)
    e = parse_compile_error(text)
    assert (e.code, e.code_printed, e.kind) == ("E1001: CompileTimeScopedVmemOom", True, "compile_error")
    # a message no code is about
    assert classify("INVALID_ARGUMENT: Custom emitter for lapack_spotrf_ffi not found") == (None, False)


def test_the_instruction_a_message_points_at():
    assert pointed_instruction(UNPRINTED["E1001"]) == "kernel.3"
    assert pointed_instruction(UNPRINTED["E1001 stack"]) == "attn.7"
    assert pointed_instruction(UNPRINTED["E1200"]) == "copy.12"
    assert pointed_instruction(UNPRINTED["E1000"]) is None


def test_the_kernel_line_a_mosaic_message_points_at():
    # the compiler's message as jax receives it, before Pallas takes the location out
    text = ('INTERNAL: Mosaic failed to compile TPU kernel: E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment: '
            'cannot statically prove that index in dimension 0 is a multiple of 8\nSee '
            'https://openxla.org/xla/errors/error_2003 for more details.\n\nat location: loc("get:"("get/get"('
            'callsite("gather_rows"("/src/kernels.py":15:17 to :38) at "gather_rows"("/src/kernels.py":15:17 '
            'to :38)))))\n\nThe MLIR operation involved:\n  %3 = "tpu.vector_load"(%arg1, %2, %0)')
    assert pointed_source(text) == ("/src/kernels.py", 15, "gather_rows")
    e = parse_compile_error(text)
    assert (e.code, e.code_printed) == ("E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment", True)
    assert (e.source_file, e.source_line, e.source_function) == ("/src/kernels.py", 15, "gather_rows")
    assert pointed_source(UNPRINTED["E1000"]) is None
    # a code printed at the end of its first line: the words on the next are the message's
    e = parse_compile_error("INVALID_ARGUMENT: Mosaic failed to compile TPU kernel: Failed to set window params for "
                            "input 0: E2002: CompileTimeMosaicMisalignedBlockAndTiling:\nOperand of shape (..., 256, "
                            "1024) has tiling (32, 128), but its block shape (..., 8, 1024) is not divisible by tiling "
                            "evenly nor matches the full shape\nSee https://openxla.org/xla/errors/error_2002 for more "
                            "details.")
    assert e.message.endswith("CompileTimeMosaicMisalignedBlockAndTiling: Operand of shape (..., 256, 1024) has "
                              "tiling (32, 128), but its block shape (..., 8, 1024) is not divisible by tiling evenly "
                              "nor matches the full shape")


# -- each code a program reaches on the TPU target, provoked there --------------------------


@requires_libtpu
def test_e1000_a_program_over_one_devices_hbm():
    x = jax.ShapeDtypeStruct((70_000, 70_000), jnp.float32)  # 18.3 GiB in and out: over a v5e's HBM
    result = compile_for_target(lambda a: a @ a, (x,), "v5e")
    e = result.error
    assert e.kind == "hbm_oom" and e.code == "E1000: CompileTimeHbmOom"
    assert classify(e.message)[0] is by_code("E1000")


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _whole_array_kernel(x):
    # one block: the whole array in the core's VMEM at once
    return pl.pallas_call(_double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@requires_libtpu
def test_e1001_a_kernel_whose_block_is_over_the_scoped_vmem_limit():
    result = compile_for_target(_whole_array_kernel, (jax.ShapeDtypeStruct((8192, 8192), jnp.float32),), "v5e")
    e = result.error
    assert e.kind == "compile_error" and e.code == "E1001: CompileTimeScopedVmemOom"
    # the message names the kernel's instruction, which the refused module holds
    assert e.instruction is not None and f"%{e.instruction} = " in result.hlo
    assert "tpu_custom_call" in next(line for line in result.hlo.splitlines() if f"%{e.instruction} = " in line)
    # a block that fits compiles
    assert compile_for_target(_whole_array_kernel, (jax.ShapeDtypeStruct((512, 512), jnp.float32),), "v5e").ok


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _row_blocks(x):
    # blocks of 8 rows: a multiple of float32's tile (8, 128), not of int8's (32, 128)
    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[spec], out_specs=spec)(x)


@requires_libtpu
def test_e2002_a_kernels_block_off_its_dtypes_tiles():
    result = compile_for_target(_row_blocks, (jax.ShapeDtypeStruct((256, 1024), jnp.int8),), "v5e")
    e = result.error
    assert e.code == "E2002: CompileTimeMosaicMisalignedBlockAndTiling" and e.code_printed
    assert "tiling (32, 128)" in e.message and "(..., 8, 1024)" in e.message
    # the kernel's custom call, the one in the module
    assert f"%{e.instruction} = " in result.hlo
    assert compile_for_target(_row_blocks, (jax.ShapeDtypeStruct((256, 1024), jnp.float32),), "v5e").ok


def _int_matmul_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (0,)), ((), ())),  # MATMUL
                                     preferred_element_type=jnp.int32)


def _int_matmul_then_copy(a, b):
    product = pl.pallas_call(_int_matmul_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.int32))(a, b)
    return pl.pallas_call(_copy_kernel, out_shape=product)(product)


@requires_libtpu
def test_e2001_an_int8_matmul_in_a_kernel_for_a_tpu_without_an_int8_unit():
    args = (jax.ShapeDtypeStruct((256, 256), jnp.int8),) * 2
    result = compile_for_target(_int_matmul_then_copy, args, "v4")
    e = result.error
    assert e.code == "E2001: CompileTimeMosaicUnsupportedRhsType" and e.code_printed
    # the kernel's line, and of the module's two kernels the one that holds it
    assert (e.source_file, e.source_line, e.source_function) == (__file__, _line("# MATMUL"), "_int_matmul_kernel")
    (call,) = [line for line in result.hlo.splitlines() if f"%{e.instruction} = " in line]
    assert "operand_layout_constraints={s8[256,256]{1,0}, s8[256,256]{1,0}}" in call  # the int8 operands' kernel
    assert result.hlo.count('custom_call_target="tpu_custom_call"') == 2
    # v5e multiplies int8
    assert compile_for_target(_int_matmul_then_copy, args, "v5e").ok


def _row_at_kernel(i_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(i_ref[0], 8), :]  # ROW


def _row_at(i, x):
    return pl.pallas_call(_row_at_kernel, out_shape=jax.ShapeDtypeStruct((8, x.shape[1]), x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM)])(i, x)


@requires_libtpu
def test_e2003_a_kernel_reading_rows_at_an_offset_the_compiler_cannot_prove_aligned():
    args = (jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((64, 256), jnp.float32))
    result = compile_for_target(_row_at, args, "v5e")  # jax raises it as a MosaicError: a refusal here
    e = result.error
    assert e.code == "E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment" and e.code_printed
    assert "cannot statically prove that index in dimension 0 is a multiple of 8" in e.message
    assert (e.source_file, e.source_line) == (__file__, _line("# ROW"))
    assert f"%{e.instruction} = " in result.hlo


def _line(marker: str) -> int:
    from pathlib import Path

    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.rstrip().endswith(marker))
