"""Compiled mode: an FX graph becomes one jitted JAX program.

The dynamo backend hands each captured graph to AOTAutograd, which fakes the
`tpu` example inputs (tracing never touches device data) and gives functional
aten-level forward and backward graphs. Each graph is interpreted node by node with the *same* lowerings the eager mode uses, inside
one ``jax.jit``; every node runs in a ``jax.named_scope`` named after the FX
node and its aten op, so optimized-HLO metadata maps back to FX nodes and their
source lines.

Parameters and buffers are graph inputs (never constants), so new weights do
not recompile; random ops take a key input, so every call draws fresh numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import operator
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

from jax._src.array import ArrayImpl as _ArrayImpl  # a computed payload's type: a 10 ns check
from tpu_debug.core.errors import DeviceAssertError, LoweringBugError, UnsupportedError
from tpu_debug.runtime import dry_mode as _dryrun
from tpu_debug.runtime import fused_step
from tpu_debug.runtime import probes
from tpu_debug.runtime import rng_state as _random
from tpu_debug.runtime import tensor as _tensor
from tpu_debug.runtime import value_checks
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.compile_cache import CacheOutcome, local_compile, program_identity
from tpu_debug.runtime.config import config
from tpu_debug.runtime.distributed import placement as _placement
from tpu_debug.runtime.distributed import rankcheck as _rankcheck
from tpu_debug.runtime.dtypes import TORCH_TO_JAX as _JAX_OF
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype
from tpu_debug.runtime.eager import announce_evicted
from tpu_debug.runtime.ops.prims import register as register_prims
from tpu_debug.runtime.ops.registry import lookup, registered
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import PARTITION_SPAN, CompileInfo, DynamoOrigin, GraphInfo, InputOrigin, LoweredNode
from tpu_debug.runtime import memory_ledger
from tpu_debug.runtime.graph_inputs import backward_inputs, forward_origins, output_nodes
from tpu_debug.runtime.startup import dynamo_disabled, single_threaded_backward
from tpu_debug.runtime.tensor import (
    PAYLOAD_ATTR,
    LazyArray,
    Uninit,
    _create_empty,
    from_jax,
    set_payload,
    to_jax,
    write,
)

__all__ = ["dynamo_backend", "compile", "CompiledGraph", "graph_stats"]

_graph_ids = itertools.count(1)
_aten = torch.ops.aten
# shape queries: answered from the traced array's (static) shape
_SHAPE_OPS = {
    _aten.sym_size.int: lambda x, dim: x.shape[dim],
    _aten.sym_numel.default: lambda x: x.size,
    _aten.sym_stride.int: lambda x, dim: int(math.prod(x.shape[dim + 1 :])),
    _aten.sym_storage_offset.default: lambda _x: 0,
}
_lock = threading.Lock()
# graphs holding at least one cached program, oldest first (graph_stats, replay)
_graphs: list[CompiledGraph] = []


class UnsupportedGraphOp(UnsupportedError):
    """A node of a compiled graph has no lowering."""


# the table graph_decompositions built, by the sizes of the two registries it reads
_decompositions: dict[tuple[int, int], dict] = {}


def graph_decompositions() -> dict:
    """Core aten decompositions, minus the ops we lower directly.

    Built once for each state of the registries it reads (ours only grows, PyTorch's grows
    when a program registers a decomposition): PyTorch builds its core table from every
    composite op's registrations, a third of a second of CPU that each graph compile paid.
    Each caller gets its own copy."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    key = (len(registered()), len(decomposition_table))
    if key not in _decompositions:
        table = dict(core_aten_decompositions())
        # beyond the core set: any PyTorch decomposition of an op we have no lowering for
        for op, fn in decomposition_table.items():
            if op not in table and lookup(op) is None:
                table[op] = fn
        for op in list(table):
            if lookup(op) is not None:
                del table[op]
        _decompositions.clear()
        _decompositions[key] = table
    return dict(_decompositions[key])


def _get_attr(gm: torch.fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


_WITH_EFFECTS = getattr(torch.ops.higher_order, "with_effects", None)


def _rng_wrappers() -> tuple:
    """PyTorch's RNG-state wrappers (torch/_prims/rng_prims.py), which AOTAutograd's
    partitioner puts around a random op that a backward recomputes (activation
    checkpointing): ``run_and_save_rng_state(op, *args)`` in the forward returns the state
    the draw used and the op's result; ``run_with_rng_state(state, op, *args)`` in the
    backward draws again from that state. Their kernels pick a device's generator by the
    type of the first tensor argument and know CPU, CUDA, HPU and XPU; in a tpu program
    the state is the draw's PRNG key (runtime/rng_state.py), so the recomputed draw is the
    forward's."""
    from torch._prims import rng_prims

    return rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state


_RUN_AND_SAVE_RNG_STATE, _RUN_WITH_RNG_STATE = _rng_wrappers()
_COPY_ = torch.ops.aten.copy_.default
# device-side assertions (PyTorch's decompositions of one_hot, index bounds checks): XLA has
# no assert instruction, so each condition becomes a program output checked after the call
_ASSERTS = frozenset(
    op for op in (
        getattr(getattr(torch.ops.aten, "_assert_async", None), "msg", None),
        getattr(getattr(torch.ops.aten, "_assert_async", None), "default", None),
        getattr(getattr(torch.ops.aten, "_functional_assert_async", None), "msg", None),
    ) if op is not None
)


class GraphProgram:
    """The JAX function of one FX graph (interpreting it node by node)."""

    def __init__(self, gm: torch.fx.GraphModule, graph_id: str, kind: str):
        self.gm = gm
        self.graph_id = graph_id
        self.kind = kind
        self.nodes: list[LoweredNode] = []
        self.rng_nodes = 0
        # get_attr nodes: tensors dynamo lifted into the graph module (a constant index
        # tensor, say), program constants
        self.constants: dict[str, Any] = {}
        for node in gm.graph.find_nodes(op="get_attr"):
            value = _get_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedGraphOp(
                    f"graph {graph_id}: FX attribute {node.target!r} is a {type(value).__name__}, not a tensor"
                )
            self.constants[node.target] = to_jax(value if value.device.type == "tpu" else value.detach().to("tpu"))
        # copy_ into a graph input: an input mutation AOTAutograd left in the graph
        # (keep_inference_input_mutations); the new value is an extra program output
        # that CompiledGraph writes into the input tensor
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        self.mutated_inputs: tuple[int, ...] = tuple(
            placeholders.index(node.args[0])
            for node in gm.graph.nodes
            if node.op == "call_function" and node.target is _COPY_ and node.args[0] in placeholders
        )
        self.mutated_set = frozenset(self.mutated_inputs)  # membership, per input per call
        # each device assertion's message and source line, in graph order
        self.asserts: tuple[tuple[str, str | None], ...] = tuple(
            (node.args[1] if len(node.args) > 1 else "assertion failed", _last_line(node.meta.get("stack_trace")))
            for node in gm.graph.nodes
            if node.op == "call_function" and node.target in _ASSERTS
        )
        # functional collectives (DTensor, funcol calls): host callbacks in the program
        self.collectives = 0
        value_nodes: list[torch.fx.Node] = []
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in (_RUN_AND_SAVE_RNG_STATE, _RUN_WITH_RNG_STATE):
                self._add_rng_wrapper(node)
            elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                if node.target in _SHAPE_OPS or node.target is _COPY_ or node.target in _ASSERTS:
                    continue
                if _collectives(node.target) is not None:
                    self.collectives += 1
                    scope = f"{node.name}|{node.target}"
                    trace = node.meta.get("stack_trace")
                    self.nodes.append(LoweredNode(node.name, str(node.target), scope, trace))
                    continue
                low = lookup(node.target)
                if low is not None and low.values is not None:
                    value_nodes.append(node)
                if low is None:
                    raise UnsupportedGraphOp(
                        f"graph {graph_id} ({kind}) node {node.name}: aten::"
                        f"{str(node.target).removeprefix('aten.')} has no tpu lowering; "
                        "add one under runtime/ops/ (compiled mode cannot fall back to CPU)"
                    )
                if low.rng:
                    self.rng_nodes += 1
                scope = f"{node.name}|aten::{str(node.target).removeprefix('aten.')}"
                backward = kind == "backward" or bool(node.meta.get("autograd_backward"))
                self.nodes.append(LoweredNode(node.name, str(node.target), scope, node.meta.get("stack_trace"),
                                              backward, _module_stack(node)))
        # nodes whose ops check argument values (runtime/value_checks.py), with their LoweredNode
        lowered = {n.name: n for n in self.nodes}
        self.value_nodes = {node: lowered[node.name] for node in value_nodes}
        # what the last trace with checks made: per report output, (op, check, statics, node)
        self.traced_checks: list[tuple] = []

    def _add_rng_wrapper(self, node: torch.fx.Node) -> None:
        """A random op inside ``run_and_save_rng_state`` (a fresh key, as any random node) or
        ``run_with_rng_state`` (the key it is given)."""
        saves = node.target is _RUN_AND_SAVE_RNG_STATE
        op = node.args[0] if saves else node.args[1]
        low = lookup(op) if isinstance(op, torch._ops.OpOverload) else None
        if low is None or not low.rng:
            raise UnsupportedGraphOp(
                f"graph {self.graph_id} ({self.kind}) node {node.name}: {node.target.name()} wraps {op}, "
                "which has no random tpu lowering; add one under runtime/ops/ (rng=True)"
            )
        self.rng_nodes += saves
        scope = f"{node.name}|aten::{str(op).removeprefix('aten.')}"
        self.nodes.append(LoweredNode(node.name, str(op), scope, node.meta.get("stack_trace")))

    def _rng_wrapped(self, node: torch.fx.Node, args: list, kwargs: dict, key, draws: Iterator[int]):
        """``run_and_save_rng_state``: (the key, the op's result); ``run_with_rng_state``: the
        op's result drawn with the key it was given."""
        if node.target is _RUN_AND_SAVE_RNG_STATE:
            state, (op, *args) = jax.random.fold_in(key, next(draws)), args
        else:
            state, op, *args = args
        low = lookup(op)
        kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        with jax.named_scope(f"{node.name}|aten::{str(op).removeprefix('aten.')}"):
            out = low.fn(*args, **kwargs, key=state)
        if node.target is _RUN_AND_SAVE_RNG_STATE:
            return state, out
        return _cast_like(out, node)

    def __call__(self, *flat, debug: frozenset | None = None, checking: bool = False):
        """The graph's outputs (then each mutated input's new value) for inputs ``flat``
        (the random key last when the graph draws random numbers). With ``debug`` (FX node
        names), also a dict of those nodes' values: the divergence tracer's variant. With
        ``checking``, the value checks' reports follow the assertions' conditions."""
        env: dict[torch.fx.Node, Any] = {}
        key = flat[-1] if self.rng_nodes else None
        inputs = iter(flat[:-1] if self.rng_nodes else flat)
        draws = itertools.count()  # the n-th random node folds n into the key
        mutations: dict[torch.fx.Node, Any] = {}
        checks: list[Any] = []  # the device assertions' conditions
        if checking:
            self.traced_checks = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "get_attr":
                env[node] = self.constants[node.target]
            elif node.op == "call_function":
                if node.target in _ASSERTS:
                    checks.append(jnp.all(_value(node.args[0], env)))
                    env[node] = None
                else:
                    if checking and node in self.value_nodes:
                        self._check_values(node, env)
                    env[node] = self._call(node, env, key, draws, mutations)
            elif node.op == "output":
                reports = tuple(r for r, _info in self.traced_checks) if checking else ()
                result = self._outputs(node, env, mutations) + tuple(checks) + reports
                if debug is not None:
                    return result, {n.name: v for n, v in env.items() if n.name in debug}
                return result
            else:
                raise UnsupportedGraphOp(f"graph {self.graph_id}: FX node kind {node.op!r} is not supported")
        raise LoweringBugError(f"graph {self.graph_id} has no output node; please report it with this message")

    def _check_values(self, node: torch.fx.Node, env: dict) -> None:
        """Trace the report of ``node``'s value check (runtime/value_checks.py)."""
        check = lookup(node.target).values
        args = [_value(a, env) for a in node.args]
        kwargs = {k: _value(v, env) for k, v in node.kwargs.items()}
        arrays, statics = check.select(*args, **kwargs)
        if arrays:
            name = str(node.target).removeprefix("aten.").removesuffix(".default")
            report = value_checks.report(check, *arrays, statics)
            self.traced_checks.append((report, (name, check, statics, self.value_nodes[node])))

    def _call(self, node: torch.fx.Node, env: dict, key, draws: Iterator[int], mutations: dict) -> Any:
        """The value of one ``call_function`` node."""
        args = [_value(a, env) for a in node.args]
        kwargs = {k: _value(v, env) for k, v in node.kwargs.items()}
        target = node.target
        if target is operator.getitem:
            return args[0][args[1]]
        if target is _WITH_EFFECTS:
            return self._with_effects(node, *args, **kwargs)
        if target is _RUN_AND_SAVE_RNG_STATE or target is _RUN_WITH_RNG_STATE:
            return self._rng_wrapped(node, args, kwargs, key, draws)
        if target is _COPY_:
            dst, src = args[0], args[1]
            value = jnp.broadcast_to(src, dst.shape).astype(dst.dtype)
            if node.args[0].op == "placeholder":
                mutations[node.args[0]] = value
            return value
        if not isinstance(target, torch._ops.OpOverload):
            return target(*args, **kwargs)
        if target in _SHAPE_OPS:
            return _SHAPE_OPS[target](*args)
        if self.collectives and (collectives := _collectives(target)) is not None:
            with jax.named_scope(f"{node.name}|{target}"):
                return collectives.lower(node, args, kwargs)
        low = lookup(target)
        if low.rng:
            kwargs["key"] = jax.random.fold_in(key, next(draws))
            kwargs.pop("generator", None)
        with jax.named_scope(f"{node.name}|aten::{str(target).removeprefix('aten.')}"):
            out = low.fn(*args, **kwargs)
            if low.mutates_returns:
                n_ret = len(target._schema.returns)
                out = out[:n_ret] if n_ret != 1 else out[0]
            return _cast_like(out, node)

    def _outputs(self, node: torch.fx.Node, env: dict, mutations: dict) -> tuple:
        """The output node's values, then the new value of each mutated input (in
        ``mutated_inputs`` order); the program returns the device assertions' conditions
        after them."""
        result = tuple(_value(o, env) if o is not None else None for o in node.args[0])
        placeholders = list(self.gm.graph.find_nodes(op="placeholder"))
        return result + tuple(mutations[placeholders[i]] for i in self.mutated_inputs)

    def _with_effects(self, node, token, op, *args, **kwargs):
        """An op AOTAutograd threads an effect token through: ``(token, *outputs)``.

        ``_linalg_check_errors`` (raise on a singular matrix, ...) depends on values, which
        a compiled XLA program cannot raise on: it is dropped, as torch_xla drops it. Any
        other effectful op runs through its lowering."""
        if token is None:  # AOTAutograd passes None in; the graph's token output is a tensor
            token = jnp.zeros((0,), jnp.float32)
        if op is torch.ops.aten._linalg_check_errors.default:
            return (token,)
        low = lookup(op) if isinstance(op, torch._ops.OpOverload) else None
        if low is None:
            raise UnsupportedGraphOp(f"graph {self.graph_id} node {node.name}: effectful op {op} has no tpu lowering")
        out = low.fn(*args, **kwargs)
        return (token, *(out if isinstance(out, (tuple, list)) else (out,)))


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def _collectives(op: torch._ops.OpOverload):
    """The module lowering functional collectives when ``op`` is one it lowers, else None
    (imported on first need: it needs torch.distributed's ops)."""
    if op.namespace not in _COLLECTIVE_NAMESPACES:
        return None
    from tpu_debug.runtime.distributed import compiled_collectives  # deferred: optional: its ops are torch.distributed's

    return compiled_collectives if compiled_collectives.handles(op) else None


def _module_stack(node: torch.fx.Node) -> tuple[tuple[str, str, str], ...]:
    """The modules dynamo traced ``node`` in, outermost first: (path, class name, class file)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ()
    out = []
    for path, cls in stack.values():
        if isinstance(cls, type):
            # the module's file, else the file its forward is written in (a class loaded from a
            # path without a sys.modules entry)
            code = getattr(getattr(cls, "forward", None), "__code__", None)
            name = cls.__qualname__
            file = getattr(sys.modules.get(cls.__module__), "__file__", None) or getattr(code, "co_filename", "")
        else:  # a class named by its qualified name (a graph dynamo read back from a cache)
            name, file = str(cls).rpartition(".")[2], ""
        out.append((str(path), name, file))
    return tuple(out)


def _value(a, env: dict):
    """An FX argument with its nodes replaced by their values in ``env``."""
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_value(x, env) for x in a)
    return a


class _Opaque:
    """A graph input that is neither a tensor nor a number (the ``DeviceMesh`` of a DTensor
    AOTAutograd passes through a graph), held as a static argument: the program never
    reads it, a backward returns it as it came. Equal for the same object, so a program
    is reused while the object is."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Opaque and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        return type(self.value).__name__


def _write_input(t: torch.Tensor, value) -> None:
    """A graph's new value of input ``t``, written in place (every alias sees it)."""
    if t.device.type != "tpu":  # a host input (AdamW's step counts without capturable=True)
        if isinstance(value, _dryrun.Abstract):  # a dry run computes no value: the host keeps its own
            return
        with torch.no_grad():
            t.copy_(torch.from_numpy(np.array(value)).to(t.dtype))  # a device-to-host sync
        return
    storage = t.untyped_storage()
    old = getattr(storage, PAYLOAD_ATTR, None)
    if (old is not None and old.shape == value.shape and old.dtype == value.dtype
            and not t.storage_offset() and t.is_contiguous()):
        set_payload(storage, value)  # the whole storage: the common case
        return
    with jax.enable_x64(True):
        write(t, value)


def _onto_mesh(args: list, arrays: list) -> None:
    """Replicate single-device inputs over the mesh the call's sharded inputs are on; the
    payload of a tensor that owns its storage is replaced, so it moves only once."""
    mesh = _placement.mesh_of(arrays)
    if mesh is None:
        return
    storages = {i: a.untyped_storage() for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and a.device.type == "tpu"}
    _placement.onto_mesh(arrays, mesh, storages, PAYLOAD_ATTR)


def _cast_like(out, node):
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and hasattr(out, "dtype"):
        want = to_jax_dtype(val.dtype)
        out = jnp.asarray(out)
        return out if out.dtype == want else out.astype(want)
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out)(_cast_value(o, v) for o, v in zip(out, val))
    return out


def _cast_value(o, v):
    if isinstance(v, torch.Tensor) and hasattr(o, "dtype"):
        want = to_jax_dtype(v.dtype)
        o = jnp.asarray(o)
        return o if o.dtype == want else o.astype(want)
    return o


@dataclasses.dataclass(slots=True, eq=False)  # hashed by identity: the program cache's key
class _Entry:
    compiled: Any
    # where each graph output comes from: (PROGRAM, torch dtype), (INPUT, input index,
    # torch dtype), (SAME, earlier output index, None), (SCALAR, None, None)
    outputs: tuple
    calls: int = 0
    scalars: dict = dataclasses.field(default_factory=dict)
    info: CompileInfo | None = None
    # inputs (indices into the call's arrays) the program overwrites and whose buffers
    # it takes (donates): XLA writes their new values in place instead of allocating
    donated: tuple = ()
    # the same program without donation, for a call that cannot give its buffers up
    # (compiled on first need)
    make_plain: Any = None
    plain: Any = None
    undonated: int = 0  # calls that ran the plain variant
    # the program returns the new values of mutated inputs first (see _Entry.restore);
    # for each mutated input (in ``mutated_inputs`` order), its position among them
    lead: tuple = ()

    def restore(self, outs) -> tuple:
        """The program's outputs in the order the runtime reads them: the graph's, then
        each mutated input's new value, then the assertions' conditions."""
        n = len(self.lead)
        rest = outs[n:]
        k = sum(1 for source, _, _ in self.outputs if source == _PROGRAM)
        return (*rest[:k], *(outs[i] for i in self.lead), *rest[k:])
    has_views: bool = False
    # a program over devices of several processes: what the ranks compare before each call
    spmd: Any = None
    # the static call's tail (see CompiledGraph._static_tail): per graph output, (source,
    # where, shape, torch dtype) when none is a view, False when one is, None until known
    tail: Any = None
    # the value checks the program computes after its assertions (runtime/value_checks.py):
    # per report output, (op, check, statics, LoweredNode); empty for a program without them
    checks: tuple = ()


# output sources (see _Entry.outputs); _VIEW: (VIEW, base output index, (size, stride, offset))
_PROGRAM, _INPUT, _SAME, _SCALAR, _VIEW = range(5)


def _executable(entry: _Entry, donate: bool):
    """``entry``'s program, or when its inputs may not give their buffers up (see
    CompiledGraph._can_donate) the same program without donation, compiled on first need."""
    if donate:
        return entry.compiled
    if entry.plain is None:
        entry.plain = entry.make_plain()
    entry.undonated += 1
    return entry.plain


def _forget_program(entry: _Entry, where: tuple[CompiledGraph, tuple]) -> None:
    graph, sig = where
    graph._forget(sig, entry)


# Every graph's programs share one bound: a run that compiles many graphs (one per
# model, per dynamo recompile) or one graph at many shapes (dynamic shapes) keeps the
# most recently used. Recency is read off each program's call count when one must go,
# so a call does nothing for the cache (a graph finds its program in its own ``cache``).
_programs: LruCache[_Entry, tuple[CompiledGraph, tuple]] = LruCache(
    "compiled programs",
    lambda: config.compiled_cache_size,
    uses=lambda entry, _where: entry.calls,
    on_evict=_forget_program,
)
# divergence tracing's variants of programs (see CompiledGraph.debug_values)
_debug_programs: LruCache[tuple, Any] = LruCache("compiled debug variants", lambda: config.compiled_cache_size)


def _output_views(kind: str, out_nodes: list) -> dict[int, tuple[int, tuple]]:
    """Outputs of an inference graph that view another output's storage in PyTorch
    (``h`` and ``h.view(-1)``, ``h.detach()``): {output: (base output, (size, stride,
    offset))}. AOTAutograd hands such aliasing to the backend (as inductor returns a
    reinterpreted buffer), so the runtime returns them as views of the base's tensor: an
    in-place write to one reaches the other, as in eager PyTorch."""
    if kind != "inference":  # training graphs: AOTAutograd's autograd.Function owns outputs
        return {}
    from torch.multiprocessing.reductions import StorageWeakRef

    vals = [getattr(o, "meta", {}).get("val") if isinstance(o, torch.fx.Node) else None for o in out_nodes]
    groups: dict[Any, list[int]] = {}
    for i, (node, v) in enumerate(zip(out_nodes, vals)):
        if isinstance(v, torch.Tensor) and node.op != "placeholder":
            groups.setdefault(StorageWeakRef(v.untyped_storage()), []).append(i)
    views: dict[int, tuple[int, tuple]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        # the base: an output that is its whole storage, laid out densely
        base = next((i for i in members if vals[i].is_contiguous() and not vals[i].storage_offset()
                     and vals[i].untyped_storage().nbytes() == vals[i].numel() * vals[i].element_size()), None)
        if base is None:
            continue
        for i in members:
            v = vals[i]
            if i != base and v.dtype == vals[base].dtype:
                views[i] = (base, (tuple(v.shape), tuple(v.stride()), v.storage_offset()))
    return views


def _optimizer_step(origin: DynamoOrigin) -> bool:
    """Whether the function dynamo compiled is a ``torch.optim`` optimizer's own code (its
    ``step``, compiled alone: ``tpu_debug.compile(opt.step)``)."""
    if origin.function is None:
        return False
    optim = os.path.dirname(os.path.realpath(torch.optim.__file__)) + os.sep
    return os.path.realpath(origin.function[0]).startswith(optim)


def _computes_gradients(gm: torch.fx.GraphModule) -> bool:
    """Whether a dynamo graph takes gradients itself (a training step whose ``loss.backward()``
    dynamo traced into the graph calls ``torch.autograd.grad`` there)."""
    grads = (torch.autograd.grad, torch.autograd.backward)
    return any(n.op == "call_function" and n.target in grads for n in gm.graph.nodes)


class CompiledGraph:
    """One AOT forward or backward graph; its programs cached by input signature.

    A program falls out of the cache when ``config.compiled_cache_size`` programs of
    newer use exist across all graphs (the tracers hear ``on_evict``); the next call
    with its signature compiles it again. A graph is listed by :func:`graph_stats`
    while it holds a program.
    """

    def __init__(self, gm: torch.fx.GraphModule, kind: str, parent: str, label: str | None = None):
        digest = hashlib.sha1(gm.code.encode()).hexdigest()[:10]
        # what the program is for a reader: AOTAutograd's kind, or train_step / optimizer_step
        # for an "inference" graph that takes gradients or is an optimizer's step
        self.label = label or kind
        self.graph_id = f"{parent}/{self.label}"
        self.digest = digest
        self.kind = kind
        self.gm = gm
        self.program = GraphProgram(gm, self.graph_id, kind)
        self.cache: dict[tuple, _Entry] = {}
        self.compiles = 0
        self.compile_seconds = 0.0
        # what dynamo captured into this graph (dynamo_backend sets it), and what each input of
        # the program is (GraphInfo.inputs)
        self.origin = DynamoOrigin(torch.is_grad_enabled())
        self.inputs: tuple[str, ...] = ()
        self._outputs_made_by: tuple[LoweredNode | None, ...] | None = None
        self.origins: tuple[InputOrigin, ...] = ()
        # A graph whose inputs all have static shapes is only ever called with those
        # shapes and dtypes (dynamo's guards check them before AOTAutograd calls us):
        # its signature is computed on the first call and reused.
        vals = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
        self._static = all(
            isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals
        )
        self._static_sig: tuple | None = None
        self._static_key: tuple | None = None  # (graph id, digest, the static signature)
        self._static_entry: _Entry | None = None  # its executable (CPU numerics)
        # the same for the variant computing the graph's value checks (a probe listens)
        self._checking_sig: tuple | None = None
        self._checking_key: tuple | None = None
        self._checking_entry: _Entry | None = None
        self._static_shapes: tuple = ()

    def _output_nodes(self) -> tuple[LoweredNode | None, ...]:
        """The node that computed each output of the graph (views followed back), read once."""
        if self._outputs_made_by is None:
            self._outputs_made_by = output_nodes(self.gm)
        return self._outputs_made_by

    def _signature(self, arrays) -> tuple:
        if _placement.active:  # a program is compiled for its inputs' shardings
            return tuple((a.shape, a.dtype, _placement.placement(a)) if hasattr(a, "shape") else ("s", a)
                         for a in arrays)
        return tuple((a.shape, a.dtype) if hasattr(a, "shape") else ("s", a) for a in arrays)

    def __call__(self, args):
        # the signature computed once holds no placement: with meshes in use, every call has its own;
        # a program computing value checks has a static entry of its own
        checking = bool(self.program.value_nodes) and _dryrun.active is None and value_checks.wanted("compiled")
        static_entry = self._checking_entry if checking else self._static_entry
        static = (static_entry is not None and config.numerics == "cpu" and not _placement.active
                  and _dryrun.active is None)
        if static and not probes._op_probes:
            out = self._call_static(static_entry, args, self._checking_sig if checking else self._static_sig)
            if out is not None:
                return out
        mutated = self.program.mutated_inputs
        arrays, stores = self._input_arrays(args)
        if _placement.active:
            _onto_mesh(args, arrays)
        targets = [stores.get(i, args[i]) for i in mutated] if mutated else ()
        args.clear()  # boxed calling convention: free inputs early
        if static:
            entry, sig = static_entry, self._checking_sig if checking else self._static_sig
        else:
            entry, sig = self._entry(arrays, checking)
        if self.program.rng_nodes:
            arrays.append(_random.next_key())
        outs = self._execute(entry, sig, arrays, stores)
        if probes._op_probes:  # divergence tracing compares this call with CPU
            probes.observe_graph(self, arrays, _output_arrays(entry, outs, arrays, len(mutated)))
        it = iter(outs)
        result = self._results(entry, it, arrays, self._output_nodes() if _tensor._track is not None else None)
        for t, value in zip(targets, it):  # input mutations: the new value into the input
            if isinstance(t, torch.Tensor):
                _write_input(t, value)
            else:  # the storage of a dense input (see _input_arrays)
                set_payload(t, value)
        if self.program.asserts:
            self._check_asserts(it)
        if entry.checks:
            value_checks.compiled(list(it), entry.checks)
        return result

    def _call_static(self, entry: _Entry, args: list, sig: tuple) -> list | None:
        """The call of a graph whose inputs have static shapes, when every input is a
        dense `tpu` tensor holding its storage's whole payload (a training step's
        parameters and optimizer state, call after call): the general path's work with
        what the static signature already settles left out (each input's shape is the
        signature's: dynamo's guards checked it). None when an input is not such a
        tensor; the general path then takes the call (``args`` untouched).

        A training step passes ~90 inputs: every per-input operation here costs that
        many times per step, about a tenth of a tiny model's whole program."""
        shapes = self._static_shapes
        arrays = []
        storages = []
        for i, (a, shape) in enumerate(zip(args, shapes)):
            storage = a.untyped_storage()
            arr = getattr(storage, PAYLOAD_ATTR, None)
            # the tensor's shape and the whole payload's equal, and contiguous: offset 0
            if type(arr) is not _ArrayImpl or not a.is_contiguous():
                return None
            if arr.aval.shape != shape:
                # a whole payload read in another shape: a backward's incoming gradient through
                # the loss's ``logits.reshape(-1, vocab)`` is the reshaped gradient's storage.
                # Its reshape is one small dispatch; the general path would walk every input
                if (a.storage_offset() or arr.size != a.numel() or i in self.program.mutated_set
                        or arr.dtype != _JAX_OF.get(a.dtype)):
                    return None
                arr = arr.reshape(shape)
            arrays.append(arr)
            storages.append(storage)
        arr = None  # a donated array's references are counted below
        args.clear()  # boxed calling convention: free inputs early
        targets = [storages[i] for i in self.program.mutated_inputs]
        entry.calls += 1
        refs = sys.getrefcount  # (references: as _can_donate counts them)
        executable = _executable(entry, not entry.donated or all(refs(arrays[i]) <= 3 for i in entry.donated))
        if self.program.rng_nodes:
            arrays.append(_random.next_key())
        outs = self._run(executable, arrays, sig)
        tail = entry.tail
        if tail and _tensor._track is None:
            # the outputs' shapes are fixed: new tensors made directly (a forward's saved
            # values: program outputs, inputs passed through, a value twice; a backward's
            # None gradients); the mutated inputs' new values lead the program's outputs,
            # where ``lead`` says
            lead = entry.lead
            program = iter(outs[len(lead):])
            result = []
            for source, where, shape, dtype in tail:
                if source == _PROGRAM:
                    t = _create_empty(shape, dtype)
                    setattr(t.untyped_storage(), PAYLOAD_ATTR, next(program))
                elif source == _INPUT:
                    t = _create_empty(shape, dtype)
                    setattr(t.untyped_storage(), PAYLOAD_ATTR, arrays[where])
                elif source == _SAME:
                    first = result[where]
                    t = _create_empty(shape, dtype)
                    setattr(t.untyped_storage(), PAYLOAD_ATTR, getattr(first.untyped_storage(), PAYLOAD_ATTR))
                else:
                    t = entry.scalars.get(where)
                result.append(t)
            for storage, i in zip(targets, lead):
                setattr(storage, PAYLOAD_ATTR, outs[i])
            if entry.checks:  # the value checks' reports follow the outputs (no assertions here)
                value_checks.compiled(list(program), entry.checks)
            return result
        it = iter(entry.restore(outs) if entry.lead else outs)
        result = self._results(entry, it, arrays, self._output_nodes() if _tensor._track is not None else None)
        if _tensor._track is None:
            for storage, value in zip(targets, it):
                setattr(storage, PAYLOAD_ATTR, value)
        else:
            for storage, value in zip(targets, it):
                set_payload(storage, value)
        if self.program.asserts:
            self._check_asserts(it)
        elif tail is None:
            entry.tail = self._static_tail(entry, outs, arrays)
        if entry.checks:
            value_checks.compiled(list(it), entry.checks)
        return result

    @staticmethod
    def _static_tail(entry: _Entry, outs, arrays: list) -> tuple | bool:
        """What ``_call_static`` needs to finish a call of ``entry`` without the general
        walk over its outputs (``_results``): per graph output, its source, where it comes
        from (an input's index, an earlier output's, a scalar's output index), and its shape
        and torch dtype, all fixed by the static signature; False when an output is a view,
        which the walk handles. (Every mutated input's new value is among the leading
        outputs, ``entry.lead``, whenever the graph mutates any.)"""
        if entry.has_views or any(source == _VIEW for source, _, _ in entry.outputs):
            return False
        program = iter(outs[len(entry.lead):])
        tail: list[tuple] = []
        for i, (source, where, dtype) in enumerate(entry.outputs):
            if source == _PROGRAM or source == _INPUT:
                value = next(program) if source == _PROGRAM else arrays[where]
                tail.append((source, where, tuple(value.shape), dtype or to_torch_dtype(value.dtype)))
            elif source == _SAME:
                shape, dtype = tail[where][2], tail[where][3]
                if shape is None:  # a scalar output again: left to the walk
                    return False
                tail.append((source, where, shape, dtype))
            else:
                tail.append((source, i, None, None))
        return tuple(tail)

    def _check_asserts(self, conditions: Iterator) -> None:
        """Raise for the first device assertion of this call that failed. Reading the
        conditions waits for the program (a CUDA device assert would surface later, at the
        next sync): one boolean read per call, and only graphs holding an assertion pay it."""
        for (message, line), ok in zip(self.program.asserts, conditions):
            if not bool(ok):
                where = f" (from {line})" if line else ""
                raise DeviceAssertError(
                    f"graph {self.graph_id}: device assertion failed: {message.rstrip('.')}{where}; the values "
                    "it checks (class indices, say) are out of range for the op"
                )

    def _input_arrays(self, args) -> tuple[list, dict[int, Any]]:
        """The call's inputs as arrays (Python values as they are), and the storages of
        the mutated inputs read straight from their payload: a new value (same shape
        and dtype, from the program) replaces that payload, nothing to check."""
        arrays = []
        stores: dict[int, Any] = {}
        mutated = self.program.mutated_set
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                # the common case inline: a dense `tpu` tensor owning its whole payload
                storage = a.untyped_storage()
                arr = getattr(storage, PAYLOAD_ATTR, None)
                if (arr is not None and type(arr) is not Uninit and type(arr) is not LazyArray
                        and arr.shape == a.shape and not a.storage_offset() and a.is_contiguous()):
                    if mutated and i in mutated:
                        stores[i] = storage
                elif a.device.type == "tpu":
                    arr = to_jax(a)
                else:
                    arr = jnp.asarray(a.detach().numpy())
                arrays.append(arr)
            else:
                arrays.append(_Opaque(a) if hasattr(a, "shape") else a)
        return arrays, stores

    def _execute(self, entry: _Entry, sig: tuple, arrays: list, stores: dict) -> Any:
        """Run ``entry``'s program on the array inputs, reporting to the probes."""
        entry.calls += 1
        executable = _executable(entry, not entry.donated or self._can_donate(entry.donated, arrays, stores))
        if entry.spmd is not None:  # every rank must be about to run this same program
            _rankcheck.agree(entry.spmd)
        outs = self._run(executable, [a for a in arrays if hasattr(a, "shape")], sig)
        return entry.restore(outs) if entry.lead else outs

    def _run(self, executable, arrays: list, sig: tuple):
        """``executable`` on ``arrays``, timed for the probes when any listen."""
        if self.program.collectives:  # waited for, its collectives' lines known (see there)
            from tpu_debug.runtime.distributed import compiled_collectives  # deferred: optional: its ops are torch.distributed's

            executable = functools.partial(compiled_collectives.run, executable)
        if not probes._probes:
            return executable(*arrays)
        if sig is self._static_sig:
            # one key object for every call of a static graph: probes find their counters by
            # its identity instead of hashing ~90 input specs per call
            key = self._static_key
            if key is None:
                key = self._static_key = (self.graph_id, self.digest, sig)
        elif sig is self._checking_sig:
            key = self._checking_key
        else:
            key = (self.graph_id, self.digest, sig)
        if probes._routes.on_execute_begin:
            probes.executing("compiled", self.graph_id, key)
        start = time.perf_counter()
        outs = executable(*arrays)
        probes.executed("compiled", self.graph_id, key, time.perf_counter() - start)
        return outs

    @staticmethod
    def _results(entry: _Entry, it: Iterator, arrays: list, nodes: Sequence[LoweredNode | None] | None = None) -> list:
        """The graph's outputs as tensors, from the program's outputs (``it``, advanced
        past them) and where ``entry`` says each output comes from; with ``nodes`` (memory
        tracked), each new tensor is told to the memory probes as made by its graph node."""
        result = []
        scalars = entry.scalars
        for i, (source, where, dt) in enumerate(entry.outputs):
            if source == _PROGRAM:
                if nodes is not None:
                    memory_ledger.made_by(nodes[i] if i < len(nodes) else None)
                result.append(from_jax(next(it), dt))
                if nodes is not None:
                    memory_ledger.made_by(None)
            elif source == _INPUT:  # an input passed through (saved for backward): no copy
                result.append(from_jax(arrays[where], dt))
            elif source == _SAME:  # the same value again: its own tensor, the same buffer
                first = result[where]
                result.append(from_jax(to_jax(first), first.dtype))
            elif source == _VIEW:  # filled in below, once its base exists
                result.append(None)
            else:
                result.append(scalars.get(i))
        if entry.has_views:
            for i, (source, where, geometry) in enumerate(entry.outputs):
                if source == _VIEW:
                    result[i] = result[where].as_strided(*geometry)
        return result

    def _entry(self, arrays, checking: bool = False) -> tuple[_Entry, tuple]:
        """The executable for these inputs and its signature, compiled on a miss (with
        ``checking``, the variant computing the graph's value checks)."""
        static = self._static and not _placement.active
        if static:
            if self._static_sig is None:
                self._static_sig = self._signature(arrays)
            sig = self._static_sig
        else:
            sig = self._signature(arrays)
        cpu = config.numerics == "cpu"
        if not cpu:  # TPU numerics change what products compile to
            sig += (("numerics",) + config.numerics_key(),)
        if _dryrun.active is not None:  # a dry run's program computes shapes only
            sig += (_dryrun.active.key,)
            cpu = False
        if checking:
            sig += (("value checks",),)
        entry = self.cache.get(sig)
        if entry is None:
            entry = self._compile(sig, arrays, checking)
            self._keep(sig, entry)
        # reused without a lookup (see __call__): only a signature without placements, the one
        # every call of this graph has; a sharded signature is one mesh's and layout's program
        if static and cpu and entry.spmd is None:
            if checking:
                # the probes' key is made with its signature: a key kept from another
                # signature would report this program's runs as that program's
                if self._checking_sig != sig:
                    self._checking_sig, self._checking_key = sig, (self.graph_id, self.digest, sig)
                sig = self._checking_sig  # the same signature, the object _run knows its key by
                self._checking_entry = entry
            else:
                self._static_entry = entry
            self._static_shapes = tuple(s[0] for s in sig[:len(arrays)])
        return entry, sig

    def _keep(self, sig: tuple, entry: _Entry) -> None:
        """Cache a new program (which may push out the least recently used one)."""
        self.cache[sig] = entry
        with _lock:
            if not any(g is self for g in _graphs):
                _graphs.append(self)
        _programs.put(entry, (self, sig))

    def _forget(self, sig: tuple, entry: _Entry) -> None:
        """The program cache's bound pushed ``entry`` out: drop it, and tell the tracers."""
        if self.cache.get(sig) is entry:
            del self.cache[sig]
        if self._static_entry is entry:
            self._static_entry = None
        if self._checking_entry is entry:
            self._checking_entry = None
        if not self.cache:
            with _lock:
                _graphs[:] = [g for g in _graphs if g is not self]
        announce_evicted("compiled", self.graph_id, (self.graph_id, self.digest, sig))

    @staticmethod
    def _can_donate(donated: tuple, arrays: list, stores: dict) -> bool:
        """Whether the buffers of inputs ``donated`` may go to the program: each is the
        whole payload of its input's storage (its new value replaces it after the call)
        and nothing else holds it: no other tensor's storage (a saved tensor, a tensor
        sharing the array), no tracer. A donated array is deleted by the call."""
        if probes._op_probes:  # divergence tracing reads the inputs again after the call
            return False
        # references: the storage's payload attribute, ``arrays``, getrefcount's argument
        return all(i in stores and sys.getrefcount(arrays[i]) <= 3 for i in donated)

    def _compile(self, sig, arrays, checking: bool = False) -> _Entry:
        """Trace, lower and compile the program for inputs ``arrays`` (signature ``sig``)."""
        began = time.perf_counter()
        out_nodes = list(self.gm.graph.output_node().args[0])
        views = _output_views(self.kind, out_nodes)
        fn, kinds, scalars, lead = self._traceable(arrays, out_nodes, views, checking)
        example = [a for a in arrays if hasattr(a, "shape")]
        if self.program.rng_nodes:
            example.append(np.zeros(2, np.uint32))  # an aval only: drawing a real key would shift the stream
        if probes._probes:
            probes.compiling("compiled", self.graph_id)
        # inputs the program overwrites (an optimizer's parameters and state) donate their
        # buffers: XLA writes the new values in place. AdamW on a 0.4M-parameter MLP: 0.27
        # instead of 0.78 ms a step, which allocated and filled 24 fresh buffers
        positions = {i: k for k, i in enumerate(i for i, a in enumerate(arrays) if hasattr(a, "shape"))}
        donated = tuple(i for i in self.program.mutated_inputs if i in positions)
        if _placement.active:  # sharded inputs keep their shardings, XLA propagates the rest
            specs = _placement.abstract(example, _placement.mesh_of(example))
        else:
            specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in example]

        def jitted(donate: tuple, order: tuple | None = None):
            # JAX gives each donated buffer to the first output of its shape and dtype not
            # yet given one, donated inputs taken in order: the mutated inputs' new values
            # come first, the donated ones in input order, so each goes into its own input's
            # buffer (else a gradient may take a parameter's, and XLA copies every
            # parameter aside before the backward reads it)
            # (``order``: the donated inputs whose layout to follow, the plain variant's
            # those of the program it stands in for)
            order = donate if order is None else order
            mutated = self.program.mutated_inputs
            first = sorted(i for i in mutated if i in order)
            lead[:] = [mutated.index(i) for i in first] + [j for j, i in enumerate(mutated) if i not in order]
            return jax.jit(fn, donate_argnums=tuple(positions[i] for i in donate))

        def lower(donate: tuple):
            return jitted(donate).lower(*specs)

        start = time.perf_counter()
        with jax.enable_x64(True):
            lowered = lower(donated)
            passed_through = {where for k, where in kinds if k == _INPUT}
            if passed_through & set(donated):  # an overwritten input also returned as it was
                donated = tuple(i for i in donated if i not in passed_through)
                lowered = lower(donated)
            lower_seconds = time.perf_counter() - start
            # a dry run executes nothing: the program goes to the target's compiler instead
            dry = _dryrun.active
            # the target's compiler reads nothing from this machine's cache
            with local_compile(enabled=dry is None, program=program_identity("compiled", self.graph_id, arrays)) as cached:
                compiled = (lowered.compile(cached.options) if dry is None
                            else dry.program(lowered, "compiled", self.graph_id))
        seconds = time.perf_counter() - start
        self.compiles += 1
        self.compile_seconds += seconds
        outputs = _output_sources(kinds, out_nodes, views, lowered, skip=len(lead))
        # lead: where each mutated input's value is among the leading outputs
        entry = _Entry(compiled, outputs, scalars=dict(scalars), donated=donated,
                       has_views=any(k == _VIEW for k, _, _ in outputs),
                       lead=tuple(lead.index(j) for j in range(len(lead))),
                       checks=tuple(info for _r, info in self.program.traced_checks) if checking else ())
        if donated:
            def make_plain():
                with jax.enable_x64(True):
                    if dry is not None:
                        return compiled  # shapes only: donation changes nothing
                    with local_compile() as again:
                        return jitted((), donated).lower(*specs).compile(again.options)

            entry.make_plain = make_plain
        entry.info = self._compile_info(sig, arrays, seconds, lowered, compiled if dry is None else None, jitted(donated),
                                        cached, lower_seconds, time.perf_counter() - began)
        if _placement.active and _placement.spans_processes(example):
            entry.spmd = _rankcheck.ProgramCard.of(entry.info)
        if probes._probes:
            probes.compiled(entry.info)
        return entry

    def _traceable(self, arrays: list, out_nodes: list, views: dict,
                   checking: bool = False) -> tuple[Any, list, dict, list]:
        """The function to jit for inputs ``arrays``, with what tracing it tells: where each
        output comes from (``kinds``: (source, where) per output) and the Python scalars
        among the outputs (``scalars``: {output index: value}).

        Outputs: None, a tensor, or a Python scalar (a shape saved for backward). A tensor
        output that is an input passed through (AOTAutograd saves inputs for backward), or
        a value the program already returns (``relu`` and ``detach(relu)``), is not
        returned by the program again: XLA would copy it into a buffer of its own (a
        1 MiB weight costs ~70 us of a 0.4 ms MLP forward on this machine). Decided
        while tracing, by the identity of the traced values."""
        statics = {i: a for i, a in enumerate(arrays) if not hasattr(a, "shape")}
        program = self.program
        n = len(arrays)
        tensor_out = [isinstance(getattr(o, "meta", {}).get("val"), torch.Tensor) for o in out_nodes]
        kinds: list[tuple[int, int | None]] = []
        scalars: dict[int, Any] = {}
        # the mutated inputs' values come first, in this order (of ``mutated_inputs``
        # positions; see _compile)
        lead: list[int] = []
        n_mut = len(program.mutated_inputs)

        def fn(*dyn):
            it = iter(dyn)
            full = [statics[i] if i in statics else next(it) for i in range(n)]
            if program.rng_nodes:
                full.append(next(it))
            outs = program(*full, checking=checking)
            inputs = {id(v): i for i, v in enumerate(full[:n]) if hasattr(v, "shape")}
            first: dict[int, int] = {}
            kinds.clear()
            for i, (is_tensor, o) in enumerate(zip(tensor_out, outs)):
                if not is_tensor or o is None:
                    if o is not None:
                        if type(o) is _Opaque:  # an opaque input passed through (a backward's)
                            scalars[i] = o.value
                        else:
                            scalars[i] = int(o) if not hasattr(o, "dtype") else o
                    kinds.append((_SCALAR, None))
                elif i in views:
                    kinds.append((_VIEW, views[i][0]))
                elif id(o) in inputs:
                    kinds.append((_INPUT, inputs[id(o)]))
                elif id(o) in first:
                    kinds.append((_SAME, first[id(o)]))
                else:
                    first[id(o)] = i
                    kinds.append((_PROGRAM, None))
            rest = outs[len(out_nodes):]
            muts, checks = rest[:n_mut], rest[n_mut:]
            return (*(muts[j] for j in lead), *(o for (k, _), o in zip(kinds, outs) if k == _PROGRAM), *checks)

        return fn, kinds, scalars, lead

    def _compile_info(self, sig: tuple, arrays: list, seconds: float, lowered, compiled,
                      jitted=None, cached: CacheOutcome | None = None, lower_seconds: float = 0.0,
                      wall_seconds: float = 0.0) -> CompileInfo:
        specs = tuple(
            ArgSpec(f"arg{i}", tuple(a.shape), str(a.dtype), layout=_placement.layout(a) if _placement.active else ())
            if hasattr(a, "shape") else ArgSpec(f"arg{i}", static=a)
            for i, a in enumerate(arrays)
        )
        return CompileInfo(
            "compiled", self.graph_id, (self.graph_id, self.digest, sig), specs, seconds, lowered, compiled,
            graph=GraphInfo(self.kind, tuple(self.program.nodes), self.gm.code, self.origin, label=self.label,
                            inputs=self.inputs, origins=self.origins),
            jitted=jitted,
            from_cache=cached is not None and cached.from_cache,
            saved_seconds=cached.saved_seconds if cached is not None else 0.0,
            lower_seconds=lower_seconds,
            wall_seconds=wall_seconds,
            cache_entry=str(cached.entry) if cached is not None and cached.entry is not None else None,
            cache_miss=cached.miss if cached is not None else None,
        )

    # -- debug variant (divergence against CPU) ---------------------------------------

    def debug_values(self, arrays: list, nodes: frozenset) -> dict[str, Any]:
        """The values of FX nodes ``nodes`` (names) for the inputs of one call.

        ``arrays`` are the inputs as this graph's call received them (the random
        key last when the graph draws random numbers, so random nodes give the
        same values). A variant of the program that also returns those nodes is
        compiled once per input signature, node set and numerics setting, and kept
        within ``config.compiled_cache_size`` such variants.
        """
        key = (self, self._signature(arrays), nodes, config.numerics_key())
        run = _debug_programs.get(key)
        if run is None:
            run = self._compile_debug(arrays, nodes)
            _debug_programs.put(key, run)
        return run(*[a for a in arrays if hasattr(a, "shape")])

    def _compile_debug(self, arrays: list, nodes: frozenset):
        program = self.program
        n = len(arrays) - (1 if program.rng_nodes else 0)
        statics = {i: a for i, a in enumerate(arrays[:n]) if not hasattr(a, "shape")}

        def fn(*dyn):
            it = iter(dyn)
            full = [statics[i] if i in statics else next(it) for i in range(n)]
            if program.rng_nodes:
                full.append(next(it))
            _, values = program(*full, debug=nodes)
            return {k: v for k, v in values.items() if hasattr(v, "shape") and hasattr(v, "dtype")}

        with jax.enable_x64(True), local_compile():
            return jax.jit(fn).lower(*[a for a in arrays if hasattr(a, "shape")]).compile()


def _output_sources(kinds: list, out_nodes: list, views: dict, lowered, skip: int = 0) -> tuple:
    """``_Entry.outputs``: each graph output's source with its dtype (or view geometry);
    the program's first ``skip`` outputs are mutated inputs' values."""
    outputs = []
    leaves = itertools.islice(jax.tree_util.tree_leaves(lowered.out_info), skip, None)
    for i, ((k, where), node) in enumerate(zip(kinds, out_nodes)):
        if k == _PROGRAM:
            outputs.append((k, None, to_torch_dtype(next(leaves).dtype)))
        elif k == _INPUT:
            outputs.append((k, where, node.meta["val"].dtype))
        elif k == _VIEW:
            outputs.append((k, where, views[i][1]))
        else:
            outputs.append((k, where, None))
    return tuple(outputs)


def _output_arrays(entry: _Entry, outs: Sequence, arrays: list, mutated: int) -> list:
    """What one call of ``entry``'s program gave each FX output, as arrays (None for a Python
    scalar and for an output viewing another), then each mutated input's new value: the
    values the caller receives, which divergence tracing compares with CPU."""
    it = iter(outs)
    values: list = []
    for source, where, _ in entry.outputs:
        if source == _PROGRAM:
            values.append(next(it))
        elif source == _INPUT:
            values.append(arrays[where])
        elif source == _SAME:
            values.append(values[where])
        else:
            values.append(None)
    values.extend(itertools.islice(it, mutated))
    return values


def _replay():
    """CompileInfo of every program cached now (for a tracer that starts late)."""
    for g in list(_graphs):
        for entry in list(g.cache.values()):
            if entry.info is not None:
                yield entry.info


probes.add_replay_source(_replay)


def graph_stats() -> list[dict]:
    """Every graph holding a cached program: id, kind, compiles, calls, compile seconds.

    ``compiles`` counts every compile of the graph, recompiles of evicted programs
    included; ``calls`` the calls of its programs cached now."""
    return [
        {
            "graph_id": g.graph_id,
            "kind": g.kind,
            "compiles": g.compiles,
            "calls": sum(e.calls for e in list(g.cache.values())),
            "compile_seconds": g.compile_seconds,
        }
        for g in list(_graphs)
    ]


def _last_line(stack_trace: str | None) -> str | None:
    """The innermost ``File "...", line N`` of an FX node's stack trace, as ``file:N``."""
    if not stack_trace:
        return None
    frames = [ln.strip() for ln in stack_trace.splitlines() if ln.strip().startswith('File "')]
    if not frames:
        return None
    path, _, rest = frames[-1].removeprefix('File "').partition('", line ')
    return f"{path}:{rest.split(',')[0]}"


def _source_name(node: torch.fx.Node) -> str:
    """Where dynamo took a graph input from (``L['x']``, ``L['x'].size()[0]``), for messages."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    return str(name) if name else node.name


def _dynamo_origin(gm: torch.fx.GraphModule) -> DynamoOrigin:
    """Which dynamo frame (function) and which of its compiles ``gm`` is, so the recompile
    tracer can tell a recompile of one function from a new function."""
    ctx = torch._guards.CompileContext.try_get()
    cid = ctx.compile_id if ctx is not None else None
    known = cid is not None and cid.frame_id is not None
    tctx = torch._guards.TracingContext.try_get()
    function = None
    if tctx is not None and tctx.traced_code:  # the function itself: frame ids restart with dynamo
        code = tctx.traced_code[0]
        function = (code.co_filename, code.co_firstlineno, code.co_name)
    return DynamoOrigin(
        torch.is_grad_enabled(),
        frame=cid.frame_id if known else None,
        compile_id=str(cid) if known else None,
        function=function,
        inputs=tuple(_source_name(n) for n in gm.graph.find_nodes(op="placeholder")),
    )


def dynamo_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``"tpu_debug"`` dynamo backend: AOTAutograd + one jitted program per graph (the
    device registered: see ``tpu_debug._loader.dynamo_backend`` for dynamo's entry point)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    single_threaded_backward()
    register_prims()
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        # a compiled-autograd graph takes its inputs boxed in lists (DDP's python_reducer
        # puts its bucket all-reduces there): flattened first, as PyTorch's AOT backends do
        from torch._dynamo.utils import flatten_graph_inputs

        return flatten_graph_inputs(gm, example_inputs, dynamo_backend)
    parent = f"g{next(_graph_ids)}"
    # the graph itself; a graph taking its inputs boxed comes wrapped (see above)
    graph = gm if isinstance(gm, torch.fx.GraphModule) else gm.gm
    origin = _dynamo_origin(graph)
    lifted = tuple(n for n, _ in graph.named_parameters(remove_duplicate=False)) + tuple(
        n for n, _ in graph.named_buffers(remove_duplicate=False))
    # AOTAutograd calls a graph with no autograd around it "inference"; one that takes the
    # gradients itself is a whole training step, and an optimizer's code its step
    step = _computes_gradients(graph)
    inference = "train_step" if step else "optimizer_step" if _optimizer_step(origin) else "inference"

    # what each program input is to the user (runtime/graph_inputs.py): the forward's, which its
    # backward's saved inputs are read against
    origins = forward_origins(graph, lifted, origin.inputs, example_inputs)
    forward_graph: list[torch.fx.GraphModule] = []

    def compiler(kind):
        def compile_graph(graph: torch.fx.GraphModule, inputs):
            label = inference if kind == "inference" else kind
            program = CompiledGraph(graph, kind, parent, label)
            program.origin = origin
            # AOTAutograd passes the graph module's own tensors (an optimizer's state dynamo
            # lifted) before the graph's inputs; a backward's inputs are its placeholders, a
            # forward input it saved (primals_<n>, or a view of it) named as that forward input
            program.inputs = lifted + origin.inputs
            program.origins = origins
            if kind == "forward":
                forward_graph[:] = [graph]
            if kind == "backward":
                program.inputs, program.origins = backward_inputs(
                    graph, forward_graph[0] if forward_graph else None, lifted + origin.inputs, origins)

            # AOTAutograd calls this lazily: a backward is compiled on its first call, which
            # may come from user code dynamo is running (``loss.backward()`` after a graph
            # break); dynamo must not trace into the runtime
            def run(args):
                return program(args)

            run = dynamo_disabled(run)
            run._boxed_call = True
            return run

        # called lazily too (a backward's first call, from code dynamo is running): hidden as run is
        return dynamo_disabled(compile_graph)

    # The real `tpu` inputs go to AOTAutograd: it fakes them itself (FakeTensor
    # works on PrivateUse1 tensors), and sharing dynamo's shape environment keeps
    # every symbol tied to an input (CPU stand-ins break that for BatchNorm).
    return aot_module_simplified(
        gm,
        list(example_inputs),
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=graph_decompositions(),
        keep_inference_input_mutations=True,
        partition_fn=_partition,
    )


def _partition(joint_module: torch.fx.GraphModule, joint_inputs, **kwargs):
    """AOTAutograd's default partitioner, timed among dynamo's own compile events
    (``PARTITION_SPAN``): AOTAutograd times its joint graph's tracing but not its
    split into forward and backward, and a compile's phases are read from those events
    (``torch._dynamo.utils.compile_times()`` lists it too)."""
    from torch._dynamo.utils import dynamo_timed
    from torch._functorch.partitioners import default_partition

    with dynamo_timed(PARTITION_SPAN, log_pt2_compile_event=True):
        return default_partition(joint_module, joint_inputs, **kwargs)


def compile(fn_or_module, *, backward_in_graph: bool = True, **kwargs):
    """``torch.compile(fn_or_module, backend="tpu_debug", **kwargs)``.

    A function (not a module) that calls ``loss.backward()`` or
    ``torch.autograd.grad`` compiles them into its graph when ``backward_in_graph``
    (dynamo's ``trace_autograd_ops``, set while the function runs): forward and
    backward become one XLA program and the gradients land in ``.grad`` as
    ``backward()`` leaves them. An ``opt.step()`` and ``opt.zero_grad()`` in the
    function join the same graph (see :mod:`tpu_debug.runtime.fused_step`): a whole
    training step is one XLA program, the parameters and optimizer state donated to it
    and updated in place. Return ``loss.detach()``: a returned tensor whose
    backward the graph consumed graph-breaks (dynamo then falls back to tracing the
    backward separately). ``torch.compile(fn, backend="tpu_debug")`` does the same when
    ``torch._dynamo.config.trace_autograd_ops`` is set.

    Example::

        model = tpu_debug.compile(model)
        def train_step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss.detach()
        train_step = tpu_debug.compile(train_step)   # one program: forward + backward
        def full_step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        full_step = tpu_debug.compile(full_step)   # one program: the whole step
    """
    compiled = torch.compile(fn_or_module, backend=dynamo_backend, **kwargs)
    # an optimizer's own step has no backward to trace: it stays the graph PyTorch makes
    # of it (its grad-mode graph breaks keep it an inference graph, updated in place)
    optimizer_step = isinstance(getattr(fn_or_module, "__self__", None), torch.optim.Optimizer)
    if not backward_in_graph or isinstance(fn_or_module, torch.nn.Module) or optimizer_step:
        return compiled

    # an optimizer step and zero_grad in the function join its graph; global step hooks
    # run after it
    call = fused_step.StepHooks().call if fused_step.install() else (lambda f, a, k: f(*a, **k))
    from torch._dynamo import config as dynamo_config

    @functools.wraps(fn_or_module)
    def run(*args, **kw):
        if dynamo_config.trace_autograd_ops:
            return call(compiled, args, kw)
        dynamo_config.trace_autograd_ops = True
        try:
            return call(compiled, args, kw)
        finally:
            dynamo_config.trace_autograd_ops = False

    return run


def _auto_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The default ``torch.compile`` backend: ours for `tpu` inputs, inductor otherwise."""
    if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in example_inputs):
        return dynamo_backend(gm, example_inputs, **kwargs)
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend("inductor")(gm, example_inputs, **kwargs)


_state: dict[str, bool] = {}  # "metas": register_metas has run


def register_metas() -> None:
    """Give dynamo and AOTAutograd each lowering's own meta function (``Lowering.meta``)
    for `tpu` inputs.

    Both run every op on fake tensors first, through the op's meta kernel; where
    PyTorch's refuses a call the lowering runs (``_grouped_mm`` in float32), FakeTensor's
    per-op rules (``fake_impls.register_op_impl``) give it the lowering's instead. The
    rule steps aside (``NotImplemented``) for any other device, so CPU and CUDA tracing
    keep PyTorch's meta kernels."""
    from torch._subclasses import fake_impls

    metas = {op: low.meta for op, low in registered().items() if low.meta is not None}
    if not metas or _state.get("metas"):
        return
    _state["metas"] = True

    def on_tpu(fake_mode, func, *args, **kwargs):
        values = itertools.chain(args, kwargs.values())
        if not any(isinstance(v, torch.Tensor) and v.device.type == "tpu" for v in values):
            return NotImplemented
        with fake_mode:
            return metas[func](*args, **kwargs)

    fake_impls.register_op_impl(lambda func: func in metas)(on_tpu)


def install_backends() -> None:
    """Register ``"tpu"`` (unless another package has it) and make the default
    backend pick ``tpu_debug`` for `tpu` inputs."""
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry

    register_metas()
    others = {ep.name for ep in entry_points(group="torch_dynamo_backends") if not ep.value.startswith("tpu_debug")}
    if "tpu_debug" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=dynamo_backend, name="tpu_debug")
    if "tpu" not in others and "tpu" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=dynamo_backend, name="tpu")
    if registry.get_default_backend() == "inductor":
        registry.set_default_backend(_auto_backend)
