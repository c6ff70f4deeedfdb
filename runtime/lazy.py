"""Lazy fused eager mode: ops are recorded, then run as one XLA program when a value is needed.

TorchTPU's default eager mode is ``DEFER_AND_FUSE``: an op on a `tpu` tensor does
not run when it is called. It is appended to a *pending graph*, and its outputs
are :class:`~tpu_debug.runtime.tensor.LazyArray` payloads whose shape and dtype
are known and whose values are not. When something needs a value, the pending
graph is *materialized*: compiled into one XLA program (or found in the cache of
fused programs) and run, and every pending value still referenced gets its
array. What needs a value (the *trigger*): reading it on the host (``.item()``,
``.cpu()``, ``print``, ``if t:``), an op with no lowering run on CPU, an op whose
output shape depends on values (``nonzero``), ``torch.tpu.synchronize()``, the end
of ``optimizer.step()``, the graph reaching ``config.lazy_graph_limit`` ops, and
leaving the mode. PyTorch/XLA's lazy tensors work the same way.

What is reused: each recorded op is the eager interpreter's op call (its cache
key, its traced lowering, its output handling: in-place and ``out=`` writes,
views, autograd all go through the same code); views and in-place writes of
pending values become graph steps (a strided read, a strided write, a cast), as
the eager runtime's view model does them on concrete arrays.

The cache of fused programs is keyed by the graph's structure: per op, its eager
key (argument shapes and dtypes, static arguments) and where each input comes
from (an earlier op, a graph input, a float scalar), and which values are still
referenced when it runs. Tensors the graph reads (parameters, batches) and
Python floats (a learning rate, AdamW's bias corrections) are program inputs,
never constants: the steps of a training loop find their program in the cache.

The mode is ``config.eager_mode``; ``torch.tpu.set_eager_mode`` (a context
manager) and the ``torch.tpu.eager_mode`` property change it, as in TorchTPU.
While a divergence trace observes ops (``probes._op_probes``), ops run one by one
whatever the mode: the tracer compares each op's output with CPU.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import math
import threading
import time
import weakref
from typing import Any

import jax
import numpy as np
import torch
from tpu_debug.runtime import dry_mode as _dryrun
from tpu_debug.runtime import eager as _eager
from tpu_debug.runtime import probes
from tpu_debug.runtime import rng_state as _random
from tpu_debug.runtime import value_checks
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.compile_cache import local_compile, program_identity
from tpu_debug.runtime.config import EAGER_MODES, config
from tpu_debug.runtime.dtypes import to_jax_dtype, to_torch_dtype
from tpu_debug.core.argspec import ArgSpec
from tpu_debug.core.records import (
    CompileInfo,
    DynamoOrigin,
    GraphInfo,
    LazyNode,
    LoweredNode,
    MaterializeInfo,
)
from tpu_debug.runtime.tensor import (
    LazyArray,
    PAYLOAD_ATTR,
    _create_empty,
    _readable,
    _strided_write,
    set_payload,
    to_jax,
    view_pattern,
    view_value,
    write,
)

from tpu_debug.core.errors import LoweringBugError, TpuArgumentError

__all__ = [
    "EagerMode",
    "computed",
    "convert",
    "dispatch",
    "eager_mode",
    "fused_stats",
    "hook_optimizers",
    "materialize",
    "pending_ops",
    "set_eager_mode",
    "set_mode",
    "value_of",
]


class EagerMode(enum.Enum):
    """How ops on `tpu` tensors run outside compiled graphs (TorchTPU's names).

    ``DEFER_AND_FUSE``: recorded and run as fused programs when a value is needed.
    ``DEFER_NEVER``: one executable per op, dispatched when the op is called.
    ``DEFER_NEVER_AND_LAUNCH_BLOCKING``: op by op, each one waited for before the
    call returns (a device error then surfaces at the op that caused it).
    """

    DEFER_AND_FUSE = "defer_and_fuse"
    DEFER_NEVER = "defer_never"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "defer_never_and_launch_blocking"
    # TorchTPU's internal mode deferring every op, which DEFER_AND_FUSE does here (an alias)
    INTERNAL_DEFER_ALL = "defer_and_fuse"  # noqa: PIE796 (an alias, on purpose)
    # TorchTPU's deprecated mode: deferred and fused, its programs compiled at XLA's O1; the
    # level is TORCH_TPU_INTERNAL_XLA_OPTIONS=xla_optimization_level=O1 here, for every mode
    DEFER_AND_FUSE_WITH_O1 = "defer_and_fuse"  # noqa: PIE796 (an alias, on purpose)

    def __call__(self, mode: EagerMode | str) -> set_eager_mode:
        """``with torch.tpu.eager_mode(EagerMode.DEFER_NEVER):``, as TorchTPU's guide writes it:
        the mode in effect, called with a mode, is ``set_eager_mode(mode)``."""
        return set_eager_mode(mode)


_FUSE = EagerMode.DEFER_AND_FUSE.value
_NEVER = EagerMode.DEFER_NEVER.value
_BLOCKING = EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING.value
assert tuple(m.value for m in EagerMode) == EAGER_MODES


def eager_mode() -> EagerMode:
    """The eager mode in effect (``torch.tpu.eager_mode``)."""
    return EagerMode(config.eager_mode)


def _parse_mode(mode: Any) -> str:
    if isinstance(mode, EagerMode):
        return mode.value
    if isinstance(mode, str) and mode.strip().lower() in EAGER_MODES:
        return mode.strip().lower()
    raise TpuArgumentError(
        f"eager mode {mode!r} is not one of torch.tpu.EagerMode.DEFER_AND_FUSE, DEFER_NEVER, "
        "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    )


def set_mode(mode: EagerMode | str) -> None:
    """Make ``mode`` the eager mode (``torch.tpu.eager_mode = mode``).

    Leaving ``DEFER_AND_FUSE`` runs what is pending first, so every value is computed
    in the mode it was recorded in.

    Raises:
        TpuArgumentError: ``mode`` is no EagerMode (nor the name of one).
    """
    value = _parse_mode(mode)
    if config.eager_mode == _FUSE and value != _FUSE:
        materialize("mode_change")
    config.eager_mode = value
    if value == _FUSE:
        hook_optimizers()


class set_eager_mode(contextlib.ContextDecorator):
    """``with torch.tpu.set_eager_mode(mode):`` runs the block in ``mode``, then puts
    the previous mode back (TorchTPU pushes and pops the mode the same way; called
    without ``with`` it changes nothing, there as here).

    Raises:
        TpuArgumentError: ``mode`` is no EagerMode (raised by the call itself).

    Example::

        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            loss = model(x).sum(); loss.backward(); opt.step()
    """

    def __init__(self, mode: EagerMode | str) -> None:
        self.mode = _parse_mode(mode)
        self._previous: list[str] = []

    def __enter__(self) -> None:
        self._previous.append(config.eager_mode)
        set_mode(self.mode)

    def __exit__(self, *exc: object) -> None:
        set_mode(self._previous.pop())


# ---------------------------------------------------------------------------
# Templates: one per distinct recorded step (an op's eager key, a cast, a view read)
# ---------------------------------------------------------------------------


class _Template:
    """What a graph step computes: its traced function and its output avals."""

    __slots__ = ("calls", "dtypes", "fn", "inputs", "name", "outs", "size", "specs", "struct")

    def __init__(self, name, fn, outs, struct, dtypes, specs, inputs) -> None:
        # the one output's shape as a torch.Size when the op returns one tensor (its result
        # is made without the eager interpreter's walk over output structures)
        self.size = torch.Size(outs[0][0]) if struct is not None and struct[0] and len(outs) == 1 else None
        self.name = name  # "mm", "add.Tensor", "cast", "view", ...
        self.fn = fn  # flat JAX inputs -> tuple of flat outputs (traceable)
        self.outs = outs  # ((shape, numpy dtype), ...) per output
        self.struct = struct  # the eager interpreter's output structure (aten ops)
        self.dtypes = dtypes  # torch dtype per output
        self.specs = specs  # ArgSpecs of the op's arguments (for recompile diffs)
        self.inputs = inputs  # a name per flat input ("self", "other", "key")
        self.calls = 0


_templates: LruCache[Any, _Template] = LruCache(
    "lazy op templates",
    lambda: config.eager_cache_size,
    uses=lambda _key, tpl: tpl.calls,
    on_evict=lambda _key, tpl: _eager.forget_signatures(tpl),
)


def _aval(a) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)


def _input_names(plan, skel_args, skel_kwargs, rng: bool) -> tuple[str, ...]:
    """A name for each flat input of an op call, in the order its traced function takes them."""
    schema_names = [a.name for a in plan.op._schema.arguments]
    out: list[str] = []

    def walk(name, s):
        if type(s) is _eager._Dyn or type(s) is _eager._Spec:
            out.append(name)
        elif type(s) is tuple and len(s) == 2 and (s[0] is list or s[0] is tuple):
            for i, v in enumerate(s[1]):
                walk(f"{name}[{i}]", v)

    for i, s in enumerate(skel_args):
        walk(schema_names[i] if i < len(schema_names) else f"arg{i}", s)
    for k, s in skel_kwargs:
        walk(k, s)
    if rng:
        out.append("key")
    return tuple(out)


def _op_template(plan, key, skel_args, skel_kwargs, arrays, rng: bool) -> _Template:
    """The template of an aten op call: the eager interpreter's traced function, its
    output avals found by tracing it once (``jax.eval_shape``: a lowering's error
    surfaces at the op's call, as in eager mode)."""
    traced, struct_box = _eager.traced_function(plan, skel_args, skel_kwargs, rng)
    with jax.enable_x64(True):
        out = jax.eval_shape(traced, *[_aval(a) for a in arrays])
    outs = tuple((tuple(o.shape), o.dtype) for o in out)
    dtypes = tuple(to_torch_dtype(d) for _s, d in outs)
    specs = _eager._specs(plan.op._schema, skel_args, skel_kwargs)
    return _Template(plan.name, traced, outs, struct_box[0], dtypes, specs,
                     _input_names(plan, skel_args, skel_kwargs, rng))


def _step_template(name: str, fn, statics: tuple, inputs: tuple) -> _Template:
    """The template of a built-in step (``fn(*inputs, *statics)``), keyed by its inputs' avals."""
    key = (name, statics, tuple((tuple(a.shape), a.dtype) for a in inputs))
    tpl = _templates.lookup(key)
    if tpl is not None:
        return tpl

    def step(*flat):
        return (fn(*flat, *statics),)

    with jax.enable_x64(True):
        (out,) = jax.eval_shape(step, *[_aval(a) for a in inputs])
    outs = ((tuple(out.shape), out.dtype),)
    specs = tuple(ArgSpec(f"x{i}", tuple(a.shape), str(np.dtype(a.dtype))) for i, a in enumerate(inputs))
    specs += tuple(ArgSpec(f"s{i}", static=v) for i, v in enumerate(statics))
    tpl = _Template(name, step, outs, None, (to_torch_dtype(out.dtype),), specs,
                    tuple(f"x{i}" for i in range(len(inputs))))
    _templates.put(key, tpl)
    return tpl


def _cast(x, dtype):
    return x.astype(dtype)


def _broadcast(x, shape):
    return jax.numpy.broadcast_to(x, shape)


def _reshape(x, shape):
    return x.reshape(shape)


# ---------------------------------------------------------------------------
# The pending graph
# ---------------------------------------------------------------------------

# what each slot of a graph holds: a graph input, a float scalar, an op's output
_LEAF, _SCALAR, _OUT = 0, 1, 2
_OUTS = bytes([_OUT]) * 64  # the kinds of a step's outputs, sliced
_weakref = weakref.ref


class _Graph:
    """The ops recorded since the last materialization (one per process).

    Every value a step reads or makes has a *slot*, numbered in order of first use:
    a graph input (a concrete array: a parameter, a batch, a random key), a float
    scalar (all of them go to the program as one float32 vector), or a step's output
    (a LazyArray, referenced weakly: a value no tensor holds any more is not an
    output of the program, and XLA drops what only it needed).
    """

    def __init__(self) -> None:
        self.steps: list[tuple[_Template, tuple[int, ...]]] = []
        self.kinds = bytearray()  # per slot: _LEAF, _SCALAR or _OUT
        self.leaves: list[Any] = []
        self.leaf_slots: dict[int, int] = {}  # id(array) -> slot (the arrays are held in leaves)
        self.scalars: list[float] = []
        self.outputs: list[tuple[int, Any]] = []  # (slot, weakref to its LazyArray)
        # while a probe listens to on_defer: where the steps so far lead in the tree of
        # recorded sequences (_Places), and each step's site (None: recorded unheard)
        self.place: _Place | None = None
        self.root: _Place | None = None
        self.sites: list[int | None] = []

    def recording(self) -> bool:
        """Whether values of this graph may stay pending when an op reads them."""
        return config.eager_mode == _FUSE and not probes._op_probes and self is _state.graph

    def materialize(self, trigger: str = "read") -> None:
        """Run this graph (a LazyArray of it needs its value)."""
        _materialize(self, trigger)

    def add(self, tpl: _Template, arrays) -> list[LazyArray]:
        """Append one step reading ``arrays``; its outputs, pending."""
        kinds = self.kinds
        refs = []
        for a in arrays:
            kind = type(a)
            if kind is LazyArray:
                if a.array is None:
                    if a.graph is self:
                        refs.append(a.slot)
                        continue
                    a = a.value()  # pending elsewhere (eager.py's gradient sums): run there
                else:
                    a = a.array
            elif kind is np.float32:
                refs.append(len(kinds))
                kinds.append(_SCALAR)
                self.scalars.append(a)
                continue
            slot = self.leaf_slots.get(id(a))
            if slot is None:
                slot = self.leaf_slots[id(a)] = len(kinds)
                kinds.append(_LEAF)
                self.leaves.append(a)
            refs.append(slot)
        self.steps.append((tpl, tuple(refs)))
        tpl.calls += 1
        first = len(kinds)
        if len(tpl.outs) == 1:  # most steps
            ((shape, dtype),) = tpl.outs
            value = LazyArray(shape, dtype, self, first)
            kinds.append(_OUT)
            self.outputs.append((first, _weakref(value)))
            return [value]
        outs = [LazyArray(shape, dtype, self, first + i) for i, (shape, dtype) in enumerate(tpl.outs)]
        kinds.extend(_OUTS[: len(outs)] if len(outs) <= len(_OUTS) else bytes([_OUT]) * len(outs))
        self.outputs.extend([(v.slot, _weakref(v)) for v in outs])
        return outs

    def step(self, name: str, fn, statics: tuple, *inputs) -> LazyArray:
        """A built-in step (a cast, a view read, a strided write) on pending or concrete inputs."""
        (out,) = self.add(_step_template(name, fn, statics, inputs), inputs)
        if probes._routes.on_defer:
            _place(self, name)
        return out

    def write(self, t: torch.Tensor, storage, value, old) -> None:
        """``tensor.write`` with a pending value or payload: the same steps, recorded."""
        jdtype = to_jax_dtype(t.dtype)
        size = t.shape
        if value.dtype == jdtype and value.shape == size and (
            old is None or (old.shape == size and not t.storage_offset() and t.is_contiguous())
        ):  # the whole storage, in its dtype and shape (an in-place op's usual write)
            set_payload(storage, value)
            return
        shape = tuple(size)
        g = _state.graph
        if value.dtype != jdtype:
            value = g.step("cast", _cast, (jdtype,), value)
        if tuple(value.shape) != shape:
            value = g.step("broadcast", _broadcast, (shape,), value)
        numel = t.numel()
        if old is None or (_dense(t) and old.size == numel):
            set_payload(storage, value)
            return
        if numel == 0:
            return
        new = g.step("write", _strided_write, (shape, view_pattern(shape, t.stride(), old.size), t.storage_offset()), old, value)
        set_payload(storage, new)


class _Place:
    """One step at one place of the step sequences recorded while a probe listens to
    ``on_defer``: what follows it (step -> _Place), and its site (announced once)."""

    __slots__ = ("next", "site")

    def __init__(self, site: int) -> None:
        self.next: dict[tuple, _Place] = {}
        self.site = site


class _Places:
    """The tree of recorded step sequences, for the probes listening to ``on_defer``.

    A probe that keeps each op's line (the recorder: a fused program's compile names
    each op's line) needs it only for an op whose place in its graph's sequence is new:
    a graph repeating a recorded sequence (a training loop's steps) either finds its
    program cached, or compiles one whose ops share their sites, and lines, with the
    sequence recorded first. So only a new place is announced, and the per-op cost of a
    repeated graph is one dict lookup. The tree starts again when the listeners change
    (a new probe has heard none of the sites) or when it holds ``_PLACES_KEPT`` places.
    """

    __slots__ = ("count", "root", "routes")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.routes: Any = None
        self.root = _Place(-1)
        self.count = 0


# places kept before the tree starts again (bounds its memory and the listeners' maps of
# sites: every site a graph can reach is among the last _PLACES_KEPT + a graph announced)
_PLACES_KEPT = 100_000
_places = _Places()
_site_ids = itertools.count()


def _place(g: _Graph, name: str) -> None:
    """Find the graph's newest step in the tree of sequences; announce it if it is new."""
    tree = _places
    if g.root is tree.root and tree.routes is probes._routes and not probes._quiet:
        place = g.place.next.get(g.steps[-1])  # type: ignore[union-attr]
        if place is not None:  # a recorded sequence, repeated
            g.place = place
            g.sites.append(place.site)
            return
    _new_place(g, name)


def _new_place(g: _Graph, name: str) -> None:
    if probes._quiet and probes._get_ident() in probes._quiet:
        g.root = None  # a probe's own work is not announced: its place is not in the tree
        g.sites.append(None)
        return
    tree = _places
    if tree.routes is not probes._routes or tree.count >= _PLACES_KEPT:
        tree.routes, tree.root, tree.count = probes._routes, _Place(-1), 0
    index = len(g.steps) - 1
    if g.root is tree.root:
        parent = g.place
    elif index == 0:
        g.root = parent = tree.root
    else:
        # listening began in the middle of this graph, or the tree started again: its
        # steps so far are not in the tree, so the rest is new (a branch of its own)
        g.root, parent = tree.root, _Place(-1)
        g.sites.extend([None] * (index - len(g.sites)))
    step = g.steps[-1]
    place = parent.next.get(step)  # type: ignore[union-attr]
    if place is None:
        place = parent.next[step] = _Place(next(_site_ids))  # type: ignore[union-attr]
        tree.count += 1
        g.place = place
        g.sites.append(place.site)
        probes.deferred(name, index, place.site)
        return
    g.place = place
    g.sites.append(place.site)


class _State:
    __slots__ = ("graph", "graphs", "hooked", "lock")

    def __init__(self) -> None:
        self.graph = _Graph()
        self.lock = threading.RLock()
        self.graphs = itertools.count(1)
        self.hooked = False


_state = _State()


def pending_ops() -> int:
    """Ops recorded and not run yet."""
    return len(_state.graph.steps)


def _dense(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous()


# ---------------------------------------------------------------------------
# Recording ops
# ---------------------------------------------------------------------------


def dispatch(op, args, kwargs):
    """The `tpu` kernel in a mode other than ``DEFER_NEVER`` (``device.dispatch`` calls it)."""
    mode = config.eager_mode
    if mode != _FUSE or probes._op_probes:
        out = _eager.run_now(op, args, kwargs)
        if mode == _BLOCKING:
            _block(out, args, kwargs)
        return out
    plan = _eager._plans_by_id.get(id(op)) or _eager.plan_for(op)
    if plan.check is not None:
        plan.check(*args, **kwargs)
    if plan.fast_ok:  # a lowering whose output shapes do not depend on values
        if plan.values is not None and _eager._dryrun.active is None and value_checks.wanted("lazy"):
            return _checked(op, plan, args, kwargs)
        with _state.lock:
            return _record(plan, args, kwargs)
    lowering = plan.lowering
    if lowering is not None:
        eager_only = lowering.eager_only
        if eager_only is True or (eager_only and eager_only(args, kwargs)):
            # the output's shape depends on the values: they are needed now
            materialize(f"data_dependent:{plan.name}")
            return _eager.run_now(op, args, kwargs)
        if plan.values is not None and _eager._dryrun.active is None and value_checks.wanted("lazy"):
            return _checked(op, plan, args, kwargs)
        with _state.lock:
            return _record(plan, args, kwargs)
    return _no_lowering(op, plan, args, kwargs)


def _checked(op, plan, args, kwargs):
    """Record an op whose lowering checks argument values (runtime/value_checks.py): the
    check is a step of the pending graph just before the op's. With the checks raising, the
    graph runs now and a failure raises at the op, before it is recorded; else the report is
    read when the graph runs (kept once the op is recorded: a call PyTorch refuses for its
    arguments is not reported for its values)."""
    check = plan.values
    arrays, statics = check.select(*args, **kwargs)
    if not arrays:
        with _state.lock:
            return _record(plan, args, kwargs)
    values = [value_of(t) if t.device.type == "tpu" else t.numpy() for t in arrays]
    with _state.lock:
        g = _state.graph
        report = g.step(f"check:{plan.name}", functools.partial(value_checks.report, check), (statics,), *values)
        site = g.sites[-1] if probes._routes.on_defer and g.sites else None
        if site is not None and probes._routes.on_invalid_value:
            # a check's site is announced at every record, not only when its place is new: a
            # failed check is told at the line that recorded it, and two graphs of the same
            # ops (a training and an evaluation loop) share their places but not their lines
            probes.deferred(f"check:{plan.name}", len(g.steps) - 1, site)
    if value_checks.raising("lazy"):
        materialize(f"check:{plan.name}")
        code, _value = np.asarray(report.value())
        if code:
            value_checks.arguments_first(op, args, kwargs)
        value_checks.read(report.value(), plan.name, check, statics, "lazy", raises=True, site=site)
        with _state.lock:
            return _record(plan, args, kwargs)
    with _state.lock:
        out = _record(plan, args, kwargs)
        value_checks.pending.append((report, plan.name, check, statics, site))
    return out


def _record(plan, args, kwargs):
    """Record one op call of a lowered op: the eager interpreter's key and output
    handling, with a graph step where eager mode would run an executable."""
    sig = None
    if plan.fast_ok:
        fast_arrays: list = []
        sig = _eager._signature(plan, args, kwargs, fast_arrays, _state.graph)
        if sig is not None:
            tpl = plan.lazy_fast.get(sig)
            if tpl is not None:
                return _append(plan, args, kwargs, tpl, fast_arrays)
    lowering = plan.lowering
    arrays: list = []
    key_data = None
    if lowering.rng and kwargs and kwargs.get("generator") is not None:
        kwargs = dict(kwargs)
        key_data = _random.key_from_generator(kwargs["generator"])
        kwargs["generator"] = None
    skel_args, skel_kwargs = _eager._build_key(plan, args, kwargs, arrays, plan.dynamic_scalars)
    rng = lowering.rng
    if rng:  # drawn now, in program order: the same numbers as op by op
        arrays.append(_random.next_key() if key_data is None else key_data)
    key = _eager.op_key(plan, skel_args, skel_kwargs)
    tpl = _templates.lookup(key)
    if tpl is None:
        try:
            tpl = _op_template(plan, key, skel_args, skel_kwargs, arrays, rng)
        except _eager._NEEDS_VALUES:
            if not plan.dynamic_scalars:
                raise
            plan.dynamic_scalars = False  # as eager mode does: bake the scalars in from now on
            return _record(plan, args, kwargs)
        _templates.put(key, tpl)
    if sig is not None and len(arrays) == len(fast_arrays):  # (fewer: a float baked in)
        plan.lazy_fast[sig] = tpl
    return _append(plan, args, kwargs, tpl, arrays)


def _append(plan, args, kwargs, tpl: _Template, arrays: list):
    """Append a step of ``tpl`` reading ``arrays`` to the graph; the op's results, pending."""
    g = _state.graph
    if len(g.steps) >= config.lazy_graph_limit:
        _materialize(g, "size_limit")
        g = _state.graph
    outs = g.add(tpl, arrays)
    if probes._routes.on_defer:
        _place(g, plan.name)
    if tpl.size is not None and plan.kind is None:  # one tensor out of a pure op
        t = _create_empty(tpl.size, tpl.dtypes[0])
        set_payload(t.untyped_storage(), outs[0])
        return t
    return _eager._finish(plan, args, kwargs, outs, tpl.struct, tpl.dtypes)


def _no_lowering(op, plan, args, kwargs):
    """An op with no lowering, as ``eager.run_now`` handles it: its functional form
    written back, its decomposition (whose ops are recorded), or the CPU."""
    guard = _eager._guard
    active = getattr(guard, "ops", None)
    if active is None:
        active = guard.ops = set()
    if op in active:  # a decomposition called the op it decomposes
        return _fallback(plan, args, kwargs)
    active.add(op)
    try:
        if plan.kind in ("inplace", "out") and plan.functional is not None:
            return _functional_then_write(plan, args, kwargs)
        decomp = _eager._decomposition(op)
        if decomp is not None:
            return decomp(*args, **kwargs)
        return _fallback(plan, args, kwargs)
    finally:
        active.discard(op)


def _fallback(plan, args, kwargs):
    if not config.cpu_fallback:
        raise _eager._missing(plan)
    materialize(f"fallback:{plan.name}")  # the CPU needs the values
    return _eager._cpu_fallback(plan, args, kwargs)


def _functional_then_write(plan, args, kwargs):
    """An in-place / out= variant with no lowering: the functional op (recorded), its
    results written into the targets (recorded)."""
    names = [a.name for a in plan.op._schema.arguments]
    targets = _eager._written_targets(plan, args, kwargs)
    call_kwargs = dict(zip(names, args))
    call_kwargs.update({k: v for k, v in kwargs.items() if not any(k == n for _, n, _ in plan.writes)})
    fnames = {a.name for a in plan.functional._schema.arguments}
    call_kwargs = {k: v for k, v in call_kwargs.items() if k in fnames}
    # a structured op's functional kernel would call this out= overload again: its
    # decomposition runs instead, as in eager mode (eager._structured_decomposition)
    decomp = _eager._structured_decomposition(plan)
    if decomp is None:
        out = plan.functional(**call_kwargs)
    else:
        out = _eager._call_by_schema(decomp, plan.functional._schema, call_kwargs)
    results = list(_eager._iter_tensors(out))
    if plan.kind == "out":
        _eager._check_out_memory(plan, args, kwargs, targets, [o.shape for o in results])
    for t, o in zip(targets, results):
        _eager._check_writable(plan, t, o.dtype, o.shape, args, kwargs)
    values = [value_of(o) for o in results]
    for t, v in zip(targets, values):
        if plan.kind == "out":
            _eager._resize_out(t, v.shape)

        write(t, v)
    return _eager._return_written(plan, args, kwargs, targets)


def _block(out, args, kwargs) -> None:
    """Wait for the arrays behind ``out`` and the op's tensor arguments (launch blocking)."""
    arrays = []

    def collect(v):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            payload = getattr(v.untyped_storage(), PAYLOAD_ATTR, None)
            if hasattr(payload, "block_until_ready"):
                arrays.append(payload)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    collect(out)
    collect(args)
    collect(list(kwargs.values()))
    jax.block_until_ready(arrays)


# ---------------------------------------------------------------------------
# Reading pending values (device-side copies and casts stay in the graph)
# ---------------------------------------------------------------------------


def value_of(t: torch.Tensor):
    """The value of `tpu` tensor ``t`` in ``t``'s shape: a jax.Array, or a pending
    LazyArray while lazy mode records (a read of a view is then a graph step)."""
    arr = _readable(t)
    if type(arr) is not LazyArray:
        return to_jax(t)
    size = tuple(t.shape)
    if arr.dtype != to_jax_dtype(t.dtype):
        return to_jax(t)  # a dtype-reinterpreting view: computed, then refused as eager mode does
    dense = _dense(t)
    if dense and arr.shape == size:
        return arr
    if dense and arr.size == math.prod(size):
        return _state.graph.step("reshape", _reshape, (size,), arr)
    return _state.graph.step("view", view_value, (size, view_pattern(size, t.stride(), arr.size), t.storage_offset()), arr)


def computed(t: torch.Tensor) -> None:
    """Run the pending graph if ``t``'s value is pending (before a copy to the host, so
    the copy's own time is what a transfer records)."""
    payload = getattr(t.untyped_storage(), PAYLOAD_ATTR, None)
    if type(payload) is LazyArray and payload.array is None:
        payload.value()


def convert(value, dtype: torch.dtype):
    """``value`` cast to ``dtype`` (a graph step when ``value`` is pending)."""
    jdtype = to_jax_dtype(dtype)
    if value.dtype == jdtype:
        return value
    if type(value) is LazyArray:
        return _state.graph.step("cast", _cast, (jdtype,), value)
    with jax.enable_x64(True):
        return value.astype(jdtype)


# ---------------------------------------------------------------------------
# Materializing: the fused program
# ---------------------------------------------------------------------------


class _GraphKey:
    """A fused program's key: the graph's steps (template and input slots each), the
    kind of every slot and the slots still referenced; hashed once."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is _GraphKey and self._hash == other._hash and self.parts == other.parts
        )


class _Fused:
    """One compiled fused program."""

    __slots__ = ("calls", "compiled", "info", "key", "name", "seconds")

    def __init__(self, key: _GraphKey, name: str, compiled: Any, info: CompileInfo | None, seconds: float) -> None:
        self.key = key
        self.name = name
        self.compiled = compiled
        self.info = info
        self.calls = 0
        self.seconds = seconds


def _forget(key: _GraphKey, entry: _Fused) -> None:
    _eager.announce_evicted("lazy", entry.name, key)


_fused: LruCache[_GraphKey, _Fused] = LruCache(
    "fused programs",
    lambda: config.compiled_cache_size,
    uses=lambda _key, entry: entry.calls,
    on_evict=_forget,
)


def _replay():
    for entry in _fused.values():
        if entry.info is not None:
            yield entry.info


probes.add_replay_source(_replay)


def fused_stats() -> list[dict]:
    """Every cached fused program: name, ops, outputs, calls, compile seconds."""
    return [
        {"name": e.name, "ops": len(e.key.parts[0]), "outputs": len(e.key.parts[2]),
         "calls": e.calls, "compile_seconds": e.seconds}
        for e in _fused.values()
    ]


def materialize(trigger: str = "synchronize") -> None:
    """Run the pending graph now, if anything is pending.

    Args:
        trigger: why, as the tracers report it (``"synchronize"``, ``"optimizer_step"``,
            ``"fallback:<op>"``, ...).
    """
    g = _state.graph
    if g.steps:
        _materialize(g, trigger)


def _materialize(g: _Graph, trigger: str) -> None:
    with _state.lock:
        if g is not _state.graph or not g.steps:
            return  # already run (by another thread, or a value of an older graph)
        if _places.count and not probes._routes.on_defer:
            _places.clear()  # nobody listens any more: the tree and the templates it holds go
        start = time.perf_counter()
        live = []
        for slot, ref in g.outputs:
            value = ref()
            if value is not None:
                live.append(value)
        if not live:  # nothing holds a result: nothing to run
            _state.graph = _Graph()
            if probes._probes:
                probes.materialized(MaterializeInfo(trigger, "", None, len(g.steps), 0, len(g.leaves),
                                                    False, time.perf_counter() - start))
            return
        key = _GraphKey((tuple(g.steps), bytes(g.kinds), tuple(v.slot for v in live)))
        entry = _fused.lookup(key)
        compiled_now = entry is None
        if entry is None:
            entry = _compile(g, key, live, trigger)
            _fused.put(key, entry)
        entry.calls += 1
        scalars = np.array(g.scalars, np.float32)
        if probes._probes:
            probes.executing("lazy", entry.name, entry.key)
            begin = time.perf_counter()
            outs = entry.compiled(*g.leaves, scalars)
            probes.executed("lazy", entry.name, entry.key, time.perf_counter() - begin)
        else:
            outs = entry.compiled(*g.leaves, scalars)
        for value, arr in zip(live, outs):
            value.array = arr
            value.graph = None
        _state.graph = _Graph()
        if probes._probes:
            probes.materialized(MaterializeInfo(trigger, entry.name, entry.key, len(g.steps), len(live),
                                                len(g.leaves), compiled_now, time.perf_counter() - start))
        if value_checks.pending:  # reports of checks a probe listens to, computed now
            value_checks.read_pending()


def pending_stablehlo(values: list) -> str | None:
    """The StableHLO of the fused program that would compute ``values`` (LazyArrays of the
    pending graph) now, lowered but neither compiled nor run; None when none is pending."""
    with _state.lock:
        g = _state.graph
        slots = tuple(v.slot for v in values if type(v) is LazyArray and v.graph is g and v.array is None)
        if not slots or not g.steps:
            return None
        specs = [_aval(a) for a in g.leaves] + [jax.ShapeDtypeStruct((len(g.scalars),), np.float32)]
        with jax.enable_x64(True):
            return jax.jit(_fused_function(g, slots)).lower(*specs).as_text()


def _fused_function(g: _Graph, live_slots: tuple[int, ...]):
    """The JAX function of a graph: its inputs and the float32 scalar vector in, the
    referenced values out; each step under the named scope ``n<i>`` so optimized HLO
    maps back to it."""
    steps = list(g.steps)
    kinds = bytes(g.kinds)
    out_slots = [s for s, k in enumerate(kinds) if k == _OUT]

    def fused(*args):
        *leaves, scalars = args
        env: list[Any] = [None] * len(kinds)
        li = si = 0
        for slot, kind in enumerate(kinds):
            if kind == _LEAF:
                env[slot] = leaves[li]
                li += 1
            elif kind == _SCALAR:
                env[slot] = scalars[si]
                si += 1
        o = 0
        for i, (tpl, refs) in enumerate(steps):
            with jax.named_scope(f"n{i}"):
                outs = tpl.fn(*[env[r] for r in refs])
            for value in outs:
                env[out_slots[o]] = value
                o += 1
        return tuple(env[s] for s in live_slots)

    return fused


def _compile(g: _Graph, key: _GraphKey, live: list, trigger: str) -> _Fused:
    began = time.perf_counter()
    name = f"lazy/{trigger}"
    live_slots = tuple(v.slot for v in live)
    fn = _fused_function(g, live_slots)
    specs = [_aval(a) for a in g.leaves] + [jax.ShapeDtypeStruct((len(g.scalars),), np.float32)]
    if probes._probes:
        probes.compiling("lazy", name)
    start = time.perf_counter()
    # a dry run executes nothing: the graph goes to the target's compiler instead, and what
    # runs in its place gives its outputs' shapes (as a compiled graph's does)
    dry = _dryrun.active
    try:
        with jax.enable_x64(True):
            lowered = jax.jit(fn).lower(*specs)
            lower_seconds = time.perf_counter() - start
            with local_compile(enabled=dry is None, program=program_identity("lazy", name, specs)) as cached:
                compiled = (lowered.compile(cached.options) if dry is None
                            else dry.program(lowered, "lazy", name))
    except Exception as exc:
        raise LoweringBugError(
            f"internal error: the fused graph of {len(g.steps)} ops ({name}) failed to compile: "
            f"{type(exc).__name__}: {exc}. Run the same code with "
            "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER) to find the op, and report it"
        ) from exc
    seconds = time.perf_counter() - start
    info = CompileInfo("lazy", name, key, _leaf_specs(g), seconds, lowered, compiled if dry is None else None,
                       graph=_graph_info(g, live_slots), from_cache=cached.from_cache,
                       saved_seconds=cached.saved_seconds, lower_seconds=lower_seconds,
                       wall_seconds=time.perf_counter() - began,
                       cache_entry=str(cached.entry) if cached.entry is not None else None, cache_miss=cached.miss)
    if probes._probes:
        probes.compiled(info)
    return _Fused(key, name, compiled, info, seconds)


def _slot_names(g: _Graph) -> list[str]:
    """What each slot is called in a graph's listing: ``in3`` (input), ``s1`` (float
    scalar), ``n12`` or ``n12.1`` (step 12's output)."""
    names: list[str] = [""] * len(g.kinds)
    counts = {_LEAF: 0, _SCALAR: 0}
    for slot, kind in enumerate(g.kinds):
        if kind != _OUT:
            names[slot] = f"{'in' if kind == _LEAF else 's'}{counts[kind]}"
            counts[kind] += 1
    out_slots = iter(s for s, k in enumerate(g.kinds) if k == _OUT)
    for i, (tpl, _refs) in enumerate(g.steps):
        n = len(tpl.outs)
        for k in range(n):
            names[next(out_slots)] = f"n{i}" if n == 1 else f"n{i}.{k}"
    return names


def _leaf_specs(g: _Graph) -> tuple[ArgSpec, ...]:
    """The program's inputs, each named after the first op argument that reads it
    (``mm.self``), then the float scalars."""
    first: dict[int, str] = {}
    for tpl, refs in g.steps:
        for name, slot in zip(tpl.inputs, refs):
            first.setdefault(slot, f"{tpl.name}.{name}")
    specs = []
    leaf = 0
    for slot, kind in enumerate(g.kinds):
        if kind == _LEAF:
            a = g.leaves[leaf]
            specs.append(ArgSpec(first.get(slot, f"in{leaf}"), tuple(a.shape), str(np.dtype(a.dtype))))
            leaf += 1
    specs.append(ArgSpec("float scalars", (len(g.scalars),), "float32"))
    return tuple(specs)


def _short(shape, dtype) -> str:
    return f"{np.dtype(dtype).name}[{','.join(map(str, shape))}]"


def _graph_info(g: _Graph, live_slots: tuple[int, ...]) -> GraphInfo:
    names = _slot_names(g)
    nodes = []
    ops = []
    lines = []
    for i, (tpl, refs) in enumerate(g.steps):
        target = f"aten::{tpl.name}" if tpl.struct is not None else tpl.name
        nodes.append(LoweredNode(f"n{i}", target, f"n{i}", None))
        outs = tuple(_short(s, d) for s, d in tpl.outs)
        ops.append(LazyNode(tpl.name, tuple(names[r] for r in refs), tpl.specs, outs,
                            g.sites[i] if i < len(g.sites) else None))
        lines.append(f"n{i} = {tpl.name}({', '.join(names[r] for r in refs)})  # {', '.join(outs)}")
    outputs = tuple(names[s] for s in live_slots)
    lines.append(f"return ({', '.join(outputs)})")
    return GraphInfo("lazy", tuple(nodes), "\n".join(lines), DynamoOrigin(torch.is_grad_enabled()),
                     ops=tuple(ops), outputs=outputs)


# ---------------------------------------------------------------------------
# The end of an optimizer step
# ---------------------------------------------------------------------------


def _optimizer_stepped(optimizer, args, kwargs) -> None:
    # traced by dynamo inside a compiled ``opt.step``, where it must do nothing: dynamo
    # folds ``is_compiling()`` to True, so no graph break
    if torch.compiler.is_compiling():
        return
    if config.eager_mode == _FUSE and _state.graph.steps:
        materialize("optimizer_step")


def hook_optimizers() -> None:
    """Materialize at the end of every ``optimizer.step()`` (once registered, for good:
    the hook does nothing outside lazy mode). Idempotent; a tracer that ends steps at
    ``optimizer.step()`` calls it before hooking the optimizer itself, so its hook runs
    after this one, once the step's graph has run."""
    if _state.hooked:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(probes.hidden_from_dynamo(_optimizer_stepped))
    _state.hooked = True
