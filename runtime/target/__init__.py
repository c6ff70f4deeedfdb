"""Compile for a real TPU target without a TPU: XLA's TPU compiler, from libtpu, deviceless.

``compile_for_target(fn, abstract_args, "v6e")`` gives the TPU's optimized HLO,
per-device memory and the compiler's cost analysis (or its HBM out-of-memory,
as data); ``compile_lowered_for_target`` does the same for an existing
lowering; ``compile_for_target_async`` runs either on a worker thread.
``padding_report`` reads what TPU tiles pad, ``roofline`` places a program on
its target's roofline (float32 dots at their bf16 passes, ``dot_flops``),
``usable_hbm_bytes`` is the HBM the compiler offers one device, ``dry_run`` compiles a PyTorch model's inference or
training step with tensors that hold no data.

Importing this package loads nothing from libtpu and sets no environment
variable; the first target compile does both (``pip install "tpu-debug[tpu]"``).
"""

from __future__ import annotations

from tpu_debug.runtime.target.capacity import hbm_capacity, usable_hbm_bytes
from tpu_debug.runtime.target.compile import (
    CompileError,
    CostStats,
    MemoryStats,
    TargetCompile,
    compile_for_target,
    compile_lowered_for_target,
    parse_compile_error,
    target_mesh,
)
from tpu_debug.runtime.target.dryrun import AdamW, DryRun, TracedStep, dry_run, trace_step
from tpu_debug.runtime.target.errors import LibtpuMissingError, TargetError, TargetSpecError
from tpu_debug.runtime.target.executor import (
    TargetCompiler,
    compile_for_target_async,
    compile_lowered_for_target_async,
    default_compiler,
)
from tpu_debug.runtime.target._libtpu import libtpu_version, require_libtpu, topology
from tpu_debug.runtime.target.hardware import GENERATIONS, Generation, Target, parse_target
from tpu_debug.runtime.target.layout import (
    Buffer,
    PaddingReport,
    TiledLayout,
    padded_bytes,
    padding_report,
    parse_layout,
)
from tpu_debug.runtime.target.precision import PASSES, DotFlops, dot_flops
from tpu_debug.runtime.target.roofline import Roofline, roofline

__all__ = [
    "Target",
    "Generation",
    "GENERATIONS",
    "parse_target",
    "compile_for_target",
    "compile_lowered_for_target",
    "compile_for_target_async",
    "compile_lowered_for_target_async",
    "target_mesh",
    "TargetCompiler",
    "default_compiler",
    "TargetCompile",
    "MemoryStats",
    "CostStats",
    "CompileError",
    "parse_compile_error",
    "TiledLayout",
    "Buffer",
    "PaddingReport",
    "parse_layout",
    "padded_bytes",
    "padding_report",
    "Roofline",
    "roofline",
    "PASSES",
    "DotFlops",
    "dot_flops",
    "usable_hbm_bytes",
    "hbm_capacity",
    "DryRun",
    "dry_run",
    "TracedStep",
    "trace_step",
    "AdamW",
    "TargetError",
    "TargetSpecError",
    "LibtpuMissingError",
    "require_libtpu",
    "topology",
    "libtpu_version",
]
