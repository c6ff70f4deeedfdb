"""Compile for a real TPU target without a TPU: XLA's TPU compiler, from libtpu, deviceless.

``compile_for_target(fn, abstract_args, "v6e")`` gives the TPU's optimized HLO,
per-device memory and the compiler's cost analysis (or its HBM out-of-memory,
as data); ``compile_lowered_for_target`` does the same for an existing
lowering; ``compile_for_target_async`` runs either on a worker thread.
``padding_report`` reads what TPU tiles pad, ``roofline`` places a program on
its target's roofline (float32 dots at their bf16 passes, ``dot_flops``),
``usable_hbm_bytes`` is the HBM the compiler offers one device. A PyTorch model's step,
compiled for a target with tensors that hold no data, is ``tpu_debug.fit.compile_step``.

Importing this package loads nothing from libtpu, sets no environment variable and imports
neither torch nor jax: each name imports its module on first use, and the first target
compile loads libtpu (``pip install "tpu-debug[tpu]"``).
"""

from __future__ import annotations

# ``roofline`` names the function and its module: imported here, the function is bound after
# the module and stays the package's attribute (a lazy name would lose it to a later import of
# the module)
from tpu_debug.core.autoload import lazy_exports
from tpu_debug.runtime.target.errors import LibtpuMissingError, TargetError, TargetSpecError
from tpu_debug.runtime.target.hardware import GENERATIONS, Generation, Target, parse_target
from tpu_debug.runtime.target.precision import PASSES, DotFlops, dot_flops
from tpu_debug.runtime.target.results import (
    CompileError,
    CostStats,
    MemoryStats,
    TargetCompile,
    parse_compile_error,
)
from tpu_debug.runtime.target.roofline import Roofline, roofline

__all__ = [
    "GENERATIONS",
    "PASSES",
    "Buffer",
    "CompileError",
    "CostStats",
    "DotFlops",
    "Generation",
    "LibtpuMissingError",
    "MemoryStats",
    "PaddingReport",
    "Roofline",
    "Target",
    "TargetCompile",
    "TargetCompiler",
    "TargetError",
    "TargetSpecError",
    "TiledLayout",
    "compile_for_target",
    "compile_for_target_async",
    "compile_lowered_for_target",
    "compile_lowered_for_target_async",
    "default_compiler",
    "dot_flops",
    "hbm_capacity",
    "libtpu_version",
    "padded_bytes",
    "padding_report",
    "parse_compile_error",
    "parse_layout",
    "parse_target",
    "require_libtpu",
    "roofline",
    "target_mesh",
    "topology",
    "usable_hbm_bytes",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "tpu_debug.runtime.target.capacity": ("hbm_capacity", "usable_hbm_bytes"),
        "tpu_debug.runtime.target.compile": ("compile_for_target", "compile_lowered_for_target", "target_mesh"),
        "tpu_debug.runtime.target.executor": (
            "TargetCompiler",
            "compile_for_target_async",
            "compile_lowered_for_target_async",
            "default_compiler",
        ),
        "tpu_debug.runtime.target._libtpu": ("libtpu_version", "require_libtpu", "topology"),
        "tpu_debug.runtime.target.layout": (
            "Buffer",
            "PaddingReport",
            "TiledLayout",
            "padded_bytes",
            "padding_report",
            "parse_layout",
        ),
    },
)
