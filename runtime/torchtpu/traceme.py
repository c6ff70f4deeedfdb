"""``torch_tpu._internal.shims.xprof.traceme``: TorchTPU's named spans for a profile.

``with TraceMe("decode step 3"):`` marks the block on the host timeline of a profile: JAX's
``TraceAnnotation`` (the same TraceMe of XProf, so the span is in a ``jax.profiler`` trace and
in TensorBoard) and a ``torch.profiler`` range of the same name.
"""

from __future__ import annotations

from typing import Any, Self

__all__ = ["TraceMe"]


class TraceMe:
    """A named span on the profile's host timeline (see the module); ``kwargs`` are its metadata."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self.kwargs = kwargs
        self._open: list[Any] = []

    def __enter__(self) -> Self:
        import jax
        import torch

        for span in (jax.profiler.TraceAnnotation(self.name, **self.kwargs), torch.profiler.record_function(self.name)):
            span.__enter__()
            self._open.append(span)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._open:
            self._open.pop().__exit__(*exc)
