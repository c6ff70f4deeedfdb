"""The runtime's typed configuration (one field, one TPU_DEBUG_* variable)."""

from __future__ import annotations

import dataclasses
import os

from tpu_debug.errors import ConfigError

__all__ = [
    "RuntimeConfig",
    "config",
    "parse_bool",
    "parse_choice",
    "parse_positive_int",
    "NUMERICS",
    "PRECISIONS",
    "EAGER_MODES",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off"
    )


# TPU numerics and the float32 product precision
NUMERICS = ("cpu", "tpu")
PRECISIONS = ("highest", "high", "medium")
_PASSES = {"highest": 0, "high": 3, "medium": 1}
# TorchTPU's eager modes (torch.tpu.EagerMode values, runtime/lazy.py)
EAGER_MODES = ("defer_and_fuse", "defer_never", "defer_never_and_launch_blocking")


def parse_choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return value


def parse_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r} is not a positive integer; use a count such as 1024")
    return value


@dataclasses.dataclass
class RuntimeConfig:
    """Settings that change how the runtime executes ops.

    Attributes:
        cpu_fallback: run ops that have no lowering on CPU (moving data both
            ways) instead of raising ``NotImplementedError``. Env:
            ``TPU_DEBUG_CPU_FALLBACK``.
        numerics: ``"cpu"`` (float32 products in float32) or ``"tpu"``
            (float32 matmuls and convolutions the way a TPU computes them at
            the precision in effect, see ``effective_precision``).
            Env: ``TPU_DEBUG_NUMERICS``.
        matmul_precision: an explicit float32 product precision (``"highest"``,
            ``"high"``, ``"medium"``), set by ``torch.tpu.precision.set``; None
            follows ``torch.get_float32_matmul_precision()``. Env:
            ``TPU_DEBUG_MATMUL_PRECISION``.
        eager_cache_size: eager executables kept (one per op overload, input
            shapes/dtypes and static arguments); the least recently used one
            goes when a new one would exceed it, and compiles again if called
            again. A model's training step uses tens to a few hundred. Env:
            ``TPU_DEBUG_EAGER_CACHE_SIZE``.
        compiled_cache_size: compiled-mode programs kept (one per FX graph and
            input signature), across all graphs, least recently used out
            first; divergence tracing's debug variants of programs are bounded
            by the same number. Env: ``TPU_DEBUG_COMPILED_CACHE_SIZE``.
        index_cache_bytes: bytes of gather/scatter index arrays kept for
            reading and writing strided views (one array per view geometry);
            an array larger than this is built for each use. Env:
            ``TPU_DEBUG_INDEX_CACHE_BYTES``.
        eager_mode: how ops outside compiled graphs run (``torch.tpu.EagerMode``):
            ``"defer_never"``, op by op; ``"defer_and_fuse"``, recorded and run as
            fused programs when a value is needed (runtime/lazy.py);
            ``"defer_never_and_launch_blocking"``, op by op, each waited for. Set it
            with ``torch.tpu.set_eager_mode`` or ``torch.tpu.eager_mode``. Env:
            ``TPU_DEBUG_EAGER_MODE``.
        lazy_graph_limit: ops a pending lazy graph holds at most; the op after
            that runs the graph first (trigger ``size_limit``). Env:
            ``TPU_DEBUG_LAZY_GRAPH_LIMIT``.
        compile_cache: keep compiled programs on disk and read them back in later
            runs instead of compiling again (runtime/compile_cache.py). Env:
            ``TPU_DEBUG_COMPILE_CACHE``.
        compile_cache_dir: where; None for ``$XDG_CACHE_HOME/tpu_debug/compile``
            (``~/.cache/tpu_debug/compile``). Env: ``TPU_DEBUG_COMPILE_CACHE_DIR``.
        compile_cache_bytes: bytes the cache directory holds at most, least
            recently used entries out first. Env: ``TPU_DEBUG_COMPILE_CACHE_BYTES``.
    """

    cpu_fallback: bool = False
    numerics: str = "cpu"
    matmul_precision: str | None = None
    # A cached executable holds XLA's compiled code and its compile record with the
    # lowered module: ~1.4 MiB for one small op on the CPU backend (measured: 600
    # single-op executables grew RSS by 850 MiB, with the cache bounded at 50 by 13
    # MiB). The bounds keep a run that meets ever new shapes within ~1.5 GiB of eager
    # executables, well above what a model's step uses.
    eager_cache_size: int = 1024
    compiled_cache_size: int = 128
    index_cache_bytes: int = 64 * 1024 * 1024
    # op by op by default, though TorchTPU defers and fuses by default: the tracers' per-op
    # events (compiles, executions, divergence) describe op-by-op execution
    eager_mode: str = "defer_never"
    # XLA's compile time grows with a program's size: a graph cut here compiles in
    # seconds, and a training step of a small model (hundreds to a few thousand ops) fits
    lazy_graph_limit: int = 10_000
    compile_cache: bool = True
    compile_cache_dir: str | None = None
    # a small op's CPU executable is 1-30 KB compressed (examples/mlp_train.py's 37 programs:
    # 0.15 MiB), a model's step program up to a few MB: thousands of programs fit
    compile_cache_bytes: int = 1 << 30

    def effective_precision(self) -> str:
        """The float32 product precision in effect: ``"highest"``, ``"high"`` or ``"medium"``.

        An explicit ``matmul_precision`` wins. Otherwise PyTorch's setting
        applies, except that under ``numerics="tpu"`` PyTorch's default
        (``"highest"``, which cannot be told apart from an explicit call) means
        a TPU's default, one bfloat16 pass (``"medium"``): ask for full
        precision with ``torch.tpu.precision.set("highest")``.
        """
        if self.matmul_precision is not None:
            return self.matmul_precision
        import torch

        value = torch.get_float32_matmul_precision()
        if self.numerics == "tpu" and value == "highest":
            return "medium"
        return value

    def product_passes(self) -> int:
        """bfloat16 passes a float32 matmul or convolution takes: 0 means plain float32.

        TPU precision levels (XLA's): ``highest`` = 6 passes, float32 accuracy
        (emulated as plain float32); ``high`` = 3 passes (bf16_3x: each operand
        split into a high and a low bfloat16 part, three products); ``medium``
        = 1 pass (XLA's DEFAULT: bfloat16 operands). Products accumulate in float32.
        """
        if self.numerics != "tpu":
            return 0
        return _PASSES[self.effective_precision()]

    def numerics_key(self) -> tuple:
        """What an executable key needs from the numerics settings (``()`` for CPU numerics)."""
        if self.numerics == "cpu":
            return ()
        return (self.numerics, self.effective_precision())

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RuntimeConfig:
        env = os.environ if environ is None else environ
        cfg = cls()
        raw = env.get("TPU_DEBUG_CPU_FALLBACK")
        if raw is not None:
            cfg.cpu_fallback = parse_bool("TPU_DEBUG_CPU_FALLBACK", raw)
        raw = env.get("TPU_DEBUG_NUMERICS")
        if raw is not None:
            cfg.numerics = parse_choice("TPU_DEBUG_NUMERICS", raw, NUMERICS)
        raw = env.get("TPU_DEBUG_MATMUL_PRECISION")
        if raw is not None:
            cfg.matmul_precision = parse_choice("TPU_DEBUG_MATMUL_PRECISION", raw, PRECISIONS)
        raw = env.get("TPU_DEBUG_EAGER_MODE")
        if raw is not None:
            cfg.eager_mode = parse_choice("TPU_DEBUG_EAGER_MODE", raw, EAGER_MODES)
        raw = env.get("TPU_DEBUG_COMPILE_CACHE")
        if raw is not None:
            cfg.compile_cache = parse_bool("TPU_DEBUG_COMPILE_CACHE", raw)
        raw = env.get("TPU_DEBUG_COMPILE_CACHE_DIR")
        if raw is not None and raw.strip():
            cfg.compile_cache_dir = raw.strip()
        for field in ("eager_cache_size", "compiled_cache_size", "index_cache_bytes", "lazy_graph_limit",
                      "compile_cache_bytes"):
            name = f"TPU_DEBUG_{field.upper()}"
            raw = env.get(name)
            if raw is not None:
                setattr(cfg, field, parse_positive_int(name, raw))
        return cfg


config = RuntimeConfig.from_env()
