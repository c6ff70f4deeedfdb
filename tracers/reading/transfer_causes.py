"""Transfers read back: what each cause is called, which are implicit, and the ledger by call site.

The transfer classifier (``tracers/recording/transfer_sites.py``) gives each transfer
its *cause* (``item``, ``print``, ``bool``, ``to``, ...) and the user's line as it
happens. :func:`call_sites` groups recorded transfers by source line (the ledger the
report prints, with loop detection and advice); :func:`user_caused` says which reads
inside library code the user's own call decides.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from tpu_debug.tracers.events import SourceLocation, TransferEvent

__all__ = [
    "CAUSE_TEXT",
    "IMPLICIT",
    "LOOP_MIN",
    "USER_CAUSED",
    "CallSite",
    "CausedRead",
    "advice_for",
    "call_sites",
    "is_implicit",
    "user_caused",
]


@dataclasses.dataclass(frozen=True, slots=True)
class CausedRead:
    """A read inside library code that the user's call decides: an argument that asks for it
    (``cause="argument"``), a call made more often than the value is needed
    (``cause="cadence"``), or a check the library makes by default and has a switch for
    (``cause="validation"``). ``file`` is the library file under the torch package, ``function``
    the frame that reads (as a transfer's ``context`` names it). ``switch`` names the one
    setting that turns off every read sharing it (None: the read's own): those reads are one
    cause, and the first of them in :data:`USER_CAUSED` is the one its finding stands at."""

    file: str
    function: str
    cause: str
    what: str
    fix: str
    switch: str | None = None


USER_CAUSED: tuple[CausedRead, ...] = (
    CausedRead(
        "nn/utils/clip_grad.py",
        "_get_total_norm",
        "argument",
        "clip_grad_norm_(..., error_if_nonfinite=True) reads the total norm back to the host to test it",
        "drop error_if_nonfinite=True (the default, False, reads nothing): clipping stays on the device; to "
        "catch a non-finite norm, keep the norm clip_grad_norm_ returns and test it where the loss is "
        "already read (every N steps), or with torch.isfinite(norm) on the device",
    ),
    CausedRead(
        "optim/lr_scheduler.py",
        "ReduceLROnPlateau.step",
        "cadence",
        "ReduceLROnPlateau.step(metric) reads the metric back to the host (float(metrics)) at each call",
        "call it once per epoch with a validation metric, as ReduceLROnPlateau is meant to be used (its "
        "patience counts calls, so calling it every step also shortens the patience to steps): each call "
        "waits for the device",
    ),
    # torch.distributions checks its arguments by default (Distribution._validate_args is
    # __debug__): the constraint check of each parameter at construction, and of the value given
    # to log_prob, ends in `if not valid.all():`, a read of a device value
    CausedRead(
        "distributions/distribution.py",
        "Distribution.__init__",
        "validation",
        "torch.distributions checks the distribution's parameters against their constraints when it is "
        "built, which reads the check's result back to the host",
        "build it with validate_args=False (Categorical(logits=..., validate_args=False)), or switch the "
        "checks off once at start-up with torch.distributions.Distribution.set_default_validate_args(False): "
        "the checks only test that the parameters are valid, and each one waits for the device",
        "validate_args",
    ),
    CausedRead(
        "distributions/distribution.py",
        "Distribution._validate_sample",
        "validation",
        "torch.distributions checks the value given to log_prob() against the distribution's support, "
        "which reads the check's result back to the host",
        "build the distribution with validate_args=False, or switch the checks off once at start-up with "
        "torch.distributions.Distribution.set_default_validate_args(False): the check only tests that the "
        "value is in the support, and each one waits for the device",
        "validate_args",
    ),
)


def user_caused(context: str | None) -> CausedRead | None:
    """The :class:`CausedRead` a library frame (``"/.../torch/nn/utils/clip_grad.py:109 in
    _get_total_norm"``) is, or None for a read that is the library's own business."""
    if not context:
        return None
    where, _, function = context.rpartition(" in ")
    file = where.rpartition(":")[0].replace(os.sep, "/")
    for read in USER_CAUSED:
        if function == read.function and file.endswith("/torch/" + read.file):
            return read
    return None


IMPLICIT = frozenset({"item", "tolist", "print", "bool", "float", "int", "index", "scalar", "numpy", "shape"})

# how the report names each cause
CAUSE_TEXT = {
    "item": ".item()",
    "tolist": ".tolist()",
    "print": "print/repr",
    "bool": "bool() / if t:",
    "float": "float()",
    "int": "int()",
    "index": "tensor as index",
    "scalar": "scalar operand",
    "numpy": ".numpy()",
    "shape": "a data-dependent shape (boolean mask, nonzero)",
    "cpu": ".cpu()",
    "to": ".to()",
    "tensor": "torch.tensor(device=)",
    "copy": "copy_()",
}

# a call site that moved data at least this many times is reported as a loop
LOOP_MIN = 3


def is_implicit(cause: str) -> bool:
    """True when the user did not ask for the copy: a sync to read a value, an
    uploaded scalar operand, a CPU fallback."""
    return cause in IMPLICIT or cause.startswith("fallback:")

# -- the ledger, by call site --------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CallSite:
    """The transfers of one source line with one direction and cause, added up.

    ``calls`` counts the times the line moved data: one per transfer, except
    for ``print``, where one call copies a tensor element by element (a run of
    transfers from the line with no other transfer between counts once).
    """

    location: SourceLocation | None
    direction: str
    cause: str
    implicit: bool
    count: int
    nbytes: int
    seconds: float
    shapes: tuple[str, ...]
    calls: int = 0

    @property
    def loop(self) -> bool:
        """The line synced on many calls: it sits in a loop (explicit copies, such as
        uploading each batch, are not syncs and are not flagged)."""
        return self.implicit and (self.calls or self.count) >= LOOP_MIN


def call_sites(transfers: Iterable[TransferEvent]) -> list[CallSite]:
    """Transfers grouped by (line, direction, cause): implicit first, then loops,
    then the most frequent, then the slowest."""
    groups: dict[tuple, list[TransferEvent]] = {}
    runs: dict[tuple, int] = {}
    previous = None
    for t in sorted(transfers, key=lambda t: t.id):
        key = (t.location, t.direction, t.op, t.implicit)
        groups.setdefault(key, []).append(t)
        if key != previous:
            runs[key] = runs.get(key, 0) + 1
        previous = key
    out = []
    for (location, direction, cause, implicit), items in groups.items():
        shapes: dict[str, None] = {}
        for t in items:
            shapes.setdefault(f"{t.dtype}[{','.join(map(str, t.shape))}]", None)
        out.append(
            CallSite(
                location,
                direction,
                cause,
                implicit,
                len(items),
                sum(t.nbytes for t in items),
                sum(t.seconds for t in items),
                tuple(shapes)[:4],
                runs[(location, direction, cause, implicit)] if cause == "print" else len(items),
            )
        )
    out.sort(key=lambda s: (not s.implicit, not s.loop, -(s.calls or s.count), -s.seconds))
    return out


def advice_for(site: CallSite) -> str:
    """What to do about a call site that syncs in a loop."""
    cause = site.cause
    if cause in ("item", "float", "int"):
        return (
            "each call waits for the device to finish; keep the running value on the device "
            "(total += loss.detach()) and read it once, after the loop or every N steps"
        )
    if cause == "print":
        return "printing a tensor copies it to the host (element by element); print a reduced value every N steps"
    if cause == "bool":
        return "a tensor in a Python condition waits for the device; use torch.where, or check once outside the loop"
    if cause == "tolist":
        return "tolist() copies the whole tensor to the host; keep the data on the device or copy once after the loop"
    if cause == "index":
        return "a tensor used as a Python index is read back to the host; index with the tensor on the device instead"
    if cause == "shape":
        return (
            "the result's size depends on the data, so the host waits for the device to count it and "
            "each new size compiles again; keep the shape fixed: torch.where or masked_fill instead of "
            "selecting with a mask, ignore_index or a weighted loss instead of dropping elements"
        )
    if cause == "scalar":
        return "a CPU scalar tensor is uploaded on every call; make it a Python number or create it on the device once"
    if cause.startswith("fallback:"):
        return f"aten::{cause.removeprefix('fallback:')} has no tpu lowering and runs on CPU; add one under runtime/ops/"
    if site.direction == "h2d":
        return "data is uploaded on every iteration; move it to the device once, before the loop"
    return "data is copied to the host on every iteration; copy once, after the loop"
