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
import re

__all__ = ["TiledLayout", "Buffer", "PaddingReport", "parse_layout", "padded_bytes", "padding_report",
           "ELEMENT_BITS"]

# bits per element of XLA's primitive types (pred takes a byte on TPU: int8 tiles)
ELEMENT_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
    "u32": 32,
    "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e4m3b11fnuz": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8,
    "f8e3m4": 8,
    "f8e8m0fnu": 8, "f4e2m1fn": 4,
}


@dataclasses.dataclass(frozen=True, slots=True)
class TiledLayout:
    """One HLO layout: ``{1,0:T(8,128)(2,1)}``.

    Attributes:
        minor_to_major: dimensions from the most minor (fastest varying) out.
        tiles: the tilings, outermost first (``((8, 128), (2, 1))``); a ``None``
            entry is XLA's ``*`` (a dimension combined with its neighbour).
        element_bits: the element size when the layout overrides it (``E(4)``).
        memory_space: 0 for HBM, else ``S(n)``.
    """

    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int | None, ...], ...] = ()
    element_bits: int | None = None
    memory_space: int = 0

    def __str__(self) -> str:
        text = ",".join(map(str, self.minor_to_major))
        extras = "".join(
            "(" + ",".join("*" if t is None else str(t) for t in tile) + ")" for tile in self.tiles
        )
        if extras:
            extras = "T" + extras
        if self.element_bits is not None:
            extras += f"E({self.element_bits})"
        if self.memory_space:
            extras += f"S({self.memory_space})"
        return "{" + text + (":" + extras if extras else "") + "}"


_ITEM = re.compile(r"([A-Z#]*)\(([^()]*)\)")


def parse_layout(text: str) -> TiledLayout:
    """Parse an HLO layout, with or without braces.

    Example:
        >>> parse_layout("{1,0:T(8,128)(2,1)}")
        TiledLayout(minor_to_major=(1, 0), tiles=((8, 128), (2, 1)), element_bits=None, memory_space=0)
    """
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    dims, _, rest = body.partition(":")
    minor_to_major = tuple(int(d) for d in dims.split(",") if d.strip())
    tiles: list[tuple[int | None, ...]] = []
    element_bits = None
    memory_space = 0
    last = ""
    for prefix, args in _ITEM.findall(rest):
        kind = prefix or last  # "(2,1)" after "T(8,128)" is a further tile
        if kind == "T":
            tiles.append(tuple(None if a.strip() == "*" else int(a) for a in args.split(",") if a.strip()))
        elif kind == "E":
            element_bits = int(args)
        elif kind == "S":
            memory_space = int(args)
        last = kind
    return TiledLayout(minor_to_major, tuple(tiles), element_bits, memory_space)


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


# "f32[64,100]{1,0:T(8,128)}": an element type, dimensions (dynamic ones as "<=8"), a layout
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([<=\d,]*)\](\{[^{}]*\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\(")
_ENTRY = re.compile(r"^ENTRY\s")
# instructions whose result is another instruction's buffer, not a buffer of their own
_ALIASING = {"bitcast", "get-tuple-element", "tuple", "constant"}


def _aliasing(opcode: str) -> bool:
    # an async "-start" returns (its operands, its destination, a context): the operands
    # are buffers already listed, the destination is what the matching "-done" returns
    return opcode in _ALIASING or opcode.endswith("-start")


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d.lstrip("<=")) for d in text.split(",") if d)


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
    in_entry = False
    for line in hlo_text.splitlines():
        if not in_entry:
            in_entry = bool(_ENTRY.match(line))
            continue
        if line.startswith("}"):
            in_entry = False
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, shape_text, opcode = m.groups()
        if _aliasing(opcode) and not include_aliasing:
            continue
        arrays = _ARRAY.findall(shape_text)
        tuple_shaped = shape_text.lstrip().startswith("(")
        for index, (dtype, dims, layout_text) in enumerate(arrays):
            if dtype not in ELEMENT_BITS or not layout_text:
                continue
            layout = parse_layout(layout_text)
            if layout.memory_space != 0:
                continue
            shape = _dims(dims)
            logical = math.ceil(math.prod(shape) * ELEMENT_BITS[dtype] / 8)
            padded = padded_bytes(dtype, shape, layout)
            buffers.append(Buffer(name, opcode, dtype, shape, layout, logical, padded,
                                  index if tuple_shaped else None))
    return PaddingReport(tuple(buffers))
