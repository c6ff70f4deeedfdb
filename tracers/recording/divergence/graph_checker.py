"""Compiled graphs against PyTorch on CPU, node by node.

A debug variant of the graph's XLA program also returns the values of the
graph's tensor nodes (every node, or every ``sample``-th with its inputs);
the FX graph is interpreted on CPU copies of the same inputs
(``torch.fx.Interpreter``), and each node is compared: ``drift`` is the CPU
interpretation against XLA's value, ``local`` the node's op on XLA's own
values of its inputs (when those were returned). Random nodes take XLA's
values. Events name the FX node, its aten op, the graph and the node's source
line (``node.meta["stack_trace"]``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
from tpu_debug.runtime.config import config as runtime_config
from tpu_debug.tracers.recording.divergence.fused_checker import CallSchedule, FusedChecker
from tpu_debug.tracers.recording.divergence.measures import Measures, measure
from tpu_debug.tracers.recording.divergence.op_facts import op_info
from tpu_debug.tracers.recording.divergence.emulated_precision import (
    PRECISION,
    changed_decision,
    emulated,
    measure_product,
)
from tpu_debug.tracers.recording.divergence.event_log import EventLog, Subject
from tpu_debug.tracers.recording.divergence.tolerances import tolerance_for
from tpu_debug.tracers.recording.divergence.tpu_numerics import graph_at_highest
from tpu_debug.tracers.recording.divergence.triage import (
    BRANCHES,
    NOT_TRIAGED,
    RESULT_BRANCHES,
    Causes,
    Triaged,
    Verdict,
    base_name,
    crossings_in,
    crossings_out,
    graph_module,
    node_in_float64,
    op_where,
)
from tpu_debug.tracers.recording.divergence.values import CPU, all_finite, finite, host_copy, map_tpu
from tpu_debug.tracers.events import Crossing
from tpu_debug.tracers.hlo import _location_from_stack_trace

__all__ = ["GraphChecker"]

_NONE: frozenset = frozenset()


@dataclasses.dataclass(slots=True)
class _NodeResult:
    """One node compared: its measures and what they were measured from."""

    node: torch.fx.Node
    local: Measures | None  # None: no local check (a random node, or no CPU value for its inputs)
    drift: Measures
    device: np.ndarray  # XLA's value
    local_ref: torch.Tensor | None  # the node's op on XLA's values of its inputs
    cpu_value: torch.Tensor  # the CPU interpretation's value
    rtol: float
    atol: float
    crossed: tuple[str, int, int] | None = None  # a non-smooth op's elements on another branch
    precision: bool = False  # a product whose difference from CPU is the emulated precision's


class GraphChecker:
    """Compares every call of a compiled graph with its FX graph interpreted on CPU (``on_graph``).

    Args:
        log: where divergences are counted and recorded.
        tolerances: a tolerance table (None: the defaults).
        sample: compare every ``sample``-th tensor node (1: all).
    """

    def __init__(self, log: EventLog, tolerances: Mapping | None, sample: int) -> None:
        self.log = log
        self.tolerances = tolerances
        self.sample = sample
        self.graphs_compared = 0
        self.nodes_compared = 0
        self._highest: dict[str, dict[str, bool]] = {}  # graph -> node -> verdict at "highest"
        self.causes = Causes()
        self.schedule = CallSchedule()
        self.fused = FusedChecker(log, tolerances)

    def check(self, graph: Any, arrays: list, outputs: Sequence | None = None) -> None:
        """One call of ``graph`` (a runtime ``CompiledGraph``) on its input ``arrays``; with
        ``outputs`` (what the real program gave, see :mod:`.fused`), those are compared too.
        Only the calls :class:`.fused.CallSchedule` picks are compared."""
        if not self.schedule.due(graph.graph_id):
            return
        gm = graph.gm
        nodes = [
            n
            for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
        ]
        if not nodes:
            return
        forced = _random_valued(gm, nodes)
        chosen = self._chosen(nodes, forced)
        run = _GraphRun(gm, graph.debug_values(arrays, chosen), arrays, forced, self.tolerances)
        results = run.compare()
        self.graphs_compared += 1
        self.nodes_compared += len(results)
        highest = self._verdicts_at_highest(graph, arrays, chosen, results, run)
        phase = "backward" if graph.kind == "backward" else "forward"
        by_node = {r.node: r for r in results}
        causes: dict[torch.fx.Node, frozenset] = {}
        for node in gm.graph.nodes:  # in order: a node's inputs come before it
            if node.op != "call_function" or node in run.exact:
                continue  # a graph input, or a value the same on both sides: nothing to explain
            inherited = Causes.merge(*(causes.get(a, _NONE) for a in node.all_input_nodes))
            result = by_node.get(node)
            if result is None:
                causes[node] = inherited
                continue
            subject = _subject(node, graph.graph_id, phase)
            new = []
            decided = None
            if result.crossed:
                branch, elements, numel = result.crossed
                loc = subject.location
                op = _target_name(node.args[0]) if node.target is operator.getitem else subject.target
                crossing = Crossing(op, elements, numel, branch, graph_module(node),
                                    loc.file if loc else "", loc.line if loc else 0, phase)
                new.append(self.causes.new("crossing", crossing=crossing))
                decided = changed_decision(op, result.crossed, inherited, crossing)
            verdict = None
            where = op_where(subject.target, subject.location)
            if result.local is not None and result.local.over:
                verdict = self._verdict(subject, result, run)
                kind = Causes.of_op(verdict)
                product = kind == "noise" and emulated(_node_op(node))
                new.append(self.causes.new(PRECISION if product else kind, where=where))
            elif result.precision:
                new.append(self.causes.new(PRECISION, where=where))
            causes[node] = Causes.merge(inherited, new) if new else inherited
            self._record(result, subject, run, highest, causes[node], verdict, decided)
        if outputs is not None:
            self.fused.check(graph, arrays, outputs, run, lambda n: _triage_seen(by_node.get(n), causes.get(n, _NONE)))

    def _verdict(self, subject: Subject, r: _NodeResult, run: _GraphRun) -> Verdict | None:
        """A node's float64 verdict (:mod:`.triage`; re-run once per site)."""
        site = self.log.site(subject, "local")
        if not site.checked_verdict:
            site.checked_verdict = True
            inputs = run.device_args(r.node)
            site.verdict = (
                None if inputs is None
                else node_in_float64(r.node, *inputs, r.local.max_abs, self.tolerances)
            )
        return site.verdict

    def _chosen(self, nodes: list[torch.fx.Node], forced: frozenset[str]) -> frozenset[str]:
        """The nodes the debug variant returns: all, or every ``sample``-th with the nodes
        its local check reads, and the random-valued nodes."""
        if self.sample <= 1:
            return frozenset(n.name for n in nodes)
        picked = [n for i, n in enumerate(nodes) if i % self.sample == self.sample - 1]
        names = {n.name for n in picked} | forced
        names.update(a.name for n in picked for a in n.all_input_nodes if a.op == "call_function")
        return frozenset(names)

    def _verdicts_at_highest(
        self, graph: Any, arrays: list, chosen: frozenset, results: list[_NodeResult], run: _GraphRun
    ) -> dict[str, bool]:
        """With TPU numerics, node -> within tolerance at precision "highest", for the nodes
        over tolerance locally (the graph re-run once per graph)."""
        over = [r.node for r in results if r.local is not None and (r.local.over or r.local.dtype_mismatch)]
        if not over or not runtime_config.product_passes():
            return {}
        highest = self._highest.get(graph.graph_id) or {}
        if not highest:
            highest = graph_at_highest(graph, arrays, chosen, over, run.device_input, self.tolerances)
            self._highest[graph.graph_id] = highest
        return highest

    def _record(
        self, r: _NodeResult, subject: Subject, run: _GraphRun, highest: dict[str, bool],
        causes: frozenset, verdict: Verdict | None, decided: Triaged | None = None,
    ) -> None:
        """Events for one node: local (over tolerance, dtype mismatch, NaN/Inf origin) and drift,
        with their triage (``causes``: why the node's value differs; ``verdict``: its own
        float64 verdict when it is over tolerance on its own inputs; ``decided``: a decision
        the emulated precision changed, see :mod:`.precision`)."""
        node, lm, dm = r.node, r.local, r.drift
        nan_origin = dm.device_has_nonfinite and _node_made_nonfinite(node, run.xla, run.inputs_by_node)
        local_event = lm is not None and (lm.over or nan_origin or lm.dtype_mismatch)
        if not (local_event or dm.over or nan_origin):
            return
        own = (lambda: Triaged.from_float64(verdict)) if lm is not None and lm.over else None
        if local_event:
            at_highest = highest.get(node.name) if lm.over else None
            detail = _detail(r.device, r.local_ref, r.rtol, r.atol)
            self.log.record(subject, "local", lm, nan_origin=nan_origin, highest=at_highest, detail=detail,
                            triage=own)
        elif lm is None and nan_origin:
            # no local check: the drift measures stand for it (the inputs came out finite)
            detail = _detail(r.device, r.cpu_value, r.rtol, r.atol)
            self.log.record(subject, "local", dm, nan_origin=True, detail=detail)
        if dm.over:
            self.log.record(subject, "drift", dm, detail=_detail(r.device, r.cpu_value, r.rtol, r.atol),
                            triage=own or ((lambda: decided) if decided else (lambda: Causes.triage(causes))))


def _triage_seen(result: _NodeResult | None, causes: frozenset) -> Triaged:
    """What the node check says about a node's drift, when its debug variant drifted there
    too (or differed within the emulated TPU precision's tolerance, which the fused program's
    float32 tolerance does not allow); otherwise nothing: the drift is the real fused program's own."""
    if result is None:
        return NOT_TRIAGED
    if not result.drift.over and not any(c.kind == PRECISION for c in causes):
        return NOT_TRIAGED
    return Causes.triage(causes)


class _GraphRun:
    """One call of a compiled graph, interpreted on CPU and compared node by node.

    Args:
        gm: the graph.
        xla: XLA's values of the nodes its debug variant returned, by node name.
        arrays: the call's inputs (placeholders in order; a random key may follow).
        forced: nodes that take XLA's value instead of the CPU's (random ones).
        tolerances: a tolerance table (None: the defaults).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        xla: dict[str, Any],
        arrays: list,
        forced: frozenset[str],
        tolerances: Mapping | None,
    ) -> None:
        self.gm = gm
        self.xla = xla
        self.forced = forced
        self.tolerances = tolerances
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.inputs = [_cpu_input(n, a) for n, a in zip(placeholders, arrays)]
        self.inputs_by_node = dict(zip(placeholders, self.inputs))
        self.exact: set[torch.fx.Node] = set(placeholders)  # nodes whose CPU value is XLA's, bit for bit
        self.results: list[_NodeResult] = []
        self._hosts: dict[str, torch.Tensor] = {}
        self._locals: dict[torch.fx.Node, Any] = {}
        self.env: dict[torch.fx.Node, Any] = {}  # every node's CPU value, once compare() ran

    def compare(self) -> list[_NodeResult]:
        """Interpret the graph on CPU, comparing each returned node as its value is made."""
        interp = _CpuGraph(self.gm, self.forced, self.host, self._on_value)
        interp.run(*self.inputs)
        self.env = interp.env
        return self.results

    def host(self, node: torch.fx.Node) -> torch.Tensor:
        """XLA's value of ``node`` as a CPU tensor (KeyError: the debug variant did not return it)."""
        t = self._hosts.get(node.name)
        if t is None:
            t = self._hosts[node.name] = host_copy(self.xla[node.name], node.meta["val"].dtype)
        return t

    def device_input(self, node: torch.fx.Node) -> torch.Tensor:
        """An input of a node as XLA had it: a graph input, or a returned node's value."""
        return self.inputs_by_node[node] if node in self.inputs_by_node else self.host(node)

    def _on_value(self, node: torch.fx.Node, cpu_value: Any, interp: _CpuGraph) -> None:
        if node.name not in self.xla or not isinstance(cpu_value, torch.Tensor):
            if not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):
                self.exact.add(node)  # a size or other Python value: the same on both sides
            return
        dev = np.asarray(self.xla[node.name])
        # a product at the emulated TPU precision: held to that precision (precision.py)
        product = cpu_value.dtype.is_floating_point and emulated(_node_op(node))
        if product:
            drift = measure_product(dev, cpu_value, False)
            rtol, atol = drift.rtol, drift.atol
        else:
            rtol, atol = tolerance_for(cpu_value.dtype, self.tolerances)
            drift = measure(dev, cpu_value, rtol, atol, False)
        local, ref = None, None
        if node.name in self.forced:
            pass
        elif all(a in self.exact for a in node.all_input_nodes):
            local, ref = drift, cpu_value  # same inputs on both sides: the local check is the drift one
        else:
            try:
                ref = self._local_value(node, interp)
            except Exception:  # noqa: BLE001 - no CPU kernel for this node's op: drift only
                ref = None
            if isinstance(ref, torch.Tensor):
                local = measure_product(dev, ref, False) if product else measure(dev, ref, rtol, atol, False)
        # a product that differs from CPU at all: the emulated precision's difference
        precision = product and not drift.exact
        if drift.exact:
            self.exact.add(node)
        crossed = None
        if not drift.exact:
            crossed = self._crossed(node, dev, cpu_value, local, interp)
        self.results.append(_NodeResult(node, local, drift, dev, ref, cpu_value, rtol, atol, crossed, precision))

    def _crossed(
        self, node: torch.fx.Node, dev: np.ndarray, cpu_value: torch.Tensor, local: Measures | None, interp: _CpuGraph
    ) -> tuple[str, int, int] | None:
        """The elements on which a non-smooth node took another branch than in the CPU run."""
        target, index = node.target, 0
        if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            target, index = node.args[0].target, node.args[1]
        if not isinstance(target, torch._ops.OpOverload):
            return None
        name = op_info(target).name
        found = RESULT_BRANCHES.get(base_name(name))
        if found is not None:
            # its result on XLA's inputs matches CPU, and the CPU run's result differs
            if found[1] != index or local is None or not local.exact:
                return None
            return crossings_out(name, [dev], [cpu_value])
        if base_name(name) not in BRANCHES or all(a in self.exact for a in node.all_input_nodes):
            return None
        device = self.device_args(node)
        if device is None:
            return None

        def cpu(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return interp.env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(cpu(x) for x in a)
            return a

        return crossings_in(name, device, (cpu(node.args), {k: cpu(v) for k, v in node.kwargs.items()}))

    def device_args(self, node: torch.fx.Node) -> tuple[Any, dict] | None:
        """A node's arguments as XLA computed them, on CPU (a ``getitem`` node's: those of
        the op it takes an item of); None when one was not returned by the debug variant."""
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
        ok = True

        def arg(a: Any) -> Any:
            nonlocal ok
            if isinstance(a, torch.fx.Node):
                if a in self.inputs_by_node:
                    return self.inputs_by_node[a]
                if a.name in self.xla:
                    return self.host(a)
                ok = False
                return None
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            if isinstance(a, torch.device) and a.type == "tpu":
                return CPU
            return a

        out = arg(node.args), {k: arg(v) for k, v in node.kwargs.items()}
        return out if ok else None

    def _local_value(self, node: torch.fx.Node, interp: _CpuGraph) -> Any:
        """The node's op run on CPU on XLA's values of its inputs (None: some input was not returned)."""
        if node in self._locals:
            return self._locals[node]
        src = node.args[0] if node.target is operator.getitem else None
        if isinstance(src, torch.fx.Node) and src.op == "call_function" and src.name not in self.xla:
            whole = self._local_value(src, interp)  # a multi-output op: its own local value, then the item
            value = None if whole is None else whole[node.args[1]]
            self._locals[node] = value
            return value
        ok = True

        def arg(a: Any) -> Any:
            nonlocal ok
            if isinstance(a, torch.fx.Node):
                if a in self.inputs_by_node:
                    return self.inputs_by_node[a]
                if a.name in self.xla:
                    return self.host(a)
                if not isinstance(a.meta.get("val"), torch.Tensor) and a in interp.env:
                    return interp.env[a]
                ok = False
                return None
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            if isinstance(a, torch.device) and a.type == "tpu":
                return CPU
            return a

        a_args, a_kwargs = arg(node.args), {k: arg(v) for k, v in node.kwargs.items()}
        value = None
        if ok:
            with torch.no_grad():
                value = node.target(*a_args, **a_kwargs)
        self._locals[node] = value
        return value


class _CpuGraph(torch.fx.Interpreter):
    """An FX graph run on CPU; forced (random) nodes take the device's values; each value is reported."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        forced: frozenset[str],
        device_value: Callable[[torch.fx.Node], Any],
        on_value: Callable[[torch.fx.Node, Any, _CpuGraph], None],
    ) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.forced = forced
        self.device_value = device_value
        self.on_value = on_value

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.name in self.forced:
            value = self.device_value(n)
        else:
            with torch.no_grad():
                value = super().run_node(n)
        if n.op == "call_function":
            self.on_value(n, value, self)
        return value

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return super().call_function(target, map_tpu(args, _no_tpu), map_tpu(kwargs, _no_tpu))


def _no_tpu(t: torch.Tensor) -> torch.Tensor:
    raise RuntimeError(f"a tpu tensor of shape {tuple(t.shape)} reached the CPU interpretation of a graph")


def _cpu_input(node: torch.fx.Node, array: Any) -> Any:
    """A graph input for the CPU interpretation: a CPU copy of a tensor input, other values as they are."""
    if hasattr(array, "shape") and isinstance(node.meta.get("val"), torch.Tensor):
        return host_copy(array, node.meta["val"].dtype)
    return array


def _random_valued(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> frozenset[str]:
    """The tensor nodes that take XLA's values: random ones (and uninitialised memory), and
    the items of a random op's results."""
    random_nodes = {n.name for n in gm.graph.nodes if _is_random_node(n)}
    return frozenset(
        n.name
        for n in nodes
        if n.name in random_nodes
        or any(isinstance(a, torch.fx.Node) and a.name in random_nodes for a in n.args[:1])
    )


def _is_random_node(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and op_info(target).skip is not None
    )


def _node_op(node: torch.fx.Node) -> Any:
    """The aten overload a node runs (for a ``getitem``, the op whose result it takes an item of)."""
    target = node.target
    if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        target = node.args[0].target
    return target


def _subject(node: torch.fx.Node, graph_id: str, phase: str) -> Subject:
    return Subject(
        "compiled",
        node.name,
        _target_name(node),
        phase,
        _location_from_stack_trace(node.meta.get("stack_trace")),
        graph=graph_id,
    )


def _target_name(node: torch.fx.Node) -> str:
    """A node's op as events name it (the eager name of an aten overload)."""
    if isinstance(node.target, torch._ops.OpOverload):
        return op_info(node.target).name
    return str(getattr(node.target, "__name__", node.target))


def _detail(dev: np.ndarray, ref: torch.Tensor, rtol: float, atol: float) -> Callable[[], Measures]:
    """The full measures (relative error, ratio, ULP), computed when an event is written."""
    return lambda: measure(dev, ref, rtol, atol, True)


def _node_made_nonfinite(node: torch.fx.Node, xla: dict, inputs: dict) -> bool:
    """A node whose value holds NaN/Inf made them itself: its floating inputs are finite and no
    scalar argument is NaN/Inf (the compiled form of the eager check; an input the debug
    variant did not return gives no verdict)."""
    floats = [
        a
        for a in node.all_input_nodes
        if isinstance(a.meta.get("val"), torch.Tensor)
        and (a.meta["val"].dtype.is_floating_point or a.meta["val"].dtype.is_complex)
    ]
    if not floats:
        return False
    scalars: list[float] = []
    torch.fx.node.map_aggregate(
        (node.args, node.kwargs), lambda v: scalars.append(v) if isinstance(v, float) else v
    )
    if any(not math.isfinite(v) for v in scalars):
        return False
    for a in floats:
        if a.name in xla:
            if not all_finite(xla[a.name]):
                return False
        elif isinstance(inputs.get(a), torch.Tensor):
            if not finite(inputs[a]):
                return False
        else:
            return False  # an input not returned (sampled out): no verdict
    return True
