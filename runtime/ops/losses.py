"""Loss functions and their backward ops: nll, mse, smooth L1, Huber, binary cross
entropy (with and without logits), CTC.

Where PyTorch's backward is the derivative of its forward, the lowering is
``jax.vjp`` of the forward; where it is not (``binary_cross_entropy`` clamps its
logs, CTC adds a term its ``log_softmax`` input cancels), it follows PyTorch's
kernel. Half-precision inputs compute in float32 (PyTorch's ``opmath``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_debug.core.errors import OpArgumentError
from tpu_debug.runtime.ops._checks import Refusal, ValueCheck, first_outside, require, scalar_type, sizes
from tpu_debug.runtime.ops._common import opmath, promote
from tpu_debug.runtime.ops.registry import lower

aten = torch.ops.aten

_NONE, _MEAN, _SUM = 0, 1, 2  # at::Reduction


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


# ---- negative log likelihood --------------------------------------------------------------


def _nll(x, target, weight, ignore_index):
    """Per-element losses, per-element weights; class dim 1 (0 if unbatched)."""
    if x.ndim == 1:
        x, target = x[None], target[None]
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, 1), axis=1)[:, 0]
    w = jnp.take(weight, t) if weight is not None else jnp.ones(t.shape, x.dtype)
    w = jnp.where(valid, w.astype(x.dtype), 0)
    return -picked * w, w


def _nll_forward(x, target, weight, reduction, ignore_index):
    losses, w = _nll(opmath(x), target, None if weight is None else opmath(weight), ignore_index)
    if reduction == _NONE:
        return (losses if x.ndim > 1 else losses[0]), jnp.zeros((), losses.dtype)
    total = jnp.sum(w)
    out = jnp.sum(losses)
    return (out / total if reduction == _MEAN else out), total


def _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    unbatched = x.ndim == 1
    xf = opmath(x)[None] if unbatched else opmath(x)
    t = target[None] if unbatched else target
    valid = t != ignore_index
    tt = jnp.where(valid, t, 0)
    w = jnp.take(opmath(weight), tt) if weight is not None else jnp.ones(tt.shape, xf.dtype)
    w = jnp.where(valid, w.astype(xf.dtype), 0)
    g = opmath(grad)
    if reduction == _NONE:
        g = g[None] if unbatched else g
    elif reduction == _MEAN:
        g = g / total_weight.astype(xf.dtype)
    contrib = -w * g
    classes = lax.broadcasted_iota(tt.dtype, xf.shape, 1)
    out = jnp.where(classes == jnp.expand_dims(tt, 1), jnp.expand_dims(contrib, 1), 0).astype(xf.dtype)
    return out[0] if unbatched else out


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index)


@lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


# ---- pointwise losses ---------------------------------------------------------------------


def _pointwise_loss(fn):
    """A loss ``fn(x, y)`` elementwise, reduced; its backward by vjp."""

    def forward(x, y, reduction, *params):
        x, y = promote(x, y)
        return _reduce(fn(opmath(x), opmath(y), *params), reduction)

    def backward(grad, x, y, reduction, *params):
        _, vjp = jax.vjp(lambda v: forward(v, y, reduction, *params), opmath(x))
        return vjp(opmath(grad).reshape(jnp.shape(forward(x, y, reduction, *params))))[0]

    return forward, backward


def _smooth_l1(x, y, beta):
    d = jnp.abs(x - y)
    if beta == 0:
        return d
    return jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


def _huber(x, y, delta):
    d = jnp.abs(x - y)
    return jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


_mse_fwd, _mse_bwd = _pointwise_loss(lambda x, y: jnp.square(x - y))
_sl1_fwd, _sl1_bwd = _pointwise_loss(_smooth_l1)
_huber_fwd, _huber_bwd = _pointwise_loss(_huber)


@lower(aten.mse_loss.default)
def mse_loss(x, y, reduction=_MEAN):
    return _mse_fwd(x, y, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad, x, y, reduction):
    return _mse_bwd(grad, x, y, reduction)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, y, reduction=_MEAN, beta=1.0):
    return _sl1_fwd(x, y, reduction, beta)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad, x, y, reduction, beta):
    return _sl1_bwd(grad, x, y, reduction, beta)


@lower(aten.huber_loss.default)
def huber_loss(x, y, reduction=_MEAN, delta=1.0):
    return _huber_fwd(x, y, reduction, delta)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad, x, y, reduction, delta):
    return _huber_bwd(grad, x, y, reduction, delta)


# ---- binary cross entropy -----------------------------------------------------------------


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, y, weight=None, reduction=_MEAN):
    x, y = opmath(x), opmath(y)
    # PyTorch clamps each log at -100 so that 0 and 1 give finite losses
    loss = -(y * jnp.maximum(jnp.log(x), -100.0) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * opmath(weight)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, y, weight=None, reduction=_MEAN):
    # PyTorch's kernel, not the derivative of the clamped forward
    x, y, g = opmath(x), opmath(y), opmath(grad)
    out = g * (x - y) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        out = out * opmath(weight)
    if reduction == _MEAN:
        out = out / x.size
    return jnp.broadcast_to(out, x.shape)


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, y, weight=None, pos_weight=None, reduction=_MEAN):
    x, y = opmath(x), opmath(y)
    log_sig = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        loss = (1 - y) * x - ((opmath(pos_weight) - 1) * y + 1) * log_sig
    else:
        loss = (1 - y) * x - log_sig
    if weight is not None:
        loss = loss * opmath(weight)
    return _reduce(loss, reduction)


# ---- CTC loss -----------------------------------------------------------------------------


def _logaddexp(a, b):
    """log(exp(a) + exp(b)) whose gradient stays finite where both are -inf (unreachable
    alignment cells): jnp.logaddexp's is NaN there, and NaN would reach log_probs."""
    m = jnp.maximum(a, b)
    dead = jnp.isneginf(m)
    m0 = jnp.where(dead, 0.0, lax.stop_gradient(m)).astype(m.dtype)
    a0, b0 = jnp.where(dead, 0.0, a).astype(a.dtype), jnp.where(dead, 0.0, b).astype(b.dtype)
    out = m0 + jnp.log(jnp.exp(a0 - m0) + jnp.exp(b0 - m0))
    return jnp.where(dead, jnp.asarray(-jnp.inf, m.dtype), out)


def _ctc_nll(log_probs, targets, input_lengths, target_lengths, blank):
    """CTC's negative log likelihood per batch element and its log_alpha table, by the
    forward recursion over the extended label sequence (blank, l1, blank, l2, ..., blank).
    Lengths are static (the IntList overload); targets are (N, S) padded or 1-D concatenated."""
    lp = jnp.swapaxes(log_probs, 0, 1)  # (N, T, C)
    n, t_max, _ = lp.shape
    il = np.asarray(input_lengths, np.int64).reshape(n)
    tl = np.asarray(target_lengths, np.int64).reshape(n)
    s_max = int(tl.max()) if n else 0
    width = 2 * s_max + 1
    pos = np.arange(s_max)[None, :]
    valid = pos < tl[:, None]
    if targets.ndim == 1:
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        index = np.where(valid, starts[:, None] + pos, 0)
        labels = jnp.where(valid, targets[index] if targets.shape[0] else 0, blank)
    else:
        labels = jnp.where(valid, targets[:, :s_max], blank)
    ext = jnp.full((n, width), blank, labels.dtype).at[:, 1::2].set(labels)
    skip = jnp.zeros((n, width), bool)
    if width > 2:
        skip = skip.at[:, 2:].set((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]))
    in_seq = np.arange(width)[None, :] < (2 * tl + 1)[:, None]
    lp_ext = jnp.take_along_axis(lp, jnp.broadcast_to(ext[:, None, :], (n, t_max, width)), axis=2)
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    first = jnp.full((n, width), neg).at[:, 0].set(lp_ext[:, 0, 0])
    if width > 1:
        first = first.at[:, 1].set(jnp.where(tl > 0, lp_ext[:, 0, 1], neg))
    first = jnp.where(in_seq & (il > 0)[:, None], first, neg)

    def step(alpha, t):
        one = jnp.concatenate([jnp.full((n, 1), neg), alpha[:, :-1]], axis=1)
        two = jnp.concatenate([jnp.full((n, 2), neg), alpha[:, :-2]], axis=1)[:, :width]
        new = _logaddexp(_logaddexp(alpha, one), jnp.where(skip, two, neg)) + lp_ext[:, t, :]
        new = jnp.where(in_seq, new, neg)
        active = (t < il)[:, None]
        return jnp.where(active, new, alpha), jnp.where(active, new, neg)

    last, rest = lax.scan(step, first, jnp.arange(1, t_max)) if t_max > 1 else (first, first[None, :0])
    log_alpha = jnp.concatenate([first[:, None, :], jnp.swapaxes(rest, 0, 1)], axis=1)
    end = jnp.take_along_axis(last, jnp.asarray(2 * tl)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(last, jnp.asarray(np.maximum(2 * tl - 1, 0))[:, None], axis=1)[:, 0]
    ll = _logaddexp(end, jnp.where(tl > 0, before, neg))
    return -ll, log_alpha


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    nll, log_alpha = _ctc_nll(log_probs, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), jnp.zeros((), nll.dtype), nll)
    return nll, log_alpha


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    """PyTorch's CTC gradient: d nll / d log_probs (here by differentiating the forward
    recursion; CPU uses a beta pass) plus exp(log_probs) on every frame inside the input
    length. PyTorch's kernel assumes log_probs come from log_softmax and returns the
    gradient its backward then maps correctly (the added term sums to zero through it).
    An infinite loss gets a zero gradient under ``zero_infinity``, as on CPU."""
    def nll_of(lp):
        return _ctc_nll(lp, targets, input_lengths, target_lengths, blank)[0]

    nll, vjp = jax.vjp(nll_of, log_probs)
    (g,) = vjp(grad)
    t_max, n = log_probs.shape[0], log_probs.shape[1]
    inside = np.arange(t_max)[:, None] < np.asarray(input_lengths, np.int64).reshape(n)[None, :]
    g = g + jnp.where(inside[:, :, None], jnp.exp(log_probs) * grad[None, :, None], jnp.zeros((), g.dtype))
    finite = ~jnp.isinf(nll)
    if zero_infinity:
        g = jnp.where(finite[None, :, None], g, jnp.zeros((), g.dtype))
    return g


# ---- multi-class margin losses --------------------------------------------------------------
# PyTorch's CPU kernels (LossMultiMargin.cpp, LossMultiLabelMargin.cpp) sum each sample's
# hinge terms and divide by the class count; a margin exactly met (z == 0) adds nothing and
# has no gradient. The reduction-"none" result has the target's batch shape: 0-d for an
# unbatched target, where PyTorch's Python decomposition gives shape (1,).


def _margin_frames(x) -> tuple[int, int]:
    """(samples, classes) of a margin loss's input: a vector or a matrix with classes last."""
    require((x.ndim == 2 and x.shape[1] != 0) or (x.ndim == 1 and x.shape[0] != 0) or x.ndim == 0,
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {sizes(x.shape)}")
    return (x.shape[0] if x.ndim == 2 else 1), (x.shape[-1] if x.ndim else 1)


def _check_long_target(target) -> None:
    # CPU's kernels read the target as int64 after their shape checks
    require(target.dtype == torch.long, f"expected scalar type Long but found {scalar_type(target.dtype)}")


def _check_multi_margin(x, target, p=1, margin=1, weight=None, reduction=_MEAN) -> None:
    nframe, dim = _margin_frames(x)
    require(p == 1 or p == 2, "only p == 1 and p == 2 supported")
    require(target.ndim <= 1 and target.numel() == nframe,
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
            f"samples (batch size). Expected target size [{nframe}], but got {sizes(target.shape)}. "
            f"Input has shape {sizes(x.shape)}.")
    if weight is not None:
        require(weight.ndim <= 1 and weight.numel() == dim,
                f"inconsistent weight size, expected {dim} but got {sizes(weight.shape)}")
    _check_long_target(target)


def _multi_margin_meta(x, target, p=1, margin=1, weight=None, reduction=_MEAN):
    _check_multi_margin(x, target, p, margin, weight, reduction)  # fake tensors under torch.compile
    shape = (x.shape[0] if x.ndim == 2 else 1,) if reduction == _NONE and target.ndim > 0 else ()
    return x.new_empty(shape)


def _class_targets(low: int, message: str) -> ValueCheck:
    """Class indices in ``[low, classes)``, ``classes`` the input's last dimension: CPU's kernels
    refuse any other with ``message``; XLA reads another class's score (a clamped index)."""

    def select(x, target, *args, **kwargs):  # the argument checks ran first: target is int64
        return (target,), (x.shape[-1] if x.ndim else 1,)

    def test(xp, arrays, statics):
        bad, value = first_outside(xp, arrays[0].reshape(-1), low, statics[0])
        return xp.where(bad, 1, 0), value

    def refusal(code, value, statics):
        return Refusal(OpArgumentError(message), "target", low, statics[0], "clamped")

    return ValueCheck(select, test, refusal)


def _multi_margin_terms(x, target, p, margin, weight):
    """Per (sample, class): the hinge ``margin - x[y] + x[c]``, whether it counts (positive,
    and not the target class), and the weight of the sample's target class."""
    x2 = opmath(x).reshape(-1, x.shape[-1] if x.ndim else 1)
    t = target.reshape(-1)
    z = margin - jnp.take_along_axis(x2, t[:, None], axis=1) + x2
    active = (z > 0) & (lax.broadcasted_iota(t.dtype, x2.shape, 1) != t[:, None])
    w = jnp.ones(t.shape, x2.dtype) if weight is None else jnp.take(opmath(weight).reshape(-1), t)
    return z, active, w[:, None]


@lower(aten.multi_margin_loss.default, static_scalars=True, meta=_multi_margin_meta, check=_check_multi_margin,
       values=_class_targets(0, "target out of range"))
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=_MEAN):
    z, active, w = _multi_margin_terms(x, target, p, margin, weight)
    h = jnp.where(active, (z if p == 1 else z * z) * w, 0)
    per_sample = jnp.sum(h, axis=1) / z.shape[1]
    if reduction == _NONE:
        return per_sample.reshape(target.shape).astype(x.dtype)
    return _reduce(per_sample, reduction).astype(x.dtype)


@lower(aten.multi_margin_loss_backward.default, static_scalars=True)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=_MEAN):
    z, active, w = _multi_margin_terms(x, target, p, margin, weight)
    nframe, dim = z.shape
    g = 1 / (nframe * dim) if reduction == _MEAN else 1 / dim
    h = jnp.where(active, (g if p == 1 else 2 * g * z) * w, 0)
    is_target = lax.broadcasted_iota(target.dtype, z.shape, 1) == target.reshape(-1, 1)
    out = jnp.where(is_target, -jnp.sum(h, axis=1, keepdims=True), h)
    go = opmath(grad)
    out = out * (go.reshape(-1, 1) if reduction == _NONE and go.ndim else go)
    return out.reshape(x.shape).astype(x.dtype)


def _check_multilabel_margin(x, target, reduction=_MEAN) -> None:
    require(x.ndim <= 2,
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {sizes(x.shape)}")
    _margin_frames(x)
    require(target.shape == x.shape,
            f"inconsistent target size: {sizes(target.shape)} for input of size: {sizes(x.shape)}")
    _check_long_target(target)


def _multilabel_margin_meta(x, target, reduction):
    _check_multilabel_margin(x, target, reduction)  # fake tensors under torch.compile
    shape = (x.shape[0],) if reduction == _NONE and target.ndim > 1 else ()
    return x.new_empty(shape), x.new_empty(target.shape)


def _multilabel_terms(x, target, is_target=None):
    """Per (sample, target position j, class c): the hinge ``1 - x[y_j] + x[c]`` and whether it
    counts (j before the sample's first -1, c not a target class, hinge positive); the
    target classes, and each position's class (0 past the end)."""
    dim = x.shape[-1] if x.ndim else 1
    x2, t2 = opmath(x).reshape(-1, dim), target.reshape(-1, dim)
    pos = lax.broadcasted_iota(t2.dtype, t2.shape, 1)
    end = jnp.min(jnp.where(t2 == -1, pos, dim), axis=1, keepdims=True)
    valid = pos < end
    labels = jnp.where(valid, t2, 0)
    if is_target is None:
        hit = (labels[:, :, None] == pos[:, None, :]) & valid[:, :, None]
        is_target = jnp.any(hit, axis=1)
    else:
        is_target = is_target.reshape(-1, dim) != 0
    z = 1 - jnp.take_along_axis(x2, labels, axis=1)[:, :, None] + x2[:, None, :]
    active = (z > 0) & valid[:, :, None] & ~is_target[:, None, :]
    return z, active, is_target, labels


# a target row lists its classes up to the first -1; CPU checks every entry, those after it too
@lower(aten.multilabel_margin_loss_forward.default, meta=_multilabel_margin_meta, check=_check_multilabel_margin,
       values=_class_targets(-1, "argument #2 'target' is out of range"))
def multilabel_margin_loss_forward(x, target, reduction):
    z, active, is_target, _ = _multilabel_terms(x, target)
    per_sample = jnp.sum(jnp.where(active, z, 0), axis=(1, 2)) / z.shape[2]
    if reduction == _NONE:
        out = per_sample if target.ndim > 1 else per_sample.reshape(())
    else:
        out = _reduce(per_sample, reduction)
    return out.astype(x.dtype), is_target.reshape(target.shape).astype(x.dtype)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    z, active, _, labels = _multilabel_terms(x, target, is_target)
    nframe, _, dim = z.shape
    g = 1 / (nframe * dim) if reduction == _MEAN else 1 / dim
    counts = jnp.sum(active, axis=2).astype(z.dtype)  # hinges each target position takes part in
    classes = lax.broadcasted_iota(labels.dtype, (1, 1, dim), 2)
    out = g * jnp.sum(active, axis=1).astype(z.dtype)
    out = out - g * jnp.sum(jnp.where(labels[:, :, None] == classes, counts[:, :, None], 0), axis=1)
    go = opmath(grad)
    out = out * (go.reshape(-1, 1) if reduction == _NONE and go.ndim else go)
    return out.reshape(x.shape).astype(x.dtype)
