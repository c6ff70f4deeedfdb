"""Compiling for a TPU target on a CPU-only machine: results, errors, the cache, the worker thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tpu_debug.runtime import probes
from tpu_debug.runtime.target import (
    LibtpuMissingError,
    TargetCompiler,
    TargetError,
    TargetSpecError,
    compile_for_target,
    compile_for_target_async,
    compile_lowered_for_target,
    parse_compile_error,
    parse_target,
    target_mesh,
)
from tpu_debug.runtime.target import cache as target_cache
from tpu_debug.runtime.target._libtpu import _find_libtpu

requires_libtpu = pytest.mark.skipif(
    not _find_libtpu(), reason='needs libtpu (XLA\'s TPU compiler): pip install -e ".[tpu]"; CI installs it'
)
GiB = 1024**3


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "target-cache"
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(path))
    return path


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


# -- results ---------------------------------------------------------------------------


@pytest.mark.quick
@requires_libtpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_flops_are_2mnk_from_the_tpu_cost_analysis(dtype):
    m, k, n = 256, 512, 384
    result = compile_for_target(lambda a, b: a @ b, (sds((m, k), dtype), sds((k, n), dtype)), "v5e")
    assert result.ok and result.fits and result.program.startswith("jit_")
    # XLA counts a dot as one multiply and one add per (i, j, k): on logical shapes, not tiles
    assert result.cost.flops == 2 * m * n * k
    itemsize = jnp.dtype(dtype).itemsize
    assert result.cost.bytes_accessed >= (m * k + k * n + m * n) * itemsize  # at least each operand once
    # 256x512, 512x384, 256x384 are whole (8,128) tiles: no padding in the buffers
    assert result.memory.argument_bytes == (m * k + k * n) * itemsize
    assert result.memory.output_bytes == m * n * itemsize
    assert "HloModule" in result.hlo and "T(8,128)" in result.hlo
    assert result.seconds > 0 and not result.cached


@requires_libtpu
def test_a_program_too_big_for_hbm_is_an_answer_not_a_crash():
    x = sds((70_000, 70_000))  # 18.3 GiB in, 18.3 GiB out: more than a v5e's 16 GiB
    result = compile_for_target(lambda a: a @ a, (x,), "v5e")
    assert not result.ok and result.fits is False
    e = result.error
    assert (e.kind, e.status) == ("hbm_oom", "RESOURCE_EXHAUSTED")
    # libtpu prefixes its error id or not depending on how it was initialized in the process
    assert e.code in (None, "E1000: CompileTimeHbmOom")
    assert e.what == "HLO temporaries"
    assert e.required_bytes > 2 * 70_000**2 * 4 * 0.99  # the compiler prints two decimals of GiB
    assert 15 * GiB < e.available_bytes <= 16 * GiB
    assert e.excess_bytes == e.required_bytes - e.available_bytes
    # no memory statistics for a program that did not compile, but the module it refused and the
    # buffer assignment it gave up on are kept (peak memory reads them): the assignment adds up to
    # the compiler's figure, which it prints to two decimals of GiB
    assert result.memory is None and result.cost is None
    assert "HloModule jit__lambda" in result.hlo and "f32[70000,70000]" in result.hlo
    assert abs(result.buffers.total() - e.required_bytes) <= 0.005 * GiB
    # the same program fits a v5p chip's 95 GiB
    assert compile_for_target(lambda a: a @ a, (x,), "v5p").fits


def test_parse_compile_error_reads_both_oom_forms():
    e = parse_compile_error(
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
        "for HLO temporaries (36.52G) exceeds available HBM (15.75G). HLO module: jit__lambda.\nSee https://..."
    )
    assert (e.kind, e.code, e.what) == ("hbm_oom", "E1000: CompileTimeHbmOom", "HLO temporaries")
    assert (e.required_bytes, e.available_bytes) == (int(36.52 * GiB), int(15.75 * GiB))
    assert "\n" not in e.message
    e = parse_compile_error("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
                            "memory space hbm. Used 20.50G of 15.48G hbm. Exceeded hbm capacity by 5.02G.")
    assert (e.kind, e.required_bytes, e.available_bytes) == ("hbm_oom", int(20.5 * GiB), int(15.48 * GiB))
    e = parse_compile_error("INVALID_ARGUMENT: Custom emitter for lapack_spotrf_ffi not found")
    assert (e.kind, e.status, e.required_bytes) == ("compile_error", "INVALID_ARGUMENT", None)


@requires_libtpu
def test_an_existing_cpu_lowering_compiles_for_the_target():
    fn = lambda a, b: jnp.tanh(a @ b)  # noqa: E731
    a, b = np.ones((1000, 100), np.float32), np.ones((100, 256), np.float32)
    lowered = jax.jit(fn).lower(a, b)  # on this machine's CPU
    from_lowering = compile_lowered_for_target(lowered, "v6e")
    relowered = compile_for_target(fn, (a, b), "v6e")
    assert from_lowering.ok and relowered.ok
    assert from_lowering.memory == relowered.memory
    assert from_lowering.cost.flops == relowered.cost.flops == 2 * 1000 * 100 * 256
    assert "T(8,128)" in from_lowering.hlo


@requires_libtpu
def test_a_cpu_only_custom_call_is_refused_and_relowering_fixes_it():
    fn = lambda a: jnp.linalg.cholesky(a @ a.T + 64 * jnp.eye(64))  # noqa: E731
    lowered = jax.jit(fn).lower(np.ones((64, 64), np.float32))
    assert "lapack" in lowered.as_text()  # CPU's lowering calls LAPACK
    refused = compile_lowered_for_target(lowered, "v5e")
    assert refused.error.kind == "compile_error" and "lapack" in refused.error.message
    assert compile_for_target(fn, (sds((64, 64)),), "v5e").ok  # TPU's own lowering of cholesky


class _Programs:
    def __init__(self):
        self.infos = []

    def on_compile(self, info):
        self.infos.append(info)


@requires_libtpu
def test_every_program_the_runtime_compiles_retargets(tpu):
    # the runtime keeps each program's CPU lowering (CompileInfo.lowered): eager ops and a
    # compiled training step all compile for a TPU as they are
    import tpu_debug

    model = torch.nn.Sequential(torch.nn.Linear(100, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).to(tpu)
    x, y = torch.randn(3, 100, device=tpu), torch.randint(0, 10, (3,), device=tpu)
    seen = _Programs()
    probes.subscribe(seen)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()

        def step(x, y):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss.detach()

        tpu_debug.compile(step)(x, y)
    finally:
        probes.unsubscribe(seen)
    modes = {info.mode for info in seen.infos}
    assert modes == {"eager", "compiled"}, modes
    for info in seen.infos:
        result = compile_lowered_for_target(info.lowered, "v5e")
        assert result.ok, (info.name, result.error)
        assert result.hlo.startswith("HloModule")


@requires_libtpu
def test_a_mesh_of_target_devices_shards_and_inserts_collectives():
    mesh = target_mesh("v5e-4", (4,), ("data",))
    x = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
    result = compile_for_target(lambda x, w: jnp.sum(x @ w, axis=0), (x, w), "v5e-4")
    assert result.ok
    assert " all-reduce(" in result.hlo
    assert result.memory.argument_bytes == (16 * 512 + 512 * 256) * 4  # per device: a quarter of x
    assert result.cost.flops == pytest.approx(2 * 16 * 512 * 256, rel=0.01)  # per device, plus the sum
    # that lowering is for 4 devices: a single chip cannot take it
    lowered = jax.jit(lambda x, w: jnp.sum(x @ w, axis=0)).lower(x, w)
    with pytest.raises(TargetSpecError, match="the program was lowered for 4 devices; target v5e has 1"):
        compile_lowered_for_target(lowered, "v5e")
    with pytest.raises(TargetSpecError, match="a 8 mesh needs 8 devices; target v5e-4 has 4"):
        target_mesh("v5e-4", (8,), ("data",))


@requires_libtpu
def test_x64_decides_whether_int64_stays_64_bit():
    entry = {}
    for x64 in (True, False):
        result = compile_for_target(lambda t: t + 1, (sds((8,), jnp.int64),), "v5e", x64=x64)
        entry[x64] = next(line for line in result.hlo.splitlines() if "entry_computation_layout" in line)
    assert "s64[8]" in entry[True] and "s32[8]" in entry[False]


@requires_libtpu
def test_static_args_and_torch_tensors_as_abstract_inputs():
    def fn(x, n):
        return jnp.tile(x, n)

    x = torch.empty(4, 128, dtype=torch.bfloat16)
    result = compile_for_target(fn, (x, 3), "v5e", static_argnums=(1,))
    assert result.ok and result.memory.output_bytes == 12 * 128 * 2


@requires_libtpu
def test_a_tracing_error_is_raised_not_recorded():
    def broken(x):
        raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        compile_for_target(broken, (sds((4,)),), "v5e")


# -- cache -----------------------------------------------------------------------------


@requires_libtpu
def test_the_cache_answers_the_same_program_again(cache_dir):
    args = (sds((512, 512)), sds((512, 512)))
    first = compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v6e")
    files = list(cache_dir.glob("*.json.z"))
    assert len(files) == 1 and not first.cached
    second = compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v6e")
    assert second.cached
    assert (second.hlo, second.memory, second.cost, second.seconds, second.program) == (
        first.hlo, first.memory, first.cost, first.seconds, first.program)
    # another target is another entry
    assert not compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v5e").cached
    # a damaged file is a miss, and is replaced
    files[0].write_bytes(b"not zlib")
    again = compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v6e")
    assert not again.cached and again.memory == first.memory
    assert zlib.decompress(files[0].read_bytes())


@requires_libtpu
def test_an_out_of_memory_is_cached_and_the_cache_can_be_off(cache_dir, monkeypatch):
    x = (sds((70_000, 70_000)),)
    assert not compile_for_target(lambda a: a @ a, x, "v5e").cached
    hit = compile_for_target(lambda a: a @ a, x, "v5e")
    assert hit.cached and hit.error.kind == "hbm_oom"
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", "off")
    assert not compile_for_target(lambda a: a @ a, x, "v5e").cached
    assert not compile_for_target(lambda a: a @ a, x, "v5e", cache=True).cached


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", str(tmp_path / "c"))
    assert target_cache.cache_dir() == tmp_path / "c"
    for off in ("0", "off", "false", "No"):
        monkeypatch.setenv("TPU_DEBUG_TARGET_CACHE", off)
        assert target_cache.cache_dir() is None
    monkeypatch.delenv("TPU_DEBUG_TARGET_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert target_cache.cache_dir() == tmp_path / "xdg" / "tpu_debug" / "target"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert target_cache.cache_dir() == tmp_path / "home" / ".cache" / "tpu_debug" / "target"


# -- without libtpu --------------------------------------------------------------------


def test_without_libtpu_the_target_api_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
    expected = ('compiling for a TPU target needs libtpu, which is not installed: '
                'pip install "tpu-debug[tpu]" (from a clone: pip install -e ".[tpu]")')
    with pytest.raises(LibtpuMissingError, match="needs libtpu") as info:
        compile_for_target(lambda a: a, (sds((4,)),), "v5e")
    assert str(info.value) == expected
    with pytest.raises(LibtpuMissingError, match=r"pip install -e \"\.\[tpu\]\""):
        compile_lowered_for_target(jax.jit(jnp.sin).lower(np.ones(3, np.float32)), "v6e")
    with pytest.raises(LibtpuMissingError, match="needs libtpu"):  # on the calling thread, not in the future
        TargetCompiler().submit(lambda a: a, (sds((4,)),), parse_target("v5e"))
    with pytest.raises(LibtpuMissingError, match="needs libtpu"):
        target_mesh("v5e-4", (4,), ("d",))


def test_importing_the_target_api_sets_no_environment_and_loads_no_libtpu():
    # ``import jax`` sets TPU_LIBRARY_PATH and TPU_SKIP_MDS_QUERY itself when libtpu is
    # installed: the baseline is the environment after ``import jax``
    code = (
        "import os\n"
        "import jax\n"
        "before = dict(os.environ)\n"
        "import tpu_debug.runtime.target as t\n"
        "from jax._src.lib import xla_client\n"
        "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))\n"
        "print(changed, xla_client.pjrt_plugin_loaded('tpu'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "ALLOW_MULTIPLE_LIBTPU"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[] False"


# -- off the calling thread -----------------------------------------------------------


@requires_libtpu
def test_async_compile_runs_on_the_worker_and_matches_the_synchronous_one():
    threads = []

    def fn(a, b):
        threads.append(threading.current_thread().name)  # runs while tracing
        return jnp.tanh(a @ b)

    args = (sds((256, 256)), sds((256, 256)))
    future = compile_for_target_async(fn, args, "v5e", cache=False)
    result = future.result(timeout=600)
    assert threads and all(name.startswith("tpu_debug-target") for name in threads)
    sync = compile_for_target(fn, args, "v5e", cache=False)
    assert (result.memory, result.cost) == (sync.memory, sync.cost)


@requires_libtpu
def test_async_compile_carries_the_callers_x64_setting():
    compiler = TargetCompiler()
    try:
        with jax.enable_x64(True):
            wide = compiler.submit(lambda t: t + 1, (sds((8,), jnp.int64),), parse_target("v5e"), cache=False)
        narrow = compiler.submit(lambda t: t + 1, (sds((8,), jnp.int64),), parse_target("v5e"), cache=False)
        assert "s64[8]" in wide.result(timeout=600).hlo
        assert "s64[8]" not in narrow.result(timeout=600).hlo
        lowered = jax.jit(jnp.sin).lower(np.ones((8, 128), np.float32))
        assert compiler.submit_lowered(lowered, parse_target("v6e"), cache=False).result(timeout=600).ok
    finally:
        compiler.shutdown()


@requires_libtpu
def test_async_errors_arrive_through_the_future():
    def broken(x):
        raise ValueError("user bug")

    with pytest.raises(TargetSpecError, match="v9"):  # a wrong spec fails where it was written
        compile_for_target_async(broken, (sds((4,)),), "v9")
    future = compile_for_target_async(broken, (sds((4,)),), parse_target("v5e"))
    assert isinstance(future.exception(timeout=600), ValueError)


@requires_libtpu
def test_the_effort_level_is_the_callers_choice(cache_dir):
    args = (sds((1024, 512)), sds((512, 256)))
    fast = compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v5e", optimization_level="O0")
    full = compile_for_target(lambda a, b: jnp.tanh(a @ b), args, "v5e")
    assert fast.ok and full.ok and not full.cached  # another level is another cache entry
    # the same inputs and outputs in the same layouts; only the code differs
    assert (fast.memory.argument_bytes, fast.memory.output_bytes) == (full.memory.argument_bytes,
                                                                      full.memory.output_bytes)
    assert fast.cost.flops == full.cost.flops == 2 * 1024 * 512 * 256
    with pytest.raises(TargetError, match=r"optimization_level='fast' is not one of O0, O1, O2, O3"):
        compile_for_target(lambda a: a, (sds((4,)),), "v5e", optimization_level="fast")


@requires_libtpu
def test_compiles_still_queued_at_exit_are_dropped(tmp_path):
    # the first compile holds the worker until the exit hook has shut the pool down, so
    # the other eleven are still queued when the program ends: they must not run
    log = tmp_path / "traced.txt"
    code = (
        "import sys, time, jax, jax.numpy as jnp\n"
        "from tpu_debug.runtime.target import TargetCompiler, parse_target\n"
        "compiler = TargetCompiler()\n"
        "def make(i):\n"
        "    def fn(a):\n"
        "        with open(sys.argv[1], 'a') as f:\n"
        "            f.write(f'{i}\\n')\n"
        "        for _ in range(600):\n"
        "            if i or compiler._pool._shutdown:\n"
        "                break\n"
        "            time.sleep(0.1)\n"
        "        return a * i\n"
        "    return fn\n"
        "x = jax.ShapeDtypeStruct((8,), jnp.float32)\n"
        "futures = [compiler.submit(make(i), (x,), parse_target('v5e'), cache=False) for i in range(12)]\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    assert log.read_text().split() == ["0"]


@requires_libtpu
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_worker_yields_the_cpu_to_the_program():
    seen = []

    def fn(a):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return a + 1

    compiler = TargetCompiler()
    try:
        assert compiler.submit(fn, (sds((8,)),), parse_target("v5e"), cache=False).result(timeout=600).ok
    finally:
        compiler.shutdown()
    assert seen and seen[0] >= min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
