"""The runtime's typed configuration: one field per ``"runtime"`` option of :mod:`tpu_debug.core.options`.

``config`` reads its ``TPU_DEBUG_*`` variables when a field is first read (the
runtime's first use), never at import; a value assigned before that stands.
"""

from __future__ import annotations

from tpu_debug.core.options import EAGER_MODES, NUMERICS, PRECISIONS, Settings

__all__ = [
    "RuntimeConfig",
    "config",
    "NUMERICS",
    "PRECISIONS",
    "EAGER_MODES",
]

_PASSES = {"highest": 0, "high": 3, "medium": 1}


class RuntimeConfig(Settings):
    """Settings that change how the runtime executes ops.

    ``numerics="tpu"`` runs float32 matmuls and convolutions the way a TPU computes
    them at the precision in effect (see ``effective_precision``); ``matmul_precision``
    is what ``torch.tpu.precision.set`` sets; ``eager_mode`` is what
    ``torch.tpu.set_eager_mode`` sets (runtime/lazy.py).
    """

    SCOPE = "runtime"

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


config = RuntimeConfig.unread()
