"""``torch_tpu._internal.utils.utils`` (and ``test_utils``, ``torch_tpu.utils``): TorchTPU's
testing and tracing utilities, which live in :mod:`tpu_debug.runtime.tpu_utils` here."""

from __future__ import annotations

from tpu_debug.runtime.torchtpu.execution_mode import EagerMode
from tpu_debug.runtime.tpu_utils import CheckValueMode, OpTracer, assert_close, pformat_op_tracer

__all__ = ["CheckValueMode", "EagerMode", "OpTracer", "assert_close", "pformat_op_tracer"]
