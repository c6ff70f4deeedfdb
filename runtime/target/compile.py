"""Compile a JAX program for a TPU target on a machine without a TPU.

XLA's TPU compiler ships in libtpu and compiles for a described topology with
no device attached: ``jax.experimental.topologies`` gives compile-only TPU
devices, and a program lowered with its inputs placed on one of them compiles
through that compiler. The result is what the TPU would run: the optimized HLO
with TPU layouts (``f32[1000,100]{0,1:T(8,128)}``), the memory each device
needs, the compiler's cost model, or the compiler's refusal (an HBM
out-of-memory is an answer, not a crash).

Two ways in:

- ``compile_for_target(fn, abstract_args, target)``: the function is lowered
  again with ``jax.ShapeDtypeStruct`` inputs on the target's devices, so every
  primitive takes its TPU lowering rule (some differ per platform: cumulative
  sums, linear algebra) and shardings on a target mesh are honoured.
- ``compile_lowered_for_target(lowered, target)``: an existing lowering (the
  runtime keeps one per program, ``CompileInfo.lowered``, made for CPU) has its
  StableHLO compiled by the target's compiler. Nothing is traced again, so it
  is safe off the caller's thread for any program; a program whose CPU lowering
  holds a CPU-only custom call (LAPACK) is refused by the TPU compiler, and
  that refusal is the result.

Results are cached on disk (see ``cache``): the same program for the same
target with the same jax/libtpu is compiled once.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tpu_debug.core.buffers import BufferAssignment, read_dump
from tpu_debug.runtime.dtypes import to_jax_dtype
from tpu_debug.runtime.target import _libtpu, cache
from tpu_debug.runtime.target.errors import TargetError, TargetSpecError
from tpu_debug.runtime.target.hardware import Target, parse_target
from tpu_debug.runtime.target.results import (
    CompileError,
    CostStats,
    MemoryStats,
    TargetCompile,
    parse_compile_error,
)

__all__ = [
    "CODEGEN_OPTIONS",
    "MemoryStats",
    "CostStats",
    "CompileError",
    "TargetCompile",
    "compile_for_target",
    "compile_lowered_for_target",
    "parse_compile_error",
]


# -- options ------------------------------------------------------------------------

# Most of a big program's TPU compile at the default effort level is code generation
# (each fusion emitted as LLO, VLIW-scheduled, registers allocated: 76 of 84 s for a
# looped Llama-3-8B step), and a fusion's code grows with the VMEM windows its emitter
# picks under the lowering's VMEM limit. libtpu's scaling factor of 64 on that limit
# makes the emitters pick small windows (a 2048x4096 by 4096x14336 matmul fusion for
# v6e: a loop of 8,624 iterations instead of 56, 0.16 MB of code instead of 2.6): far
# less code, made in less than half the time, slower on a chip. Buffer assignment (HBM
# arguments, outputs, temporaries) is decided before code generation and stays the
# same; the code's own bytes shrink (docs/fit.md has the check). At 256 some fusions'
# tiny-window code outgrows an overlay and is emitted again up to three times (slower
# on Llama-3-70B). For answers that read memory, cost analysis and collectives, never
# for a program to run.
CODEGEN_OPTIONS: dict[str, Any] = {"xla_lowering_vmem_limit_scaling_factor": 64}


# -- results from a compiled executable ---------------------------------------------


def _memory(stats) -> MemoryStats:
    return MemoryStats(
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        generated_code_bytes=int(stats.generated_code_size_in_bytes),
        host_bytes=sum(int(getattr(stats, f"host_{part}_size_in_bytes", 0) or 0) * sign
                       for part, sign in (("argument", 1), ("output", 1), ("alias", -1), ("temp", 1))),
    )


def _cost(analysis) -> CostStats:
    if isinstance(analysis, (list, tuple)):  # one dict per module in some jax versions
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    optimal = analysis.get("optimal_seconds")
    return CostStats(
        flops=float(analysis.get("flops", 0.0)),
        transcendentals=float(analysis.get("transcendentals", 0.0)),
        bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
        optimal_seconds=None if optimal is None or optimal < 0 else float(optimal),
    )


_MODULE_NAME = re.compile(r"^module @([\w.\-]+)", re.MULTILINE)


def _module_name(stablehlo: str) -> str:
    m = _MODULE_NAME.search(stablehlo)
    return m.group(1) if m else "program"


def _is_compile_failure(exc: BaseException) -> bool:
    """An error raised by the XLA compiler itself (as opposed to tracing or lowering): jax raises
    a Pallas kernel's refusal by the Mosaic compiler again as a ``MosaicError`` whose traceback
    is the kernel's lines."""
    if isinstance(exc, jax.errors.JaxRuntimeError):
        return True
    try:
        from jax._src.pallas.mosaic.error_handling import MosaicError
    except ImportError:  # a jax without Pallas' TPU lowering raises none
        return False
    return isinstance(exc, MosaicError)


def _compiler_text(exc: BaseException) -> str:
    """The compiler's own message: a ``MosaicError``'s has its MLIR location taken out (the kernel's
    line), which the compiler's error it was raised from still holds."""
    for cause in (exc.__cause__, exc.__context__):
        if isinstance(cause, jax.errors.JaxRuntimeError) and "at location: loc(" in str(cause):
            return str(cause)
    return str(exc)


def _kernel_call(hlo: str | None, error: CompileError, text: str) -> CompileError:
    """A Mosaic refusal (E2xxx) points at an operation inside a Pallas kernel: the instruction it
    is about is that kernel's custom call, the only one in the module or the one whose kernel
    (its serialized MLIR, with its locations) names the refused operation, its function and its
    file; None when that leaves more than one."""
    if error.instruction is not None or hlo is None or not (error.code or "").startswith("E2"):
        return error
    calls = [(m.group(1), m.group(2) or "") for m in _KERNEL_CALL.finditer(hlo)]
    if len(calls) > 1:
        op = _LOC_OP.search(text)
        wanted = [w.encode() for w in (error.source_file, error.source_function, op and op.group(1)) if w]
        calls = [(name, body) for name, body in calls if _names(body, wanted)]
    return dataclasses.replace(error, instruction=calls[0][0]) if len(calls) == 1 else error


# a kernel's custom call, and its serialized MLIR ("body" of its backend config)
_KERNEL_CALL = re.compile(r'%([\w.\-]+) = [^\n]*?custom_call_target="tpu_custom_call"'
                          r'(?:[^\n]*?"body":"([A-Za-z0-9+/=]+)")?')
# the operation a Mosaic location names: 'at location: loc("dot_general:"("dot_general/dot_general"'
_LOC_OP = re.compile(r'at location: loc\("[^"]*"\("([^"]+)"')


def _names(body: str, wanted: list[bytes]) -> bool:
    """The kernel's serialized MLIR holds each of ``wanted`` as one of its strings."""
    try:
        raw = base64.b64decode(body)
    except ValueError:
        return False
    return all(b"\0" + w + b"\0" in raw for w in wanted)


# -- the two entry points ------------------------------------------------------------


def _to_abstract(leaf, sharding):
    if isinstance(leaf, jax.ShapeDtypeStruct):
        placed = leaf.sharding is not None and all(d.platform == "tpu" for d in leaf.sharding.device_set)
        if placed:  # already on the target (a mesh sharding the caller built)
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding, weak_type=leaf.weak_type)
    if type(leaf).__module__.startswith("torch") and hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
        # the dtype table imports torch, which a JAX-only caller of the target compiler never loads
        return jax.ShapeDtypeStruct(tuple(leaf.shape), to_jax_dtype(leaf.dtype), sharding=sharding)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)
    return leaf  # a Python scalar: jit abstracts it itself


def _x64(x64: bool | None):
    return contextlib.nullcontext() if x64 is None else jax.enable_x64(x64)


def compile_for_target(
    fn,
    abstract_args: tuple | list = (),
    target: str | Target = "v5e",
    *,
    abstract_kwargs: dict | None = None,
    static_argnums: tuple[int, ...] = (),
    donate_argnums: tuple[int, ...] = (),
    x64: bool | None = None,
    optimization_level: str | None = None,
    compiler_options: dict[str, Any] | None = None,
    cache: bool = True,
) -> TargetCompile:
    """Compile ``fn`` for a TPU target, with inputs that hold no data.

    Args:
        fn: a ``jax.jit``-wrapped function, or a plain function (jitted here with
            ``static_argnums`` and ``donate_argnums``).
        abstract_args: the positional inputs: ``jax.ShapeDtypeStruct``s, arrays or
            tensors (only their shapes and dtypes are used), pytrees of them, or the
            static values at ``static_argnums``. Inputs without a TPU sharding are
            placed on the target's first device; a ``ShapeDtypeStruct`` whose sharding
            is on the target's devices (``target_mesh``) keeps it.
        target: a spec (``"v5e"``, ``"v6e-8"``, ``"v5e:2x2"``) or a ``Target``.
        abstract_kwargs: keyword inputs, treated like ``abstract_args``.
        static_argnums: positions of ``abstract_args`` that are static values.
        donate_argnums: inputs whose buffers the program may reuse (plain ``fn`` only).
        x64: lower with 64-bit types on (True) or off (False); None keeps the
            calling thread's setting.
        optimization_level: XLA's effort level, ``"O0"`` to ``"O3"``; None is the
            compiler's default. ``"O0"`` compiles a big program an order of
            magnitude faster with nearly the same buffers (a 7B Llama forward for
            v6e: temporaries within 0.3%; 2 of its 32 layers: 2.5 instead of 35 CPU
            seconds) but less optimized code: its cost analysis is not the default's.
        cache: read and write the on-disk result cache.

    Returns:
        A ``TargetCompile``: the TPU HLO, memory and cost, or the compiler's error
        (an HBM out-of-memory parsed into required and available bytes).

    Raises:
        TargetSpecError: ``target`` names no known TPU.
        LibtpuMissingError: libtpu is not installed (the message says what to install).
        Exception: whatever tracing or lowering ``fn`` raises.

    Example::

        x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
        result = compile_for_target(lambda a: a @ a, (x,), "v5e")
        result.memory.argument_bytes, result.cost.flops
        # (134217728, 1099511627776.0)
    """
    tgt = parse_target(target)
    level = _level(optimization_level)
    devices = _libtpu.topology(tgt)
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    statics = set(static_argnums)
    args = [
        a if i in statics else jax.tree_util.tree_map(lambda leaf: _to_abstract(leaf, sharding), a)
        for i, a in enumerate(abstract_args)
    ]
    kwargs = jax.tree_util.tree_map(lambda leaf: _to_abstract(leaf, sharding), dict(abstract_kwargs or {}))
    jitted = fn if hasattr(fn, "lower") and hasattr(fn, "trace") else jax.jit(
        fn, static_argnums=static_argnums, donate_argnums=donate_argnums
    )
    with _x64(x64):
        lowered = jitted.lower(*args, **kwargs)
        text = lowered.as_text()
    key = _cache_key("jit", text, tgt, level, compiler_options)
    return _compile(tgt, _module_name(text), key, cache, lambda options: _compile_jit(lowered, options),
                    level, compiler_options)


def _compile_jit(lowered, options: dict[str, Any]):
    # JAX's persistent cache cannot read a deviceless TPU executable back (see cache.py):
    # if the user has it on, this compile writes nothing there (a thread-local setting)
    from jax._src import config as jax_config

    with jax_config.persistent_cache_min_compile_time_secs(float("inf")):
        compiled = lowered.compile(compiler_options=options)
    return compiled.memory_analysis(), compiled.cost_analysis(), compiled.as_text


_NUM = re.compile(r"mhlo\.num_(partitions|replicas) = (\d+)")


def compile_lowered_for_target(lowered, target: str | Target = "v5e", *,
                               optimization_level: str | None = None, cache: bool = True) -> TargetCompile:
    """Compile an existing lowering (made for any platform) for a TPU target.

    The lowering's StableHLO goes to the target's compiler as it is: the program
    is not traced again. A program lowered for N devices (``mhlo.num_partitions``)
    is placed on the target's first N devices.

    Args:
        lowered: a ``jax.stages.Lowered`` (``jax.jit(f).lower(...)``; the runtime's
            ``CompileInfo.lowered``).
        target: a spec (``"v5e"``, ``"v6e-8"``) or a ``Target``.
        optimization_level: XLA's effort level (see ``compile_for_target``).
        cache: read and write the on-disk result cache.

    Returns:
        A ``TargetCompile`` (see ``compile_for_target``). A CPU-only custom call in
        the lowering (LAPACK's, say) is a ``compile_error``.

    Raises:
        TargetSpecError: ``target`` names no known TPU, or has fewer devices than the
            program was lowered for.
        LibtpuMissingError: libtpu is not installed.

    Example::

        lowered = jax.jit(jnp.sin).lower(jnp.ones((1000, 100)))   # on CPU
        compile_lowered_for_target(lowered, "v6e").hlo.count("T(8,128)") > 0
        # True
    """
    tgt = parse_target(target)
    level = _level(optimization_level)
    devices = _libtpu.topology(tgt)
    text = lowered.as_text()
    counts = {k: int(v) for k, v in _NUM.findall(text[:4000])}
    replicas, partitions = counts.get("replicas", 1), counts.get("partitions", 1)
    if replicas * partitions > len(devices):
        raise TargetSpecError(
            f"the program was lowered for {replicas * partitions} devices; target {tgt.name} has "
            f"{len(devices)}: pick a slice with at least that many (e.g. a bigger {tgt.generation.name}-N)"
        )
    key = _cache_key("lowered", text, tgt, level)
    return _compile(tgt, _module_name(text), key, cache,
                    lambda options: _compile_module(lowered, devices, replicas, partitions, options), level)


def _compile_module(lowered, devices, replicas: int, partitions: int, options: dict[str, Any]):
    # jax has no public call that compiles a given module for given devices: the
    # compile-only TPU client of the topology's devices does it (jax's own deviceless
    # path ends in the same client.compile)
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    used = list(devices[: replicas * partitions])
    options = compiler.get_compile_options(
        num_replicas=replicas,
        num_partitions=partitions,
        device_assignment=np.array(used, dtype=object).reshape(replicas, partitions),
        env_options_overrides=options,
    )
    executable = used[0].client.compile(
        lowered.compiler_ir("stablehlo"), executable_devices=xc.DeviceList(tuple(used)),
        compile_options=options,
    )

    def text() -> str:
        return "\n\n".join(m.to_string() for m in executable.hlo_modules())

    return executable.get_compiled_memory_stats(), executable.cost_analysis(), text


# -- compile, through the cache ------------------------------------------------------


_LEVELS = ("O0", "O1", "O2", "O3")


def _level(level: str | None) -> str | None:
    if level is not None and level not in _LEVELS:
        raise TargetError(
            f"optimization_level={level!r} is not one of {', '.join(_LEVELS)} (or None for XLA's default)"
        )
    return level


def _cache_key(kind: str, text: str, target: Target, level: str | None,
               options: dict[str, Any] | None = None) -> str:
    import jaxlib

    h = hashlib.sha256()
    extra = [repr(sorted(options.items()))] if options else []  # none: the key it always had
    for part in (kind, target.topology, str(level), jax.__version__, jaxlib.__version__,
                 _libtpu.libtpu_version(), *extra, text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _dump_options(directory: str) -> dict[str, Any]:
    # the optimized HLO as libtpu itself prints it: jaxlib's reading of a libtpu
    # executable's HLO (``Compiled.as_text``) fails on big programs ("RET_CHECK failure
    # ... async-update instruction should have 1 operands but sees 3" with libtpu 0.0.52,
    # whose async ops are newer than jaxlib 0.10.2's HLO reader); the dump reads the same
    # with any libtpu and is a few MB at most
    # (the proto of the optimized module, with its buffer assignment and heap-simulator traces,
    # is what xprof's memory viewer reads: kept as ``TargetCompile.hlo_proto``)
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True, "xla_dump_hlo_as_proto": True}


def _effort(level: str | None):
    # jax's compile options read the level from its config (thread-local inside this block)
    from jax._src import config as jax_config

    return contextlib.nullcontext() if level is None else jax_config.optimization_level(level)


def _read_dump(directory: str, stage: str = "after_optimizations") -> str | None:
    texts = [p.read_text() for p in sorted(Path(directory).glob(f"*.{stage}.txt"))]
    return "\n\n".join(texts) if texts else None


def _read_proto(directory: str) -> bytes | None:
    protos = sorted(Path(directory).glob("*.after_optimizations.hlo.pb"))
    return protos[-1].read_bytes() if protos else None


def _compile(target: Target, program: str, key: str, use_cache: bool, run,
             level: str | None, options: dict[str, Any] | None = None) -> TargetCompile:
    if use_cache:
        hit = _from_record(cache.load_record(key), target)
        if hit is not None:
            return hit
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tpu_debug-target-") as dump:
        try:
            with _effort(level):
                memory, cost, text = run({**_dump_options(dump), **(options or {})})
        except Exception as exc:  # noqa: BLE001 - only the compiler's own refusals become results
            if not _is_compile_failure(exc):
                raise
            # an HBM refusal still dumps the module and the buffer assignment it gave up on; a
            # refusal before optimization ends (a kernel's, by Mosaic) the module it was given
            hlo = _read_dump(dump) or _read_dump(dump, "before_optimizations")
            result = TargetCompile(target, program, time.perf_counter() - start, hlo=hlo,
                                   error=_kernel_call(hlo, parse_compile_error(text := _compiler_text(exc)), text),
                                   buffers=read_dump(dump), hlo_proto=_read_proto(dump))
        else:
            seconds = time.perf_counter() - start
            hlo = _read_dump(dump)
            if hlo is None:
                hlo = text()
            result = TargetCompile(target, program, seconds, hlo=hlo, memory=_memory(memory),
                                   cost=_cost(cost), buffers=read_dump(dump), hlo_proto=_read_proto(dump))
    # a compile error other than an out-of-memory may come from this machine (libtpu's
    # lock, a plugin that failed to load) rather than the program: not kept
    if use_cache and (result.ok or result.error.kind == "hbm_oom"):
        cache.store_record(key, _record(result))
    return result


def _record(result: TargetCompile) -> dict[str, Any]:
    """``result`` as the JSON data the on-disk cache keeps (``cache.py``)."""
    return {
        "target": result.target.topology,
        "program": result.program,
        "seconds": result.seconds,
        "hlo": result.hlo,
        "memory": dataclasses.asdict(result.memory) if result.memory else None,
        "cost": dataclasses.asdict(result.cost) if result.cost else None,
        "error": dataclasses.asdict(result.error) if result.error else None,
        "buffers": result.buffers.to_record() if result.buffers is not None else None,
        "hlo_proto": base64.b64encode(result.hlo_proto).decode() if result.hlo_proto else None,
    }


def _from_record(data: dict | None, target: Target) -> TargetCompile | None:
    """The result a cache record holds, or None for a miss or a record of another shape (one
    kept before results held their buffer assignment is a miss: compiled again, it gains one;
    a refusal kept before refusals carried their XLA error code is a miss too)."""
    if data is None or "buffers" not in data or (data.get("error") and "instruction" not in data["error"]):
        return None
    try:
        return TargetCompile(
            target=target,
            program=data["program"],
            seconds=float(data["seconds"]),
            hlo=data["hlo"],
            memory=MemoryStats(**data["memory"]) if data["memory"] else None,
            cost=CostStats(**data["cost"]) if data["cost"] else None,
            error=CompileError(**data["error"]) if data["error"] else None,
            cached=True,
            buffers=BufferAssignment.from_record(data["buffers"]) if data["buffers"] else None,
            hlo_proto=base64.b64decode(data["hlo_proto"]) if data.get("hlo_proto") else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


def target_mesh(target: str | Target, shape: tuple[int, ...], axis_names: tuple[str, ...]) -> Any:
    """A ``jax.sharding.Mesh`` over the target's devices, for sharded abstract inputs.

    Args:
        target: a spec or ``Target``.
        shape: the mesh shape; its product is the number of devices used.
        axis_names: one name per mesh axis.

    Raises:
        TargetSpecError: the target has fewer devices than the mesh.
        LibtpuMissingError: libtpu is not installed.

    Example::

        mesh = target_mesh("v5e-4", (4,), ("data",))
        x = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    """
    import math

    tgt = parse_target(target)
    devices = _libtpu.topology(tgt)
    n = math.prod(shape)
    if n > len(devices):
        raise TargetSpecError(
            f"a {'x'.join(map(str, shape))} mesh needs {n} devices; target {tgt.name} has {len(devices)}: "
            "pick a bigger slice or a smaller mesh"
        )
    return jax.sharding.Mesh(np.array(devices[:n], dtype=object).reshape(shape), axis_names)
