"""XLA's buffer assignment read from its dumps: the peak's buffers add up to the compiler's own figures.

The references are the compiler's, never this reader's: ``memory_analysis()`` of the
executable (arguments, outputs, aliased, temporaries), the "Total bytes" of the memory usage
report the same compile dumps (read here with the test's own pattern), and, for a program
the TPU compiler refuses, the figure its out-of-memory message states. Programs are small
JAX functions (a compile of a second or two, ten on a loaded machine for the TPU ones).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from tpu_debug.core.buffers import parse_buffer_assignment, read_dump
from tpu_debug.runtime.local_buffers import local_buffer_assignment
from tpu_debug.runtime.target import _libtpu

requires_libtpu = pytest.mark.skipif(
    not _libtpu._find_libtpu(),
    reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it',
)


def _mlp_grad(w1, w2, x):
    h = jnp.tanh(x @ w1)
    return ((h @ w2) ** 2).sum()


def _layers(ws, x):
    def body(h, w):
        return jnp.tanh(h @ w), None

    h, _ = jax.lax.scan(body, x, ws)
    return (h * h).sum()


def _report_total(directory) -> int:
    """The memory usage report's "Total bytes" of the device's memory (color 0), read by the test."""
    text = next(directory.glob("*memory-usage-report.txt")).read_text()
    default = text.split("Memory Space: default", 1)[1]
    return int(re.search(r"Total bytes: (\d+)", default).group(1))


def _dumped(fn, args, tmp_path, donate=()):
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile(
        compiler_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    return compiled.memory_analysis(), read_dump(tmp_path)


def _constants(assignment) -> int:
    return sum(a.size for a in assignment.allocations if a.color == 0 and a.kind in ("constant", "thread_local"))


CPU_PROGRAMS = {
    "mlp gradient": (jax.grad(_mlp_grad, argnums=(0, 1)), lambda: (jnp.ones((64, 256)), jnp.ones((256, 32)),
                                                                    jnp.ones((512, 64))), ()),
    "donated update": (lambda w, g: w - 0.1 * jnp.tanh(g @ w), lambda: (jnp.ones((128, 128)), jnp.ones((128, 128))),
                       (0,)),
    "scanned layers": (jax.grad(_layers), lambda: (jnp.ones((3, 128, 128)), jnp.ones((256, 128))), ()),
}


@pytest.mark.parametrize("name", list(CPU_PROGRAMS))
def test_cpu_peak_adds_up_to_the_compilers_figures(name, tmp_path):
    fn, make, donate = CPU_PROGRAMS[name]
    stats, assignment = _dumped(fn, make(), tmp_path, donate)
    peak = assignment.peak()
    # every buffer at the peak and the heap's unused bytes: the buffer assignment's total, which
    # is the compiler's own report of it and, less the constants the executable carries, the
    # executable's arguments + outputs - aliased + temporaries
    assert peak.counted == assignment.total() == _report_total(tmp_path)
    compiler = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                + stats.temp_size_in_bytes)
    assert assignment.total() - _constants(assignment) == compiler
    assert peak.heap == stats.temp_size_in_bytes
    # each buffer is counted at most at its compiler-given size, and the largest come first
    assert all(0 < b.nbytes <= b.value.size or b.value.id < 0 for b in peak.buffers)
    assert [b.nbytes for b in peak.buffers] == sorted((b.nbytes for b in peak.buffers), reverse=True)
    assert 0 <= peak.position < len(assignment.sequence)
    # the timeline's highest point is the peak, without the heap's fragmentation
    assert max(b for _, b in assignment.timeline()) == peak.total - peak.unused


def test_the_runtimes_second_compile_assigns_what_its_executable_holds():
    lowered = jax.jit(jax.grad(_mlp_grad)).lower(jnp.ones((64, 256)), jnp.ones((256, 32)), jnp.ones((512, 64)))
    stats = lowered.compile().memory_analysis()
    assignment, hlo = local_buffer_assignment(lowered)
    assert assignment.peak().heap == stats.temp_size_in_bytes
    assert sum(a.size for a in assignment.allocations if a.kind == "parameter") == stats.argument_size_in_bytes
    assert "ENTRY" in hlo


def test_shared_bytes_are_counted_once():
    # b is written over a's bytes where a dies (an in-place result): at position 1 both are
    # live, the heap holds 64 bytes of them, and b (the newer) is what they hold
    text = ("allocation 0: size 128, preallocated-temp:\n"
            " value: <1 a @0> (size=64,offset=0): f32[16]{0}\n"
            " value: <2 b @0> (size=64,offset=0): f32[16]{0}\n"
            " value: <3 c @0> (size=32,offset=64): f32[8]{0}\n")
    ranges = ("  InstructionSequence:\n    0:a\n    1:b\n    2:c\n  BufferLiveRange:\n"
              "    a{}:0-1\n    b{}:1-2\n    c{}:2-2\n")
    peak = parse_buffer_assignment(text, ranges).peak()
    assert peak.position == 2 and peak.total == 128
    assert [(b.value.instruction, b.nbytes) for b in peak.buffers] == [("b", 64), ("c", 32)]
    assert peak.unused == 32


def _tpu_args(shapes):
    from tpu_debug.runtime.target.hardware import parse_target

    device = _libtpu.topology(parse_target("v5e"))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    return tuple(jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for s in shapes)


@requires_libtpu
def test_tpu_peak_adds_up_to_the_compilers_figures(tmp_path):
    fn = jax.grad(_mlp_grad, argnums=(0, 1))
    stats, assignment = _dumped(fn, _tpu_args([(512, 512), (512, 2048), (4096, 512)]), tmp_path)
    peak = assignment.peak()
    assert peak.counted == assignment.total() == _report_total(tmp_path)
    params = sum(a.size for a in assignment.allocations if a.kind == "parameter")
    outputs = sum(a.size for a in assignment.allocations if a.kind == "output")
    assert params == stats.argument_size_in_bytes and outputs == stats.output_size_in_bytes
    # the TPU's layouts: a value's bytes are its tiles', at least its logical bytes
    for b in peak.buffers:
        array = b.value.parsed_shape.array
        if b.value.id >= 0 and array is not None and array.nbytes:
            assert b.value.size >= array.nbytes


@requires_libtpu
def test_a_refused_program_adds_up_to_the_figure_the_compiler_refused(tmp_path):
    from tpu_debug.runtime.target import compile_for_target

    # x @ w1's 8 GiB result and the 16 GiB of the next product do not fit a v5e's 15.75 GiB
    args = _tpu_args([(8192, 8192), (8192, 32768), (131072, 8192)])
    result = compile_for_target(jax.grad(_mlp_grad, argnums=(0, 1)), args, "v5e", cache=False)
    assert result.error is not None and result.error.kind == "hbm_oom"
    peak = result.buffers.peak()
    # the message prints GiB with two decimals ("22.50G"): within half a hundredth of one
    assert abs(peak.counted - result.error.required_bytes) <= 0.005 * 1024**3
    assert peak.counted == result.buffers.total()
    largest = peak.buffers[0].value
    assert largest.parsed_shape.array.dims == (131072, 32768)  # h @ w2's product, the 8 GiB one
