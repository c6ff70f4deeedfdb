"""Mixture-of-experts layers in a fit: each batch shard's tokens routed on its own chip.

transformers' ``grouped_mm`` experts sort the layer's tokens by expert and run each
expert's rows as one grouped matmul. Over a whole batch split across chips, that sort
and the gathers around it mix every shard's tokens, so the SPMD partitioner keeps the
routed tokens and the experts' intermediates whole on every chip: they grow with the
slice. MaxText routes each data shard's own tokens instead (its dropless matmul runs
inside a ``shard_map`` over the batch shards, the experts' weights gathered by FSDP).

Here the same, in two halves:

- ``experts_forward`` (registered with transformers as the experts implementation
  ``EXPERTS``): the tokens ``[T, hidden]`` viewed as ``[G, T/G, hidden]``, ``G`` the
  batch shards (``per_shard``), and sorted, grouped and multiplied per group: the sort
  is batched over the groups, the rows are picked by ``tpu_debug::fit_take_rows`` (JAX's
  gather along the group dimension, which XLA splits by group, as it does the scatter of
  its backward) and the matmul is ``tpu_debug::fit_grouped_mm``, whose group dimension is
  a batch dimension. With ``G = 1`` it computes what ``grouped_mm`` does.
- ``grouped_matmul``, that op's lowering: under ``sharded`` (set while a fit's step is
  compiled for a TPU slice) a ``shard_map`` over the batch axes whose body is one
  ``lax.ragged_dot`` on the chip's own routed tokens (the TPU compiler's ragged dot
  takes no batch dimension; the weights' gradient megablox's ``tgmm``, as MaxText's);
  otherwise one ``lax.ragged_dot_general`` with the groups as its batch dimension (or,
  under ``counted``, a dense product of the same flops).

Each op also has a PyTorch kernel (``torch._grouped_mm`` per group), so a model built
with ``EXPERTS`` runs on the CPU as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from tpu_debug.runtime.ops import prims
from tpu_debug.runtime.ops.linalg import dot_general, matmul_precision
from tpu_debug.runtime.ops.registry import lower

__all__ = [
    "EXPERTS",
    "counted",
    "experts_forward",
    "grouped_matmul",
    "per_shard",
    "register",
    "sharded",
]

#: the experts implementation name ``register`` gives transformers
EXPERTS = "tpu_debug_per_shard"


@dataclasses.dataclass(slots=True)
class _Routing:
    groups: int = 1  # token groups routed on their own (torch trace time)
    mesh: object = None  # the target mesh the step is compiled on (JAX trace time)
    axes: tuple[str, ...] = ()  # its batch axes
    counted: bool = False  # lowered for its cost analysis only, never run


_ROUTING = _Routing()
# bfloat16 and float16: the dtypes a TPU's MXU multiplies natively, accumulating in float32
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_OPS: dict = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def per_shard(groups: int):
    """While a fit's step is traced: an experts layer routes its tokens in ``groups`` equal,
    consecutive groups (the batch shards: dp x fsdp), each on its own."""
    saved, _ROUTING.groups = _ROUTING.groups, groups
    try:
        yield
    finally:
        _ROUTING.groups = saved


@contextlib.contextmanager
def sharded(mesh, axes: tuple[str, ...]):
    """While a fit's step is lowered for its target mesh: ``fit_grouped_mm``'s groups are
    split over ``axes`` (the batch axes), each chip multiplying its own."""
    saved = _ROUTING.mesh, _ROUTING.axes
    _ROUTING.mesh, _ROUTING.axes = mesh, tuple(axes)
    try:
        yield
    finally:
        _ROUTING.mesh, _ROUTING.axes = saved


@contextlib.contextmanager
def counted():
    """While a step is lowered only for XLA's cost analysis on the host (never run): each
    group's product is written as one dense matmul of its rows against one expert's matrix,
    which has the grouped matmul's flops. JAX lowers a ragged dot for the host as a dense
    product masked per expert, whose cost analysis counts every expert's matrix against every
    row (the experts' count times the flops)."""
    saved, _ROUTING.counted = _ROUTING.counted, True
    try:
        yield
    finally:
        _ROUTING.counted = saved


def register() -> None:
    """Register ``EXPERTS`` with transformers and the ops it traces (``tpu_debug::fit_grouped_mm``,
    ``tpu_debug::fit_take_rows``) with the runtime (once; later calls do nothing)."""
    from transformers.integrations.moe import ExpertsInterface

    with _LOCK:
        if _OPS:
            return
        prims.register()  # the routing's integer division decomposes to prims.div
        ops = {**_grouped_mm_ops(), **_take_rows_ops()}
        lower(ops["grouped_mm"], precision=True)(grouped_matmul)
        lower(ops["grouped_mm_backward"], precision=True)(grouped_matmul_backward)
        lower(ops["take_rows"])(take_rows)
        lower(ops["take_rows_backward"])(take_rows_backward)
        ExpertsInterface.register(EXPERTS, experts_forward)
        _OPS.update(ops)


def _grouped_mm_ops() -> dict:
    """``fit_grouped_mm(a [G, M, K], b [E, K, N], offs [G, E]) -> [G, M, N]`` and its backward,
    PyTorch's ``_grouped_mm`` per group on the host."""
    import torch

    def on_host(a, b, offs):
        return torch.stack([torch._grouped_mm(a[g], b, offs=offs[g]) for g in range(a.shape[0])])

    @torch.library.custom_op("tpu_debug::fit_grouped_mm", mutates_args=(),
                             schema="(Tensor a, Tensor b, Tensor offs) -> Tensor")
    def fit_grouped_mm(a, b, offs):
        return on_host(a, b, offs)

    @fit_grouped_mm.register_fake
    def _(a, b, offs):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[-1]))

    @torch.library.custom_op("tpu_debug::fit_grouped_mm_backward", mutates_args=(),
                             schema="(Tensor a, Tensor b, Tensor offs, Tensor grad) -> (Tensor, Tensor)")
    def fit_grouped_mm_backward(a, b, offs, grad):
        with torch.enable_grad():
            a_, b_ = a.detach().requires_grad_(), b.detach().requires_grad_()
            return tuple(torch.autograd.grad(on_host(a_, b_, offs), (a_, b_), grad))

    @fit_grouped_mm_backward.register_fake
    def _(a, b, offs, grad):
        return torch.empty_like(a), torch.empty_like(b)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        return (*torch.ops.tpu_debug.fit_grouped_mm_backward(a, b, offs, grad), None)

    fit_grouped_mm.register_autograd(backward, setup_context=setup)
    return {"grouped_mm": torch.ops.tpu_debug.fit_grouped_mm.default,
            "grouped_mm_backward": torch.ops.tpu_debug.fit_grouped_mm_backward.default}


def _take_rows_ops() -> dict:
    """``fit_take_rows(x [G, M, H], index [G, R]) -> [G, R, H]`` (each group's rows picked by
    its own indices) and its backward. ``torch.gather``'s backward is a scatter over full
    coordinates, which XLA's partitioner does not split by group; JAX's gather and scatter
    along a batch dimension it does."""
    import torch

    @torch.library.custom_op("tpu_debug::fit_take_rows", mutates_args=(),
                             schema="(Tensor x, Tensor index) -> Tensor")
    def fit_take_rows(x, index):
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    @fit_take_rows.register_fake
    def _(x, index):
        return x.new_empty((*index.shape, x.shape[-1]))

    @torch.library.custom_op("tpu_debug::fit_take_rows_backward", mutates_args=(),
                             schema="(Tensor index, Tensor grad, SymInt rows) -> Tensor")
    def fit_take_rows_backward(index, grad, rows):
        out = grad.new_zeros((grad.shape[0], rows, grad.shape[-1]))
        return out.scatter_add(1, index.unsqueeze(-1).expand(-1, -1, grad.shape[-1]), grad)

    @fit_take_rows_backward.register_fake
    def _(index, grad, rows):
        return grad.new_empty((grad.shape[0], rows, grad.shape[-1]))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.rows = inputs[0].shape[1]

    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return torch.ops.tpu_debug.fit_take_rows_backward(index, grad, ctx.rows), None

    fit_take_rows.register_autograd(backward, setup_context=setup)
    return {"take_rows": torch.ops.tpu_debug.fit_take_rows.default,
            "take_rows_backward": torch.ops.tpu_debug.fit_take_rows_backward.default}


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm`` experts (``integrations/moe.py``) with the tokens routed
    per group (``per_shard``): ``[T, hidden]`` in, ``[T, hidden]`` out."""
    import torch

    if getattr(self, "_is_expert_parallel", False):
        raise NotImplementedError(f"{EXPERTS}: expert-parallel experts are not routed per shard")
    tokens, hidden = hidden_states.shape
    groups = _ROUTING.groups if tokens % _ROUTING.groups == 0 else 1
    top_k = top_k_index.size(-1)
    take = _OPS["take_rows"]
    # each group's (token, choice) pairs sorted by expert: the rows its grouped matmuls run
    expert_ids, perm = torch.sort(top_k_index.reshape(groups, -1), dim=-1)
    rows = take(hidden_states.reshape(groups, tokens // groups, hidden), perm // top_k)
    weights = take(top_k_weights.reshape(groups, -1, 1), perm)
    # each expert's end in its group's sorted rows: how many rows have an id up to it
    ends = (expert_ids.unsqueeze(-1) <= torch.arange(self.num_experts, device=rows.device)).sum(1, dtype=torch.int32)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    out = _linear(self, rows, up, ends, (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)
                  if self.has_bias else None, expert_ids)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = _linear(self, out, self.down_proj, ends, self.down_proj_bias if self.has_bias else None, expert_ids)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    out = take(out * weights, torch.argsort(perm, dim=-1))  # back in (token, choice) order
    return out.reshape(tokens, top_k, hidden).sum(1).to(hidden_states.dtype)


def _linear(self, rows, weight, ends, bias, expert_ids):
    """One grouped linear of the experts (``weight`` ``[E, out, in]``, or ``[E, in, out]``
    when transposed) over each group's rows sorted by expert."""
    weight = weight if self.is_transposed else weight.transpose(-2, -1)
    out = _OPS["grouped_mm"](rows.to(weight.dtype), weight, ends)
    return out if bias is None else out + bias[expert_ids]


def _sizes(ends):
    return jnp.diff(ends.astype(jnp.int32), axis=-1, prepend=jnp.zeros((*ends.shape[:-1], 1), jnp.int32))


def _on_target(a, b):
    """The operands a TPU's ragged dot takes: its bfloat16 kernel accumulates in float32;
    XLA's CPU backend has none, so a host program multiplies half inputs in float32 (their
    products are exact in float32)."""
    if _ROUTING.mesh is None and a.dtype in _HALF:
        return a.astype(jnp.float32), b.astype(jnp.float32)
    return a, b


def grouped_matmul(a, b, offs):
    """``tpu_debug::fit_grouped_mm``: ``a`` ``[G, M, K]`` (each group's rows sorted by
    expert), ``b`` ``[E, K, N]``, ``offs`` ``[G, E]`` (each expert's end in its group's
    rows) -> ``[G, M, N]``; rows past a group's last end are zeros."""

    dtype = a.dtype
    a, b = _on_target(a, b)
    mesh, axes = _ROUTING.mesh, _ROUTING.axes
    if _ROUTING.counted:
        return dot_general(lambda x, y, **kw: jnp.einsum("gmk,kn->gmn", x, y, **kw), a, b[0]).astype(dtype)
    if mesh is None:  # the host: one ragged dot with the groups as its batch dimension
        numbers = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((2,), (2,)), ((0,), (1,))),
                                                    lhs_ragged_dimensions=(1,), rhs_group_dimensions=(0,))
        wide = jnp.broadcast_to(b[:, None], (b.shape[0], a.shape[0], *b.shape[1:]))
        return dot_general(lambda x, y, **kw: jax.lax.ragged_dot_general(x, y, _sizes(offs), numbers, **kw),
                           a, wide).astype(dtype)
    ways = math.prod(mesh.shape[x] for x in axes)
    # groups that do not split over the batch axes are multiplied whole on every chip
    split = PartitionSpec(axes) if ways > 1 and a.shape[0] % ways == 0 else PartitionSpec()
    return _on_chips(a, b, _sizes(offs), mesh, split).astype(dtype)


def _on_chips(a, b, sizes, mesh, split):
    """The groups' products on a TPU slice, as MaxText's megablox runs them: each group on
    the chip holding it (a ``shard_map``, the groups split as ``split`` says: a TPU kernel
    is never partitioned automatically), its forward and rows' gradient XLA's ragged dot (a
    grouped kernel, which takes no batch dimension), its weights' gradient megablox's
    ``tgmm`` kernel, summed over the groups by the partitioner. JAX's own transpose of a
    ragged dot contracts the rows as a dense product per expert: the experts' count times
    the flops and an ``[E, M, N]`` temporary."""
    def each(fn, grouped, whole=()):  # fn on every group's own arrays, whole ones beside
        def body(*xs):
            return jnp.stack([fn(*g, *xs[len(grouped):]) for g in zip(*xs[:len(grouped)])])

        specs = (split,) * len(grouped) + (PartitionSpec(),) * len(whole)
        # megablox's kernel declares no varying mesh axes, hence no check
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=split, check_vma=False)(*grouped, *whole)

    @jax.custom_vjp
    def product(x, w, s):
        return each(lambda r, n, w: _ragged(r, w, n), (x, s), (w,))

    def forward(x, w, s):
        return product(x, w, s), (x, w, s)

    def backward(residuals, grad):
        x, w, s = residuals
        grad = grad.astype(x.dtype)
        d_x = each(lambda g, n, w: _ragged(g, jnp.swapaxes(w, 1, 2), n), (grad, s), (w,))
        d_w = each(lambda r, g, n: _tgmm(r, g, n, w.dtype), (x, grad, s))
        return d_x, d_w.sum(0), None

    product.defvjp(forward, backward)
    return product(a, b, sizes)


def _ragged(x, w, sizes):
    """XLA's ragged dot on a TPU, in ``x``'s dtype: half products accumulate in float32 (at
    any precision they are exact, and the kernel refuses HIGHEST for them), float32 ones at
    the precision in effect."""

    kw = {"preferred_element_type": jnp.float32} if x.dtype in _HALF else {"precision": matmul_precision()}
    return jax.lax.ragged_dot(x, w, sizes, **kw).astype(x.dtype)


def _tgmm(x, grad, sizes, dtype):
    """``x[rows of e].T @ grad[rows of e]`` for every expert ``e``: megablox's kernel, which
    accumulates in float32 and writes ``dtype``."""
    import importlib

    megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
    rows, k, n = x.shape[0], x.shape[1], grad.shape[1]
    with jax.enable_x64(False):  # its group metadata must stay 32-bit (a fit lowers with 64-bit types on)
        return megablox.tgmm(x.T, grad, sizes.astype(jnp.int32), preferred_element_type=dtype,
                             tiling=(min(128, rows), min(128, k), min(128, n)))


def grouped_matmul_backward(a, b, offs, grad):
    """``tpu_debug::fit_grouped_mm_backward``: the gradients of ``grouped_matmul`` for ``a``
    and ``b`` (JAX's, through the same shard_map)."""
    _, pullback = jax.vjp(lambda x, y: grouped_matmul(x, y, offs), a, b)
    return pullback(grad.astype(a.dtype))


def take_rows(x, index):
    """``tpu_debug::fit_take_rows``: ``x[g, index[g, r]]`` for every group ``g`` and ``r``."""
    return jnp.take_along_axis(x, index[..., None], axis=1, mode="clip")


def take_rows_backward(index, grad, rows: int):
    """``tpu_debug::fit_take_rows_backward``: ``grad`` added into ``rows`` rows per group at ``index``."""
    zeros = jnp.zeros((grad.shape[0], rows, grad.shape[-1]), grad.dtype)
    _, pullback = jax.vjp(lambda x: take_rows(x, index), zeros)
    return pullback(grad)[0]
