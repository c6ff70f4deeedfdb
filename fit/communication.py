"""Communication a user can judge: each collective kind of a compiled step beside its bound.

The TPU compiler's SPMD partitioner decides which collectives a step runs; the plan decides
the least they can move. Under FSDP (ZeRO-3) every parameter split over the ``fsdp`` axis is
gathered where it is read and its gradient reduced to its shards once, so per step and
per chip:

- all-gather: each split parameter, whole, in the dtype the layer reads it (the model's
  dtype; float32 master weights are cast before the gather): once for the forward, once
  for the backward (a linear's input gradient reads its weight), and once more for the
  recomputed forward when activation checkpointing recomputes the layer's matmuls (the
  ``full`` policy; the matmul policies keep their outputs, so the recomputation reads no
  weight). The embedding table is read by the forward only (its gradient is a scatter-add).
- reduce-scatter: each split parameter's gradient, whole, once, in the parameters' stored
  dtype (the gradient of a float32 master weight is float32);
- all-reduce: the gradients of parameters no axis splits, once; with a ``dp`` axis beside
  ``fsdp``, each chip's gradient shards once more over ``dp``.

A kind's bytes are what ``collective_costs`` counts (an all-gather's gathered result, a
reduce-scatter's whole input, an all-reduce's buffer), so the ratio compares like with
like. The bound is a floor for the plan as PyTorch's FSDP runs it, not a promise: a
compiler that shares one gather between the recomputed forward and the backward moves less.

Where a kind's volume comes from is measured from the HLO, each collective classified by
its metadata (JAX's name stack: ``jvp(...)`` the forward, ``transpose(...)`` the backward,
``rematted_computation`` the recomputed forward), its element type, whether its result has
a parameter's shape, and how often it runs (a layer loop's body runs once per layer).
Read through the one HLO reader (``core/hlo_text.py``), as ``core/collectives.py``; no jax, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tpu_debug.core.format import format_bytes
from tpu_debug.core.hlo_text import parse_module, parse_shape

__all__ = ["GRADIENTS", "OVER", "CollectiveBound", "ParamInfo", "Share", "bounds", "classify", "collective_sites"]

#: a kind whose compiled volume is above this multiple of its bound says where it comes from
OVER = 1.5

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
_HLO_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64", "s32": "int32",
              "u32": "uint32", "s64": "int64", "pred": "bool", "s8": "int8", "u8": "uint8"}


@dataclasses.dataclass(frozen=True, slots=True)
class ParamInfo:
    """One parameter as the bound counts it.

    Attributes:
        name: its name (``model.layers.0.mlp.up_proj.weight`` for a layer's, once for all layers).
        shape: one copy's shape (a layer's parameter unstacked).
        copies: how many copies the model holds (the layer count for a layer's parameter).
        split: the plan's ``fsdp`` axis splits it (FSDP gathers it where it is read).
        recomputed: it is read in a layer the backward recomputes with its matmuls.
        embedding: an embedding table (read by the forward only).
    """

    name: str
    shape: tuple[int, ...]
    copies: int = 1
    split: bool = True
    recomputed: bool = False
    embedding: bool = False

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.copies


@dataclasses.dataclass(frozen=True, slots=True)
class Share:
    """A part of one kind's volume per step, measured from the HLO.

    Attributes:
        what: the pass (forward, recomputed forward, backward, outside autodiff), the element
            type, parameter-shaped or not, and whether it runs in the layer loop.
        bytes: its volume per step per chip (each run counted).
        count: collectives per step (each run counted).
        largest: the largest collective of the share: its shape, op name and source line.
    """

    what: str
    bytes: int
    count: int
    largest: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveBound:
    """One collective kind of the step beside the plan's bound, per chip and step.

    Attributes:
        kind: ``"all-gather"``, ``"reduce-scatter"``, ``"all-reduce"``, ...
        compiled: the compiled step's bytes of that kind (``CollectiveCost.bytes``).
        bound: the plan's least bytes of that kind (0: the plan needs none).
        basis: how the bound is counted, in words.
        shares: where the compiled bytes come from, largest first.
        ratio: compiled / bound (None when the bound is 0).
    """

    kind: str
    compiled: int
    bound: int
    basis: str
    shares: tuple[Share, ...] = ()

    @property
    def ratio(self) -> float | None:
        return self.compiled / self.bound if self.bound else None

    @property
    def over(self) -> bool:
        """Well above the bound (more than ``OVER`` times it, or any bytes against a bound of 0)."""
        return self.compiled > OVER * self.bound and self.compiled > 0

    def reasons(self) -> tuple[str, ...]:
        """Where the bytes above the bound come from, measured (empty when not ``over``)."""
        if not self.over:
            return ()
        out = []
        for s in self.shares:
            if s.bytes * 20 < self.compiled:  # under 5 % of the kind: not where the excess is
                continue
            out.append(f"{s.what}: {format_bytes(s.bytes)} in {s.count:,} collective{'s' if s.count > 1 else ''}"
                       + (f" (largest {s.largest})" if s.largest else ""))
        return tuple(out)


def collective_sites(hlo: str) -> dict[str, tuple[str, str, str, int]]:
    """Instruction name -> (the computation that runs it, its channel id, the computation
    holding it, how many times that computation runs per run of the first) for every
    instruction with a ``channel_id``.

    The TPU compiler overlaps a collective with compute by threading it through several
    fusions (an ``AsyncCollectiveStart`` fusion, continuation fusions that compute while the
    data moves, a done fusion): each fusion's own computation holds a copy of the same
    collective (the same ``channel_id``), so one collective is one (running computation,
    channel id), however many computations hold copies. A fused computation several fusion
    instructions call (identical layers unrolled) runs once per call: its collective counts
    that many times.
    """
    owner: dict[str, str] = {}
    caller: dict[str, str] = {}  # fused computation -> the computation holding the fusion
    calls: dict[str, int] = {}  # fused computation -> fusion instructions calling it
    channels: dict[str, str] = {}
    for computation in parse_module(hlo).computations:
        for ins in computation.instructions:
            fused = ins.attr("calls") if ins.opcode == "fusion" else None
            if fused:
                fused = fused.lstrip("%")
                caller[fused] = computation.name
                calls[fused] = calls.get(fused, 0) + 1
            if ins.channel_id is not None:
                owner[ins.name], channels[ins.name] = computation.name, str(ins.channel_id)

    def running(computation: str) -> tuple[str, int]:
        seen, times = set(), 1
        while computation in caller and computation not in seen:
            seen.add(computation)
            times *= calls.get(computation, 1)
            computation = caller[computation]
        return computation, times

    out = {}
    for name, computation in owner.items():
        root, times = running(computation)
        out[name] = (root, channels[name], computation, times)
    return out


def _pass_of(scope: str) -> str:
    if "rematted_computation" in scope:
        return "recomputed in the backward (jax.checkpoint)"
    if "transpose(" in scope:
        return "backward"
    if "jvp(" in scope:
        return "forward"
    if not scope:
        return "no metadata (the compiler's own: a combined or rewritten collective)"
    return "outside autodiff (optimizer update, loss)"


def _dims(shape: str) -> tuple[str, tuple[int, ...]]:
    arrays = parse_shape(shape).arrays
    if not arrays:
        return "", ()
    dims = arrays[0].dims
    while dims and dims[0] == 1:  # a loop's slice of a stacked parameter is [1, ...]
        dims = dims[1:]
    return _HLO_DTYPE.get(arrays[0].dtype, arrays[0].dtype), dims


def _short(scope: str, limit: int = 70) -> str:
    return scope if len(scope) <= limit else "..." + scope[-(limit - 3):]


def classify(items: Iterable[tuple], params: Iterable[ParamInfo]) -> dict[str, tuple[Share, ...]]:
    """kind -> its shares (largest first) from ``items``: ``(Collective, bytes, runs)`` per
    collective of the step (``runs``: times per step)."""
    shapes = {tuple(sorted(p.shape)) for p in params}
    groups: dict[tuple[str, str], list] = {}
    for c, data, runs in items:
        dtype, dims = _dims(c.shape)
        if c.shape.startswith("("):
            kind_of = "several tensors combined"
        else:
            kind_of = "parameter-shaped" if tuple(sorted(dims)) in shapes else "other tensors"
        what = f"{_pass_of(c.scope)}, {dtype or '?'}, {kind_of}" + (f", in the layer loop x{runs}" if runs > 1
                                                                      else "")
        groups.setdefault((c.opcode, what), []).append((c, data, runs))
    out: dict[str, list[Share]] = {}
    for (kind, what), members in groups.items():
        big = max(members, key=lambda m: m[1])[0]
        where = f" at {big.location}" if big.file else ""
        largest = f"{big.shape} {format_bytes(max(m[1] for m in members))}, '{_short(big.scope)}'{where}"
        out.setdefault(kind, []).append(Share(what, sum(d * r for _, d, r in members), sum(r for _, _, r in members),
                                              largest))
    return {k: tuple(sorted(v, key=lambda s: -s.bytes)) for k, v in out.items()}


def bounds(compiled: dict[str, int], shares: dict[str, tuple[Share, ...]], params: Iterable[ParamInfo], *,
           fsdp: int, dp: int, tp: int, dtype: str, grad_dtype: str) -> tuple[CollectiveBound, ...]:
    """Each kind of the step (``compiled``: kind -> bytes) beside the plan's bound.

    Args:
        compiled: the compiled step's bytes per kind (``collective_costs``).
        shares: ``classify``'s shares per kind.
        params: every parameter of the model (``ParamInfo``).
        fsdp, dp, tp: the plan's axes.
        dtype: the dtype the layers read the parameters in (the model's).
        grad_dtype: the parameters' stored dtype (their gradients').
    """
    params = tuple(params)
    read, grad = _ITEMSIZE.get(dtype, 2), _ITEMSIZE.get(grad_dtype, 4)
    out: dict[str, tuple[int, str]] = {}
    if tp > 1:
        return tuple(CollectiveBound(k, v, 0, "no bound: a tp axis moves activations, which the plan alone "
                                     "does not size", shares.get(k, ()))
                     for k, v in sorted(compiled.items(), key=lambda kv: -kv[1]))
    split = [p for p in params if p.split] if fsdp > 1 else []
    whole = [p for p in params if not p.split or fsdp == 1]
    if split:
        passes: dict[int, int] = {}
        total = 0
        for p in split:
            n = 1 if p.embedding else 3 if p.recomputed else 2
            passes[n] = passes.get(n, 0) + p.elements * read
            total += n * p.elements * read
        words = {3: "forward, recomputed forward, backward", 2: "forward, backward", 1: "forward: the embedding"}
        basis = " + ".join(f"{n} x {format_bytes(b)} ({words[n]})" for n, b in sorted(passes.items(), reverse=True))
        out["all-gather"] = (total, f"{basis}: the split parameters, whole, in {dtype}")
        grads = sum(p.elements for p in split) * grad
        out["reduce-scatter"] = (grads, (f"1 x {format_bytes(grads)}: the split parameters' gradients, whole, "
                                         f"in {grad_dtype}, reduced to their shards once"))
    if fsdp * dp > 1:
        reduce = sum(p.elements for p in whole) * grad
        parts = [f"{format_bytes(reduce)}: the gradients of the parameters no axis splits"] if whole else []
        if dp > 1 and split:
            shards = sum(p.elements for p in split) * grad // fsdp
            reduce += shards
            parts.append(f"{format_bytes(shards)}: each chip's gradient shards over dp={dp}")
        out["all-reduce"] = (reduce, " + ".join(parts) + f", in {grad_dtype}, once" if parts else
                             "none: every gradient is reduce-scattered")
    rows = []
    for kind in dict.fromkeys([*compiled, *out]):
        bound, basis = out.get(kind, (0, "none: the plan needs no " + kind))
        rows.append(CollectiveBound(kind, compiled.get(kind, 0), bound, basis, shares.get(kind, ())))
    rows.sort(key=lambda b: -max(b.compiled, b.bound))
    scatter = out.get("reduce-scatter", (0, ""))[0]
    if scatter and compiled.get("reduce-scatter", 0) * 2 < scatter:
        # the TPU compiler may reduce gradients with all-reduces (each chip then keeps its shard):
        # the gradients' reduction as a whole is what the plan bounds
        both = compiled.get("reduce-scatter", 0) + compiled.get("all-reduce", 0)
        rows = [b for b in rows if b.kind not in ("reduce-scatter", "all-reduce")]
        rows.append(CollectiveBound(
            GRADIENTS, both, scatter + out.get("all-reduce", (0, ""))[0],
            f"{out['reduce-scatter'][1]}"
            + (f"; plus {out['all-reduce'][1]}" if out.get("all-reduce", (0,))[0] else "") + "; the compiler "
            "reduced the gradients with all-reduces (each sends twice a reduce-scatter's bytes on the wire), "
            "so the two kinds are bounded together",
            tuple(sorted(shares.get("reduce-scatter", ()) + shares.get("all-reduce", ()), key=lambda x: -x.bytes))))
    return tuple(rows)


#: the row of the gradients' reduction as a whole (reduce-scatter and all-reduce together)
GRADIENTS = "reduce-scatter + all-reduce"
