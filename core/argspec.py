"""One input of an executable, as the runtime reports it and as a run records it.

The runtime builds an :class:`ArgSpec` for every input of every executable it
compiles (``CompileInfo.args``, ``FallbackInfo.args``); the tracers store it in
compile and fallback events (``tracers.events.ArgInfo`` is this class). It
lives outside both layers because the runtime may not import the tracers, and
the tracers are imported without the runtime (and without torch and jax) by
the reading verbs of the CLI.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ArgSpec"]


@dataclasses.dataclass(frozen=True, slots=True)
class ArgSpec:
    """One input of an executable: a tensor aval (``shape``, ``dtype``) or a static value.

    Two forms. As the runtime reports it, ``static`` is the Python value baked
    into the executable, and the rest of what the executable's key holds about
    the input is kept so a recompile can say what changed: ``scalar`` marks a
    Python number passed for a ``Scalar`` argument, ``layout`` how a tensor is
    read (``("storage", shape)`` and ``("view", "slice")``, ``"permuted ..."``
    or ``"strided ..."`` for a view, whose offset is an operand, not in the key;
    ``("device", "cpu")`` for a host scalar). As recorded
    (:meth:`recorded`, what events and the run store hold), ``static`` is the
    value's ``repr`` text: a run keeps text, never Python objects.

    Example:
        >>> ArgSpec("self", (8, 128), "float32").render()
        'float32[8,128]'
        >>> ArgSpec("dim", static=1).recorded().render()
        'dim=1'
    """

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    static: Any = None
    scalar: bool = False
    layout: tuple[tuple[str, Any], ...] = ()

    def recorded(self) -> ArgSpec:
        """The recorded form of a spec the runtime reported: plain ints and text only."""
        if self.shape is not None:
            return ArgSpec(str(self.name), tuple(int(d) for d in self.shape), str(self.dtype))
        return ArgSpec(str(self.name), static=repr(self.static))

    def render(self) -> str:
        """``float32[8,128]`` for a tensor, ``dim=1`` for a static value (of the recorded form)."""
        if self.shape is None:
            return f"{self.name}={self.static}"
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"
