"""fit's small-window code generation (``CODEGEN_OPTIONS``) leaves the memory figures alone.

Reference: the same program compiled directly with ``jax.jit(...).lower(...).compile()``
for the deviceless v6e at XLA's default effort level, without the option. The program is
a matmul-heavy gradient (one sequence of 2048 through a 4096 x 14336 projection, as in a
Llama-3-8B layer) whose temporaries stay in HBM at that level, and whose default code
generation picks large windows (the case the option changes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tpu_debug.runtime.target._libtpu import _find_libtpu

needs_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it')


def _grad(x, w):
    def loss(w):
        return (jax.nn.silu(x @ w) @ w.T).astype(jnp.float32).sum()

    return jax.grad(loss)(w)


@needs_libtpu
def test_codegen_options_keep_the_buffers_and_shrink_the_code():
    from tpu_debug.runtime.target import _libtpu
    from tpu_debug.runtime.target.compile import CODEGEN_OPTIONS, compile_for_target
    from tpu_debug.runtime.target.hardware import parse_target

    device = _libtpu.topology(parse_target("v6e"))[0]
    on = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((2048, 4096), jnp.bfloat16, sharding=on)
    w = jax.ShapeDtypeStruct((4096, 14336), jnp.bfloat16, sharding=on)
    direct = jax.jit(_grad).lower(x, w).compile().memory_analysis()

    ours = compile_for_target(_grad, (x, w), "v6e", compiler_options=CODEGEN_OPTIONS, cache=False).memory

    # buffer assignment runs before code generation: the same bytes, exactly
    assert (ours.argument_bytes, ours.output_bytes, ours.alias_bytes, ours.temp_bytes) == (
        direct.argument_size_in_bytes, direct.output_size_in_bytes, direct.alias_size_in_bytes,
        direct.temp_size_in_bytes)
    assert direct.temp_size_in_bytes > 0  # the program's temporaries are in HBM, so the check bites
    # the option's purpose: smaller windows, less code (measured 0.16 MB against 2.6 MB)
    assert ours.generated_code_bytes < direct.generated_code_size_in_bytes / 4


def test_a_program_the_small_windows_cannot_lower_is_compiled_without_them(monkeypatch):
    from tpu_debug.fit import sharded as fit_module
    from tpu_debug.runtime.target.compile import CODEGEN_OPTIONS, CompileError, MemoryStats, TargetCompile
    from tpu_debug.runtime.target.hardware import parse_target

    target = parse_target("v6e")
    refused = TargetCompile(target, "jit_step", 1.0,
                            error=CompileError("compile_error", "INTERNAL", "no window"))
    done = TargetCompile(target, "jit_step", 2.0, memory=MemoryStats(1, 2, 0, 3, 4))
    calls = []

    def fake(fn, args, tgt, **options):
        calls.append(options.get("compiler_options"))
        return refused if options.get("compiler_options") else done

    monkeypatch.setattr(fit_module, "compile_for_target", fake)
    result = fit_module.compile_fit(None, (), target, optimization_level=None, cache=False)
    assert calls == [CODEGEN_OPTIONS, None]
    assert result is done


def test_an_out_of_memory_is_an_answer_and_not_compiled_again(monkeypatch):
    from tpu_debug.fit import sharded as fit_module
    from tpu_debug.runtime.target.compile import CompileError, TargetCompile
    from tpu_debug.runtime.target.hardware import parse_target

    target = parse_target("v6e")
    error = CompileError("hbm_oom", "RESOURCE_EXHAUSTED", "Ran out of memory", None, 40, 31)
    oom = TargetCompile(target, "jit_step", 1.0, error=error)
    calls = []

    def fake(fn, args, tgt, **options):
        calls.append(options.get("compiler_options"))
        return oom

    monkeypatch.setattr(fit_module, "compile_for_target", fake)
    assert fit_module.compile_fit(None, (), target, optimization_level=None, cache=False) is oom
    assert len(calls) == 1


def test_the_capacity_probes_run_beside_the_step_and_their_failure_is_left_to_the_report(monkeypatch):
    import threading

    from tpu_debug.fit import answer
    from tpu_debug.runtime.target.hardware import parse_target

    seen = []

    def probe(tgt):
        seen.append((tgt.name, threading.current_thread() is threading.main_thread()))
        raise RuntimeError("no compiler")  # _report asks again, where it raises

    # answer imports hbm_capacity at module level: its name there is the one the thread calls
    monkeypatch.setattr(answer, "hbm_capacity", probe)
    answer._probe_capacity(parse_target("v5e-8"))
    for thread in threading.enumerate():
        if thread.name == "tpu_debug-fit-capacity":
            thread.join()
    assert seen == [("v5e-8", False)]
