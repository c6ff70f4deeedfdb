"""What a TPU would compute silently, at the user's line: the argument values the runtime's
checks find wrong (``runtime/value_checks.py``: an index out of range, which XLA clamps on a
TPU; a probability distribution that is not one, which XLA samples from), as events.

The runtime tells every failed check to a probe listening for ``on_invalid_value``, in every
mode and whether or not it raises; while this tracer listens, lazy and compiled programs
compute the checks (one small report per checked op, read after the program ran). Where the
user's line is differs by mode:

==========  ======================================================================
eager       the stack of the op's call (the check runs before the op)
lazy        the line that recorded the op: the check's step is announced
            (``on_defer``, ``check:<op>``) as it is recorded, and the report names
            that site once the graph ran
compiled    the innermost user frame of the FX node's ``stack_trace`` (dynamo's
            record; a backward node carries its forward node's)
==========  ======================================================================

An op autograd runs (the backward of ``gather`` is a ``scatter_add`` with the same index)
is marked ``phase="backward"``: eager and lazy mode name the autograd node that ran it
(its line is the ``backward()`` call), compiled mode knows the nodes of backward graphs
from their compiles. A training loop meets the same bad index at every step: one event
per (line, op, argument) is written when it is first seen, and one more with the count
when the trace ends (:class:`~tpu_debug.tracers.events.InvalidValueEvent`).

This module imports neither torch nor jax at module level.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from collections.abc import Callable
from typing import Any

from tpu_debug.core.records import CompileInfo, InvalidValueInfo, LoweredNode
from tpu_debug.tracers.events import InvalidValueEvent, SourceLocation
from tpu_debug.tracers.hlo import _location_from_stack_trace
from tpu_debug.tracers.location import user_location

__all__ = ["InvalidValueTracer"]

# frames between a probe method and the runtime: deliver() and the typed notification,
# both library frames user_location skips anyway
_PROBE_DEPTH = 2
# lazy check sites whose line is kept: the runtime announces a site once per place in a
# graph, so a program's checks are a few sites; the bound only stops a program that
# builds ever new graphs from growing the table without end (the oldest half goes)
_SITES_KEPT = 100_000


def _autograd_node() -> str:
    """The autograd node running on this thread ("GatherBackward0"), or "" outside a backward."""
    import torch  # loaded: a check of a tpu op ran

    node = torch._C._current_autograd_node()
    return node.name() if node is not None else ""


@dataclasses.dataclass(slots=True)
class _Place:
    """One (line, op, argument) seen: its first event and how often it came."""

    first: InvalidValueEvent
    count: int = 1
    last_ts: float = 0.0


class InvalidValueTracer:
    """Records each invalid argument value the runtime reports (see the module docstring).

    Args:
        writer: the run's ``RunWriter`` (``put``, ``new_id``).
        clock: seconds since the run started.
        record_error: how a failure of this tracer is kept in the run (never raised).
    """

    def __init__(self, writer: Any, *, clock: Callable[[], float],
                 record_error: Callable[[str, str], None]) -> None:
        self._writer = writer
        self._clock = clock
        self._record_error = record_error
        self._lock = threading.Lock()
        self._places: dict[tuple[SourceLocation | None, str, str], _Place] = {}
        # lazy mode: per check site, the user's line and the autograd node recording it
        self._sites: dict[int, tuple[SourceLocation | None, str]] = {}
        # compiled mode: the nodes of backward graphs
        self._backward: set[LoweredNode] = set()

    # -- probe methods ----------------------------------------------------------------------

    def on_defer(self, name: str, index: int, site: int) -> None:
        if not name.startswith("check:"):
            return  # only a check's site is ever named by a report
        sites = self._sites
        if len(sites) >= _SITES_KEPT:
            for old in list(sites)[: len(sites) // 2]:
                del sites[old]
        sites[site] = (user_location(_PROBE_DEPTH), _autograd_node())

    def on_compile(self, info: CompileInfo) -> None:
        graph = info.graph
        if graph is not None and graph.kind == "backward":
            self._backward.update(graph.nodes)

    def on_invalid_value(self, info: InvalidValueInfo) -> None:
        if info.mode == "lazy":
            location, node = self._sites.get(info.site, (None, "")) if info.site is not None else (None, "")
            phase = "backward" if node else "forward"
        elif info.mode == "compiled":
            lowered = info.node
            location = _location_from_stack_trace(lowered.stack_trace) if lowered is not None else None
            node, phase = "", "backward" if lowered in self._backward else "forward"
        else:
            location, node = user_location(_PROBE_DEPTH), _autograd_node()
            phase = "backward" if node else "forward"
        self._seen(info, location, phase, node)

    def on_internal_error(self, method: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self._record_error(f"{type(self).__name__}.{method}", text)

    # -- records ----------------------------------------------------------------------------

    def _seen(self, info: InvalidValueInfo, location: SourceLocation | None, phase: str, node: str) -> None:
        key = (location, str(info.op), str(info.argument))
        now = self._clock()
        with self._lock:
            place = self._places.get(key)
            if place is not None:
                place.count += 1
                place.last_ts = now
                return
            event = InvalidValueEvent(
                self._writer.new_id(), now, info.mode, threading.get_native_id(), location, info, phase, node,
            )
            self._places[key] = _Place(event, 1, now)
        self._writer.put(event)

    def close(self) -> None:
        """Write the count of each place seen more than once (the trace is ending)."""
        with self._lock:
            places = list(self._places.values())
        for place in places:
            if place.count > 1:
                self._writer.put(dataclasses.replace(
                    place.first, id=self._writer.new_id(), ts=place.last_ts, count=place.count,
                ))
