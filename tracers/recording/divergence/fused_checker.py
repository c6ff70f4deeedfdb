"""The real compiled program against CPU: its outputs, then the first node that drifts.

The node-by-node check (:mod:`.compiled`) reads a debug variant of a graph's
program that returns every node: a different program, in which XLA must
materialise each intermediate in its own dtype. What the user receives comes
from the program the backend runs, whose fusions may keep an intermediate in
another precision, reassociate a reduction or fold constants. So each checked
call also compares:

- ``output``: the real program's values (each graph output the caller
  receives, and each mutated input's new value) with the FX graph's outputs
  interpreted by PyTorch on CPU (the interpretation the node check runs,
  same dtypes, same tolerances);
- ``fused``: when an output leaves tolerance, the first node that drifts,
  found with intermediates of fused programs: the graph cut after one node
  and returning only that node (XLA drops the rest, so the node is computed
  as the whole program fuses it, with no other intermediate materialised).
  Bisection over the nodes that output depends on, in graph order, finds a
  node that drifts while the one before it does not: ``log2(n) + 1`` such
  programs (each compiled once, within the runtime's cache of debug variants).

Cost: the output comparison reuses the CPU interpretation, so it costs the
device-to-host copy of the outputs. Bisection runs once per graph per run
(its first drifting call), for at most ``max_bisections`` graphs. Which calls
are checked at all is :class:`CallSchedule`'s choice. Nothing here writes a
user's tensor: the programs run on the call's input arrays (inputs are not
donated while divergence is traced) and with the call's own random key, so
random nodes draw what the call drew and the random stream does not advance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
from tpu_debug.tracers.recording.divergence.measures import Measures, measure
from tpu_debug.tracers.recording.divergence.op_facts import op_info
from tpu_debug.tracers.recording.divergence.event_log import EventLog, Subject
from tpu_debug.tracers.recording.divergence.tolerances import tolerance_for
from tpu_debug.tracers.recording.divergence.triage import NOT_TRIAGED, Triaged
from tpu_debug.tracers.hlo import _location_from_stack_trace

__all__ = ["CallSchedule", "FusedChecker"]

_COPY_ = torch.ops.aten.copy_.default


class CallSchedule:
    """Which calls of each compiled graph are compared with CPU: the first ``first`` calls,
    then every ``every``-th (a drift that grows with training is still met, at a bounded
    cost: a CPU interpretation of the graph per checked call).

    Args:
        first: calls checked from the start of each graph.
        every: after those, one call in ``every`` (0: none).
    """

    def __init__(self, first: int = 8, every: int = 50) -> None:
        self.first = first
        self.every = every
        self._calls: dict[str, int] = {}
        self.skipped = 0

    def due(self, graph_id: str) -> bool:
        """Count one call of ``graph_id``; whether it is checked."""
        n = self._calls.get(graph_id, 0) + 1
        self._calls[graph_id] = n
        ok = n <= self.first or (self.every > 0 and (n - self.first) % self.every == 0)
        if not ok:
            self.skipped += 1
        return ok


class FusedChecker:
    """Compares a compiled call's real outputs with CPU, and bisects fused programs for the
    first node that drifts (see the module docstring).

    Args:
        log: where divergences are counted and recorded.
        tolerances: a tolerance table (None: the defaults).
        max_bisections: graphs whose first drifting node is searched for in a run.
    """

    def __init__(self, log: EventLog, tolerances: Mapping | None, max_bisections: int = 8) -> None:
        self.log = log
        self.tolerances = tolerances
        self.max_bisections = max_bisections
        self.outputs_compared = 0
        self.programs_compiled = 0  # fused prefix programs run by bisection
        self._bisected: set[str] = set()

    def check(
        self, graph: Any, arrays: list, outputs: Sequence, cpu: Any,
        triage_of: Callable[[torch.fx.Node], Triaged] = lambda n: NOT_TRIAGED,
    ) -> None:
        """One call of ``graph``: ``outputs`` from :func:`runtime.compiled._output_arrays`,
        ``cpu`` the call's CPU interpretation (``env``: node -> value, ``inputs`` after it ran),
        ``triage_of`` what the node-by-node check found about a node's drift."""
        phase = "backward" if graph.kind == "backward" else "forward"
        first_over: torch.fx.Node | None = None
        for node, device, ref in _pairs(graph, outputs, cpu):
            rtol, atol = tolerance_for(ref.dtype, self.tolerances)
            dev = np.asarray(device)
            m = measure(dev, ref, rtol, atol, False)
            self.outputs_compared += 1
            if not m.over:
                continue
            subject = _subject(node, graph.graph_id, phase)
            self.log.record(subject, "output", m, detail=lambda d=dev, r=ref, a=rtol, b=atol: measure(d, r, a, b, True),
                            triage=lambda n=node: triage_of(n))
            if first_over is None:
                first_over = node
        if first_over is None or graph.graph_id in self._bisected or len(self._bisected) >= self.max_bisections:
            return
        self._bisected.add(graph.graph_id)
        found = self._bisect(graph, arrays, first_over, cpu.env)
        if found is not None:
            node, m, dev, ref = found
            self.log.record(_subject(node, graph.graph_id, phase), "fused", m,
                            detail=lambda: measure(dev, ref, m.rtol, m.atol, True), triage=lambda: triage_of(node))

    def _bisect(
        self, graph: Any, arrays: list, out: torch.fx.Node, env: Mapping
    ) -> tuple[torch.fx.Node, Measures, np.ndarray, torch.Tensor] | None:
        """A node ``out`` depends on whose fused value is over tolerance while the candidate
        before it is not (the first such node when drift, once in, stays in the values the
        output depends on); None when no candidate's fused value is over tolerance."""
        nodes = _candidates(graph.gm, out, env)
        cache: dict[int, tuple[Measures, np.ndarray, torch.Tensor]] = {}

        def drifts(i: int) -> bool:
            if i not in cache:
                node = nodes[i]
                values = graph.debug_values(arrays, frozenset({node.name}))
                self.programs_compiled += 1
                ref = env[node]
                rtol, atol = tolerance_for(ref.dtype, self.tolerances)
                dev = np.asarray(values[node.name])
                cache[i] = (measure(dev, ref, rtol, atol, False), dev, ref)
            return cache[i][0].over

        if not nodes or not drifts(len(nodes) - 1):
            return None
        lo, hi = -1, len(nodes) - 1  # invariant: drifts(hi); lo == -1 or not drifts(lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if drifts(mid):
                hi = mid
            else:
                lo = mid
        return (nodes[hi], *cache[hi])


def _pairs(graph: Any, outputs: Sequence, cpu: Any) -> list[tuple[torch.fx.Node, Any, torch.Tensor]]:
    """(node that computed it, device value, CPU value) for each floating output the program
    computed: the graph's outputs, then its mutated inputs' new values (the node the
    ``copy_`` into that input copies from). Inputs passed through are skipped: nothing computed."""
    gm = graph.gm
    out_nodes = list(gm.graph.output_node().args[0])
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    pairs = []
    for node, device in zip(out_nodes, outputs):
        if device is None or not isinstance(node, torch.fx.Node) or node.op == "placeholder":
            continue
        ref = cpu.env.get(node)
        if isinstance(ref, torch.Tensor) and ref.is_floating_point():
            pairs.append((node, device, ref))
    sources = {
        n.args[0]: n.args[1] for n in gm.graph.nodes
        if n.op == "call_function" and n.target is _COPY_ and isinstance(n.args[1], torch.fx.Node)
    }
    for i, device in zip(graph.program.mutated_inputs, outputs[len(out_nodes):]):
        ref = cpu.inputs[i]  # the CPU interpretation wrote the new value into its copy of the input
        src = sources.get(placeholders[i])
        if src is not None and isinstance(ref, torch.Tensor) and ref.is_floating_point():
            pairs.append((src, device, ref))
    return pairs


def _candidates(gm: torch.fx.GraphModule, out: torch.fx.Node, env: Mapping) -> list[torch.fx.Node]:
    """The computed floating tensor nodes ``out`` depends on (``out`` last), in graph order."""
    needed: set[torch.fx.Node] = set()
    stack = [out]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    return [
        n for n in gm.graph.nodes
        if n in needed and n.op == "call_function" and n.target is not _COPY_
        and isinstance(env.get(n), torch.Tensor) and env[n].is_floating_point()
    ]


def _subject(node: torch.fx.Node, graph_id: str, phase: str) -> Subject:
    """A node as events name it (its op by its eager name, as the node check does)."""
    target = node.target
    name = op_info(target).name if isinstance(target, torch._ops.OpOverload) else str(
        getattr(target, "__name__", target))
    return Subject("compiled", node.name, name, phase, _location_from_stack_trace(node.meta.get("stack_trace")),
                   graph=graph_id)
