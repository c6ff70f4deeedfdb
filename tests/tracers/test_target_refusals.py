"""A program the TPU target's compiler refuses, in a trace: its XLA error code, what the code
means and what to change, at the user's line of the instruction the refusal is about."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from tpu_debug.runtime.pallas import jax_op
from tpu_debug.runtime.target._libtpu import _find_libtpu
from tpu_debug.runtime.target.error_codes import by_code
from tpu_debug.tracers.reading.target_findings import findings

import tpu_debug

pytestmark = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text)


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _double(x: jax.Array) -> jax.Array:
    # one block: the whole array in the TPU core's VMEM at once
    return pl.pallas_call(_double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_a_kernel_over_the_scoped_vmem_limit_is_explained_at_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    double = jax_op("tpu_debug_test::vmem_double", _double)

    def step(x):
        return double(x) + 1  # KERNEL

    # its values are never read: the dry run compiles the step for v5e and runs nothing
    x = torch.empty(8192, 8192, device="tpu")
    with tpu_debug.trace(logdir=tmp_path / "runs", target="v5e", dry_run=True) as session:
        torch.compile(step, backend="tpu_debug")(x)
    (refused,) = [e for e in session.events("target_compile") if e.status == "compile_error"]
    assert refused.error_code == "E1001: CompileTimeScopedVmemOom" and not refused.error_code_printed
    assert (refused.error_file, refused.error_line) == (__file__, _line("# KERNEL"))
    (found,) = [f for f in findings(session.events("target_compile")) if f.kind == "compile_error"]
    code = by_code("E1001")
    assert found.fix == code.fix and found.locations[0].line == _line("# KERNEL")
    report = session.summary()
    flat = " ".join(report.split())
    assert f"at test_target_refusals.py:{_line('# KERNEL')} on v5e" in flat
    assert "XLA error E1001 CompileTimeScopedVmemOom" in flat and " ".join(code.meaning.split()) in flat
    assert " ".join(code.fix.split()) in flat and code.url in flat


def _row_at_kernel(i_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(i_ref[0], 8), :]  # ROW


def _row_at(i: jax.Array, x: jax.Array) -> jax.Array:
    return pl.pallas_call(_row_at_kernel, out_shape=jax.ShapeDtypeStruct((8, x.shape[1]), x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM)])(i, x)


def test_a_kernels_unaligned_read_is_explained_at_the_kernels_line_and_the_call(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "target-cache"))
    rows = jax_op("tpu_debug_test::rows_at", _row_at)

    def step(i, x):
        return rows(i, x) * 2  # CALL

    i, x = torch.tensor([3], dtype=torch.int32, device="tpu"), torch.randn(64, 256, device="tpu")
    with tpu_debug.trace(logdir=tmp_path / "runs", target="v5e", dry_run=True) as session:
        torch.compile(step, backend="tpu_debug")(i, x)
    (refused,) = [e for e in session.events("target_compile") if e.status == "compile_error"]
    assert refused.error_code == "E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment" and refused.error_code_printed
    # the PyTorch line that calls the kernel, and the kernel's own line
    assert (refused.error_file, refused.error_line) == (__file__, _line("# CALL"))
    assert (refused.error_source_file, refused.error_source_line) == (__file__, _line("# ROW"))
    assert not [e for e in session.events("internal_error")]
    code = by_code("E2003")
    flat = " ".join(session.summary().split())
    assert f"at test_target_refusals.py:{_line('# CALL')} on v5e" in flat
    assert f"in kernel _row_at_kernel at test_target_refusals.py:{_line('# ROW')}" in flat
    assert "The compiler said: cannot statically prove that index in dimension 0 is a multiple of 8" in flat
    assert " ".join(code.fix.split()) in flat and code.url in flat
