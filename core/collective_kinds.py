"""Every kind of collective, declared once: the c10d methods and the XLA opcodes that run it,
and what the code reading either needs to know about it.

A collective reaches tpu_debug two ways. As a call of a c10d process group method
(``allreduce``, ``send``, ...): the `tpu` process group (``runtime/distributed/c10d/``)
reports each one, and the ranks' sequences of them are compared (:mod:`.desync`,
``tracers/reading/collective_calls.py``, the report's ranks section). And as an instruction of a
compiled XLA program (``all-reduce``, ``collective-permute``, ...): :mod:`.collectives`
reads those from HLO text, with the bytes each device sends, for the tracers and ``fit``, and
the roofline leaves them out (their time is a link's). :data:`KINDS` holds each kind once;
the sets and lookups below are derived from it, so a new collective is one
:class:`CollectiveKind` here (plus the code that runs it).

Plain data: this module imports only the standard library.

Example:
    >>> from tpu_debug.core.collective_kinds import of_c10d, of_opcode
    >>> of_c10d("all_gather_single") is of_opcode("all-gather")
    True
    >>> of_opcode("all-reduce").wire_bytes(1024, 4)  # ring all-reduce: 2 (n - 1) / n of the buffer
    1536
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = [
    "C10D_OF_FLIGHT_RECORDER",
    "DATA_OPERAND_OPCODES",
    "FLIGHT_RECORDER_NAMES",
    "HLO_OPCODES",
    "KINDS",
    "LINK_OPCODES",
    "P2P_OPS",
    "RECEIVES",
    "ROOTED",
    "SAME_SHAPES",
    "SENDS",
    "WIRE",
    "CollectiveKind",
    "of_c10d",
    "of_opcode",
]

#: how many bytes each device sends for ``data`` bytes over a group of ``n`` (ring algorithms):
#: a reduction sends its buffer twice over less a share, a gather or scatter once less a share,
#: a broadcast or permute its buffer once
WIRE = {
    "reduce": lambda data, n: 2 * (n - 1) * data // n,
    "ring": lambda data, n: (n - 1) * data // n,
    "once": lambda data, n: data if n > 1 else 0,
}


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveKind:
    """One kind of collective.

    Attributes:
        name: the kind (``"all-reduce"``).
        c10d: the c10d ``ProcessGroup`` methods that run it, as the `tpu` process group
            names its calls (``CollectiveInfo.op``).
        hlo: its XLA opcodes (an asynchronous pair is read at its ``-start``).
        hlo_one_sided: its XLA opcodes of which an instruction is one side of a transfer (to
            another device or the host): time on a link, but no group whose bytes the HLO
            reader counts.
        point_to_point: its calls pair two ranks, not the group: their sequence numbers
            count apart (as c10d counts them), and the group's comparison leaves them out.
        rooted: every rank names a root, the same one.
        same_shapes: every rank passes tensors of the same shapes.
        ragged: its c10d methods whose tensors differ between ranks by design (split sizes).
        in_place: its c10d calls' first argument is their input and their output (reduced or
            broadcast in place); otherwise the first is the output and the second the input.
        moves_tensors: its c10d calls take tensors (a barrier takes none).
        sends: its c10d methods that send their tensors (the first argument) and receive none.
        receives: its c10d methods that receive into their tensors (the first argument).
        peer_argument: its c10d methods whose second argument is the peer's rank in the group.
        wire: a key of :data:`WIRE`, how many bytes each device sends.
        gathers: its operand is one device's share of the data (the data is operand x group).
        scatters: its result is one device's share of the data (the data is result x group).
        start_returns_operand: its ``-start`` instruction returns (operand, result, ...).
        operands_are_data: its instruction's operands are the data it moves (a ragged
            all-to-all's are also its output buffer and the offsets and sizes).
    """

    name: str
    c10d: tuple[str, ...] = ()
    hlo: tuple[str, ...] = ()
    hlo_one_sided: tuple[str, ...] = ()
    point_to_point: bool = False
    rooted: bool = False
    same_shapes: bool = True
    ragged: tuple[str, ...] = ()
    in_place: bool = False
    moves_tensors: bool = True
    sends: tuple[str, ...] = ()
    receives: tuple[str, ...] = ()
    peer_argument: tuple[str, ...] = ()
    wire: str = "once"
    gathers: bool = False
    scatters: bool = False
    start_returns_operand: bool = False
    operands_are_data: bool = True

    def __post_init__(self) -> None:
        if self.wire not in WIRE:
            raise ValueError(f"collective kind {self.name}: wire={self.wire!r}; use one of {', '.join(WIRE)}")
        for field in ("ragged", "sends", "receives", "peer_argument"):
            if not set(getattr(self, field)) <= set(self.c10d):
                raise ValueError(f"collective kind {self.name}: {field} {getattr(self, field)} are not among its "
                                 "c10d methods")

    def wire_bytes(self, data: int, devices: int) -> int:
        """Bytes each of ``devices`` sends to move ``data`` bytes (a ring-algorithm estimate)."""
        return WIRE[self.wire](data, max(devices, 1))

    def flight_recorder_arguments(self, method: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The positions of a ``method`` call's arguments (as the `tpu` process group passes
        them) whose tensors Flight Recorder records as the call's (inputs, outputs)."""
        if not self.moves_tensors:
            return (), ()
        if self.in_place:
            return (0,), (0,)
        if method in self.sends:
            return (0,), ()
        if method in self.receives:
            return (), (0,)
        return (1,), (0,)


KINDS: tuple[CollectiveKind, ...] = (
    CollectiveKind("all-reduce", c10d=("allreduce", "allreduce_coalesced"), hlo=("all-reduce",), wire="reduce",
                   in_place=True),
    CollectiveKind(
        "all-gather",
        c10d=("allgather", "allgather_coalesced", "all_gather_single", "all_gather_single_coalesced"),
        hlo=("all-gather",), wire="ring", gathers=True, start_returns_operand=True,
    ),
    CollectiveKind(
        "reduce-scatter",
        c10d=("reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced"),
        hlo=("reduce-scatter",), wire="ring", scatters=True,
    ),
    CollectiveKind("all-to-all", c10d=("alltoall", "alltoall_base"), hlo=("all-to-all",), wire="ring",
                   ragged=("alltoall_base",)),
    CollectiveKind("ragged-all-to-all", hlo=("ragged-all-to-all",), wire="ring", operands_are_data=False),
    CollectiveKind("broadcast", c10d=("broadcast",), hlo=("collective-broadcast",), rooted=True, in_place=True),
    CollectiveKind(
        "point-to-point", c10d=("send", "recv", "recv_anysource"), hlo=("collective-permute",),
        hlo_one_sided=("send", "recv"), point_to_point=True, same_shapes=False, start_returns_operand=True,
        sends=("send",), receives=("recv", "recv_anysource"), peer_argument=("send", "recv"),
    ),
    CollectiveKind("reduce", c10d=("reduce",), rooted=True, in_place=True),
    CollectiveKind("gather", c10d=("gather",), rooted=True, same_shapes=False),
    CollectiveKind("scatter", c10d=("scatter",), rooted=True, same_shapes=False),
    CollectiveKind("barrier", c10d=("barrier",), moves_tensors=False),
)


def _index(pairs: Iterable[tuple[str, CollectiveKind]], what: str) -> dict[str, CollectiveKind]:
    out: dict[str, CollectiveKind] = {}
    for key, kind in pairs:
        if key in out:
            raise ValueError(f"{what} {key!r} is declared by two collective kinds: {out[key].name} and {kind.name}")
        out[key] = kind
    return out


_BY_C10D = _index(((m, k) for k in KINDS for m in k.c10d), "c10d method")
_BY_OPCODE = _index(((op, k) for k in KINDS for op in k.hlo), "HLO opcode")

#: the opcodes of collectives in XLA programs
HLO_OPCODES: tuple[str, ...] = tuple(_BY_OPCODE)
#: the opcodes whose time is a link's (the interconnect's or the host's), not a chip's: every
#: collective's and each one-sided transfer's (an asynchronous pair's ``-start`` and ``-done`` are
#: read without the suffix)
LINK_OPCODES: frozenset[str] = frozenset(_BY_OPCODE) | {op for k in KINDS for op in k.hlo_one_sided}
#: the opcodes whose operands are the data they move
DATA_OPERAND_OPCODES: tuple[str, ...] = tuple(op for op, k in _BY_OPCODE.items() if k.operands_are_data)
#: point-to-point c10d calls: they pair two ranks, and their sequence numbers count apart
P2P_OPS: frozenset[str] = frozenset(m for k in KINDS if k.point_to_point for m in k.c10d)
#: c10d calls whose tensors have the same shapes on every rank
SAME_SHAPES: frozenset[str] = frozenset(m for k in KINDS if k.same_shapes for m in k.c10d if m not in k.ragged)
#: c10d calls with a root every rank must name alike
ROOTED: frozenset[str] = frozenset(m for k in KINDS if k.rooted for m in k.c10d)
#: c10d calls that send their tensors to a peer, and those that receive from one
SENDS: frozenset[str] = frozenset(m for k in KINDS for m in k.sends)
RECEIVES: frozenset[str] = frozenset(m for k in KINDS for m in k.receives)


#: each c10d method as PyTorch's Flight Recorder names its entries (``profiling_name`` after the
#: backend's prefix), the names ``torchfrtrace`` matches ranks' entries by
FLIGHT_RECORDER_NAMES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "allreduce_coalesced",
    "allgather": "all_gather",
    "allgather_coalesced": "ALLGATHER_coalesced",
    "all_gather_single": "_all_gather_base",
    "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "_reduce_scatter_base",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
}
#: and back: the c10d method of a Flight Recorder name (a dump of PyTorch's own groups, read in).
#: gloo names its all_to_all_single "all_to_all" too, whose tensors differ between ranks with
#: uneven splits: read as the ragged method, whose shapes are not compared
C10D_OF_FLIGHT_RECORDER: dict[str, str] = {
    **{fr: m for m, fr in FLIGHT_RECORDER_NAMES.items() if m != "recv_anysource"},
    "all_to_all": "alltoall_base",
    "all_gather_single": "all_gather_single", "_allgather_base": "all_gather_single",
    "reduce_scatter_single": "reduce_scatter_single", "all_to_all_v_single": "alltoall_base",
    "all_gather_v": "allgather", "reduce_scatter_v": "reduce_scatter", "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce", "REDUCE_SCATTER_coalesced": "reduce_scatter_single_coalesced",
}


def of_c10d(method: str) -> CollectiveKind:
    """The kind a c10d ``ProcessGroup`` method runs.

    Raises:
        KeyError: no kind declares ``method`` (a new c10d method is declared in :data:`KINDS`).
    """
    return _BY_C10D[method]


def of_opcode(opcode: str) -> CollectiveKind | None:
    """The kind of an XLA opcode (``"all-gather"``; its ``-start`` too), or None for an opcode
    that is no collective."""
    return _BY_OPCODE.get(opcode.removesuffix("-start"))
