"""``torch_tpu._internal.compile``: ``torch.compile(..., backend="tpu")``.

Importing it registers nothing more than importing torch does here: the device's
registration already provides the ``"tpu"`` dynamo backend (``runtime/compiled.py``).
``clear_cache`` drops the compiled programs the runtime holds.
"""

from __future__ import annotations

from tpu_debug.runtime.tpu_utils import clear_caches as clear_cache

__all__ = ["clear_cache"]
