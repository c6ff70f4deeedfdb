"""TPU layouts in optimized HLO, and the memory their tiles pad away.

A TPU stores an array in tiles: ``f32[1000,100]{0,1:T(8,128)}`` lays dimension 1
out major and dimension 0 minor (``minor_to_major = 0,1``), then cuts the two
most-minor physical dimensions into 8x128 tiles, padding each up to a multiple
of the tile. Further tiles apply inside the first: bfloat16's
``T(8,128)(2,1)`` packs row pairs into 32-bit words, int8's ``T(32,128)(4,1)``
four rows. ``E(4)`` gives the element size in bits (int4); ``S(n)`` a memory
space other than HBM (``S(1)`` is a core's vector memory, inside fusions).
XLA picks the tiles per array: smaller dimensions get smaller tiles
(``f32[3,100]{1,0:T(4,128)}``, ``f32[1,1]{1,0:T(1,128)}``).

A 100-wide float32 activation ``f32[64,100]{1,0:T(8,128)}`` takes 64x128 words:
22% of its bytes are padding; 128 wide, none. For buffers in HBM, this module
gives the logical and the padded bytes of every array the program's entry
computation holds.
"""

from __future__ import annotations

import dataclasses
import math

from tpu_debug.core.hlo_text import ELEMENT_BITS, TiledLayout, parse_layout, parse_module

__all__ = [
    "ELEMENT_BITS",
    "Buffer",
    "PaddingReport",
    "TiledLayout",
    "padded_bytes",
    "padding_report",
    "parse_layout",
]

# a layout, its tiles and the element sizes are read by the one HLO reader (core/hlo_text.py);
# this module adds what the tiles cost


def padded_elements(shape: tuple[int, ...], layout: TiledLayout) -> int | None:
    """Elements a tiled array occupies, padding included (None for a layout not understood).

    XLA's tiling: the physical shape (dimensions major to minor) has its most-minor
    dimensions padded up to multiples of the first tile, then becomes
    (outer dims, tile counts..., tile dims...); the next tile applies to that
    shape's most-minor dimensions, and so on.
    """
    if len(layout.minor_to_major) != len(shape):
        return None
    physical = [shape[d] for d in reversed(layout.minor_to_major)]
    for tile in layout.tiles:
        if any(t is None or t <= 0 for t in tile):
            return None
        if len(tile) > len(physical):
            physical = [1] * (len(tile) - len(physical)) + physical
        outer = physical[: len(physical) - len(tile)]
        tiled = physical[len(physical) - len(tile):]
        physical = outer + [math.ceil(d / t) for d, t in zip(tiled, tile)] + list(tile)
    return math.prod(physical)


def padded_bytes(dtype: str, shape: tuple[int, ...], layout: TiledLayout | str) -> int | None:
    """Bytes a tiled array occupies (None when the dtype or layout is not understood).

    Example:
        >>> padded_bytes("f32", (64, 100), "{1,0:T(8,128)}")
        32768
    """
    if isinstance(layout, str):
        layout = parse_layout(layout)
    bits = layout.element_bits or ELEMENT_BITS.get(dtype)
    n = padded_elements(shape, layout)
    if bits is None or n is None:
        return None
    return math.ceil(n * bits / 8)


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
    """One array in a program's entry computation.

    Attributes:
        name: the HLO instruction (``param.1``, ``fusion.3``).
        opcode: its HLO opcode (``parameter``, ``fusion``, ``copy``...).
        dtype: XLA's element type (``f32``).
        shape: the logical shape.
        layout: the TPU layout.
        logical_bytes: elements x element size.
        padded_bytes: what the tiles occupy (None for a layout not understood).
        output_index: for an instruction returning a tuple, the element's index.
    """

    name: str
    opcode: str
    dtype: str
    shape: tuple[int, ...]
    layout: TiledLayout
    logical_bytes: int
    padded_bytes: int | None
    output_index: int | None = None

    @property
    def waste(self) -> float:
        """Fraction of the padded bytes that is padding (0.22 for 100 of 128)."""
        if not self.padded_bytes:
            return 0.0
        return 1.0 - self.logical_bytes / self.padded_bytes

    @property
    def is_parameter(self) -> bool:
        return self.opcode == "parameter"

    def render(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]{self.layout}"


@dataclasses.dataclass(frozen=True, slots=True)
class PaddingReport:
    """The arrays of a program's entry computation with their padding."""

    buffers: tuple[Buffer, ...]

    @property
    def logical_bytes(self) -> int:
        return sum(b.logical_bytes for b in self.buffers if b.padded_bytes is not None)

    @property
    def padded_bytes(self) -> int:
        return sum(b.padded_bytes for b in self.buffers if b.padded_bytes is not None)

    @property
    def waste(self) -> float:
        """Fraction of all padded bytes that is padding."""
        padded = self.padded_bytes
        return 1.0 - self.logical_bytes / padded if padded else 0.0

    @property
    def parameters(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.is_parameter)

    def worst(self, n: int = 10) -> list[Buffer]:
        """The ``n`` arrays that waste the most bytes, most first."""
        ranked = [b for b in self.buffers if b.padded_bytes is not None and b.padded_bytes > b.logical_bytes]
        ranked.sort(key=lambda b: b.padded_bytes - b.logical_bytes, reverse=True)
        return ranked[:n]


# instructions whose result is another instruction's buffer, not a buffer of their own
_ALIASING = {"bitcast", "get-tuple-element", "tuple", "constant"}


def _aliasing(opcode: str) -> bool:
    # an async "-start" returns (its operands, its destination, a context): the operands
    # are buffers already listed, the destination is what the matching "-done" returns
    return opcode in _ALIASING or opcode.endswith("-start")


def padding_report(hlo_text: str, *, include_aliasing: bool = False) -> PaddingReport:
    """The entry computation's arrays in HBM, logical vs padded bytes.

    Args:
        hlo_text: optimized HLO from the TPU compiler (``TargetCompile.hlo``).
        include_aliasing: also list instructions that name another buffer
            (``bitcast``, ``get-tuple-element``, ``tuple``, an async ``-start``) and
            constants.

    Returns:
        A ``PaddingReport`` over the entry computation's parameters and the
        results of its instructions (fusions, copies, collectives...) that sit in
        HBM (memory space 0). Arrays inside fusions live in on-core memory and are
        not listed.

    Example::

        report = padding_report(result.hlo)
        [(b.render(), round(b.waste, 2)) for b in report.worst(3)]
    """
    buffers: list[Buffer] = []
    entry = parse_module(hlo_text).entry
    for ins in entry.instructions if entry is not None else ():
        if _aliasing(ins.opcode) and not include_aliasing:
            continue
        for index, array in enumerate(ins.shape.arrays):
            layout = array.layout
            if array.dtype not in ELEMENT_BITS or layout is None or layout.memory_space != 0 or array.elements is None:
                continue
            logical = math.ceil(math.prod(array.dims) * ELEMENT_BITS[array.dtype] / 8)
            padded = padded_bytes(array.dtype, array.dims, layout)
            buffers.append(Buffer(ins.name, ins.opcode, array.dtype, array.dims, layout, logical, padded,
                                  index if ins.shape.is_tuple else None))
    return PaddingReport(tuple(buffers))
