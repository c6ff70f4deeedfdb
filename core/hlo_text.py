"""Reading XLA's HLO text: one reader for every module of tpu_debug that looks at a program.

An optimized module (``compiled.as_text()``) is a header line
(``HloModule jit_f, is_scheduled=true, ..., num_partitions=8``), the tables its
metadata's ``stack_frame_id`` points into (``FileNames``, ``FunctionNames``,
``FileLocations``, ``StackFrames``), then computations: ``%name (p: f32[8]) -> f32[8] {``
(``ENTRY %main ...`` for the one the program runs), one instruction a line, ``}``. An
instruction is ``[ROOT] %name = <shape> <opcode>(<operands>), key=value, ...``, where a
shape is an array (``f32[64,100]{1,0:T(8,128)}``: element type, dimensions, and a layout
with TPU tiles) or a tuple of shapes.

:func:`parse_module` reads a module once into frozen records (:class:`Module`,
:class:`Computation`, :class:`Instruction`, :class:`Shape`) and keeps the last few it
read, since the tracers, the roofline and ``fit`` each read the same program. The
attributes that need reading are read on the instruction: ``metadata``
(:class:`Metadata`), ``replica_groups`` (:class:`ReplicaGroups`, in its three printed
forms), ``source_target_pairs``, ``sharding`` (:class:`Sharding`) and the computations it
calls. The TUI's colouring of HLO and StableHLO lines (:func:`tokens`) is here too, so
that no other module holds a pattern of this format.

Standard library only: the reading side (report, TUI) loads it without torch or jax.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType

__all__ = [
    "ELEMENT_BITS",
    "Array",
    "Computation",
    "Instruction",
    "Metadata",
    "Module",
    "ReplicaGroups",
    "Shape",
    "Sharding",
    "StackTables",
    "TiledLayout",
    "braced",
    "instruction_name",
    "kernel_calls",
    "matmul_flops",
    "module_devices",
    "parse_instruction",
    "parse_layout",
    "parse_module",
    "parse_replica_groups",
    "parse_shape",
    "parse_sharding",
    "scope_parts",
    "stack_allocation",
    "tokens",
]

# bits per element of XLA's primitive types (pred takes a byte, as XLA stores it)
ELEMENT_BITS = MappingProxyType({
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
    "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8, "f8e4m3": 8,
    "f8e3m4": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4,
})

# what attributes name the computations an instruction calls (a fusion's body, a reduction's
# combiner, a loop's body and condition, a conditional's branches, an async op's wrapped call)
_CALLING = ("calls", "to_apply", "body", "condition", "branch_computations", "called_computations",
            "true_computation", "false_computation", "select", "scatter")


# -- small scanners ------------------------------------------------------------------------------

# a quoted string whole (escapes included), or one bracket or comma: what the scanners look at
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\](),]')
_OPEN, _CLOSE = "{[(", "}])"


def _split_top(text: str) -> list[str]:
    """``text`` cut at each comma outside brackets, braces, parentheses and quoted strings."""
    pieces, depth, start = [], 0, 0
    for m in _TOKEN.finditer(text):
        ch = m.group()
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            at = m.start()
            pieces.append(text[start:at])
            start = at + 1
    pieces.append(text[start:])
    return pieces


def _closing(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at ``start`` (``len(text)`` if none)."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        ch = m.group()
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0:
                return m.end()
    return len(text)


def braced(text: str, start: int = 0) -> str:
    """The balanced group of ``text`` that opens at ``start`` (``{...}``, ``[...]`` or ``(...)``).

    Example:
        >>> braced("sharding={devices=[2,1]<=[2] metadata={op_name=\\"a\\"}}, x=1", 9)
        '{devices=[2,1]<=[2] metadata={op_name="a"}}'
    """
    return text[start:_closing(text, start)]


def _empty() -> Mapping:
    return MappingProxyType({})


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


# -- layouts and shapes --------------------------------------------------------------------------


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


_LAYOUT_ITEM = re.compile(r"([A-Z#]*)\(([^()]*)\)")


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
    for prefix, args in _LAYOUT_ITEM.findall(rest):
        kind = prefix or last  # "(2,1)" after "T(8,128)" is a further tile
        if kind == "T":
            tiles.append(tuple(None if a.strip() == "*" else int(a) for a in args.split(",") if a.strip()))
        elif kind == "E":
            element_bits = int(args)
        elif kind == "S":
            memory_space = int(args)
        last = kind
    return TiledLayout(minor_to_major, tuple(tiles), element_bits, memory_space)


@dataclasses.dataclass(frozen=True, slots=True)
class Array:
    """One array of a shape: ``f32[64,100]{1,0:T(8,128)}``.

    Attributes:
        dtype: XLA's element type (``f32``, ``bf16``, ``pred``, ``token``).
        dims: the dimensions (a bounded dynamic one, ``<=8``, as its bound; an unbounded
            one, ``?``, as -1).
        layout: the layout when printed (optimized HLO prints one per array).
        dynamic: the indices of the dynamic dimensions.
    """

    dtype: str
    dims: tuple[int, ...]
    layout: TiledLayout | None = None
    dynamic: tuple[int, ...] = ()

    @property
    def elements(self) -> int | None:
        return None if any(d < 0 for d in self.dims) else math.prod(self.dims)

    @property
    def nbytes(self) -> int | None:
        """Elements x element size, in whole bytes (None for an unknown type or an unbounded dimension)."""
        bits, n = ELEMENT_BITS.get(self.dtype), self.elements
        return None if bits is None or n is None else (n * bits + 7) // 8

    def plain(self) -> str:
        """The array without its layout: ``f32[64,100]``."""
        dims = ",".join("?" if d < 0 else f"<={d}" if i in self.dynamic else str(d) for i, d in enumerate(self.dims))
        return f"{self.dtype}[{dims}]"

    def __str__(self) -> str:
        return self.plain() + (str(self.layout) if self.layout is not None else "")


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """An instruction's result: one array, or a tuple of shapes (``(f32[8,16]{1,0}, f32[8]{0})``).

    Attributes:
        text: the shape as XLA printed it.
        arrays: its arrays in order (a nested tuple's flattened).
        is_tuple: it is a tuple (even of one array, or of none).
    """

    text: str
    arrays: tuple[Array, ...]
    is_tuple: bool = False

    @property
    def array(self) -> Array | None:
        """The array, for a shape that is not a tuple."""
        return None if self.is_tuple or len(self.arrays) != 1 else self.arrays[0]

    @property
    def nbytes(self) -> int:
        """Bytes of all its arrays (those of a known size)."""
        return sum(a.nbytes or 0 for a in self.arrays)

    def plain(self) -> str:
        """The shape without layouts: ``(f32[8,16], f32[8])``."""
        return _LAYOUT.sub("", self.text).strip()

    def __str__(self) -> str:
        return self.text


_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_LAYOUT = re.compile(r"(?<=\])\{[^{}]*\}")


def _array(dtype: str, dims_text: str, layout_text: str | None) -> Array:
    dims, dynamic = [], []
    for i, d in enumerate(x.strip() for x in dims_text.split(",") if x.strip()):
        if d.startswith("<="):
            dynamic.append(i)
            d = d[2:]
        elif d == "?":
            dynamic.append(i)
            d = "-1"
        dims.append(int(d))
    return Array(dtype, tuple(dims), parse_layout(layout_text) if layout_text else None, tuple(dynamic))


@functools.lru_cache(maxsize=4096)
def parse_shape(text: str) -> Shape:
    """Read an HLO shape: ``f32[8,16]{1,0}``, ``(f32[8]{0}, (s32[], u32[]{:S(2)}))``, ``pred[]``.

    Example:
        >>> s = parse_shape("(f32[2,3]{1,0}, bf16[4]{0:T(256)})")
        >>> [(a.dtype, a.dims, a.nbytes) for a in s.arrays], s.is_tuple, s.plain()
        ([('f32', (2, 3), 24), ('bf16', (4,), 8)], True, '(f32[2,3], bf16[4])')
    """
    text = text.strip()
    arrays = tuple(_array(*m.groups()) for m in _ARRAY.finditer(text))
    return Shape(text, arrays, text.startswith("("))


# -- replica groups, permutation pairs, shardings ------------------------------------------------


def _iota(reshape: tuple[int, ...], perm: tuple[int, ...]) -> list[int]:
    """XLA's iota tile assignment ``<=[reshape]T(perm)``, flattened: ``0..n-1`` laid out in the
    shape ``reshape`` (row-major), transposed by ``perm``, read in row-major order."""
    strides = [math.prod(reshape[i + 1:]) for i in range(len(reshape))]
    ranges = [range(reshape[p]) for p in perm]
    return [sum(i * strides[p] for i, p in zip(index, perm)) for index in itertools.product(*ranges)]


def _chunks(values: list[int], size: int) -> tuple[tuple[int, ...], ...]:
    size = max(size, 1)
    return tuple(tuple(values[i:i + size]) for i in range(0, len(values), size))


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """The devices that talk in a collective, read from any of the forms XLA prints.

    ``{{0,1,2,3},{4,5,6,7}}`` lists the groups; ``[2,4]<=[8]`` is an iota reshaped to
    2 groups of 4 (``[2,4]<=[4,2]T(1,0)``: the iota laid out as [4,2] and transposed first,
    so the groups are {0,2,4,6} and {1,3,5,7}); ``mesh['x'=2,'y'=4] {'y'}`` groups the devices
    of a mesh that differ only along the named axes (the mesh's devices in the order its
    ``device_ids=`` gives, when printed). ``{}`` is one group of every device.

    Attributes:
        text: the groups as printed.
        form: ``"list"``, ``"iota"``, ``"mesh"``, or ``"unknown"`` (a form this reader does
            not know: then one group of every device is assumed).
        groups: each group's device ids, in XLA's order; empty for ``{}`` and unknown forms.
    """

    text: str
    form: str
    groups: tuple[tuple[int, ...], ...] = ()

    def resolved(self, devices: int) -> tuple[tuple[int, ...], ...]:
        """The groups, ``{}`` taken as one group of the module's ``devices``."""
        return self.groups or (tuple(range(devices)),)

    def size(self, devices: int) -> int:
        """Devices in each group (the first group's count)."""
        return max(len(self.groups[0]), 1) if self.groups else max(devices, 1)

    def count(self, devices: int) -> int:
        """How many groups run side by side."""
        return len(self.groups) if self.groups else 1


_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(r"mesh\[([^\]]*)\](?:,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}")
_DEVICE_IOTA = re.compile(r"\[([\d,]+)\](?:T\(([\d,]+)\))?")
_AXIS = re.compile(r"'?([^'=,\s]+)'?=(\d+)")
_AXIS_REF = re.compile(r"'?([^':,\s]+)'?(?::\((\d+)\)(\d+))?")


def _iota_groups(m: re.Match) -> tuple[tuple[int, ...], ...]:
    dims, reshape = _ints(m.group(1)), _ints(m.group(2))
    perm = _ints(m.group(3)) if m.group(3) else tuple(range(len(reshape)))
    return _chunks(_iota(reshape, perm), dims[-1])


def _mesh_groups(m: re.Match) -> tuple[tuple[int, ...], ...]:
    """XLA's mesh-axes groups: each mesh axis split where the named (sub-)axes cut it, the named
    parts moved last in the order named, the devices then read in groups of their size."""
    axes = [(name, int(size)) for name, size in _AXIS.findall(m.group(1))]
    index = {name: i for i, (name, _) in enumerate(axes)}
    refs = [(name, int(pre) if pre else 1, int(size) if size else None)
            for name, pre, size in _AXIS_REF.findall(m.group(3)) if name]
    parts: list[list[int]] = []  # per mesh axis, the sizes it is split into (major first)
    named: dict[tuple[str, int], int] = {}  # (axis, pre size) -> position in the flattened split
    flat = 0
    for name, full in axes:
        cuts = sorted((pre, size or full) for ref, pre, size in refs if ref == name)
        sizes, prefix = [], 1
        for pre, size in cuts:
            if pre != prefix:
                sizes.append(pre // prefix)
                prefix = pre
            named[(name, pre)] = flat + len(sizes)
            sizes.append(size)
            prefix *= size
        if prefix != full or not sizes:
            sizes.append(full // prefix)
        parts.append(sizes)
        flat += len(sizes)
    if any(name not in index for name, _, _ in refs):
        return ()
    grouped = [named[(name, pre)] for name, pre, _ in refs]
    reshape = tuple(s for sizes in parts for s in sizes)
    perm = tuple([i for i in range(len(reshape)) if i not in grouped] + grouped)
    order = _iota(reshape, perm)
    ids = _device_ids(m.group(2)) if m.group(2) else None
    values = [ids[i] for i in order] if ids and len(ids) == len(order) else order
    return _chunks(values, math.prod(reshape[g] for g in grouped))


def _device_ids(text: str) -> tuple[int, ...]:
    """A mesh's device order, row-major: listed, or an iota ``[2,2,2]T(0,2,1)`` (laid out as
    [2,2,2], transposed, read in order)."""
    m = _DEVICE_IOTA.fullmatch(text.strip())
    if m is None:
        return _ints(text)
    reshape = _ints(m.group(1))
    return tuple(_iota(reshape, _ints(m.group(2)) if m.group(2) else tuple(range(len(reshape)))))


@functools.lru_cache(maxsize=1024)
def parse_replica_groups(text: str) -> ReplicaGroups:
    """Read a ``replica_groups=`` value (the text after the ``=``; trailing attributes are ignored).

    Example:
        >>> parse_replica_groups("[2,4]<=[4,2]T(1,0)").groups
        ((0, 2, 4, 6), (1, 3, 5, 7))
        >>> parse_replica_groups("mesh['x'=2,'y'=4] {'x'}").groups
        ((0, 4), (1, 5), (2, 6), (3, 7))
    """
    text = text.strip()
    if text.startswith("{"):
        text = braced(text)
        inner = _split_top(text[1:-1]) if len(text) > 2 else []
        groups = tuple(_ints(g) for g in inner if g.strip())
        return ReplicaGroups(text, "list", groups)
    m = _IOTA.match(text)
    if m:
        return ReplicaGroups(m.group(0), "iota", _iota_groups(m))
    m = _MESH.match(text)
    if m:
        return ReplicaGroups(m.group(0), "mesh", _mesh_groups(m))
    return ReplicaGroups(text.split(",", 1)[0], "unknown")


def _pairs(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((p[0], p[1]) for p in (_ints(x) for x in _split_top(braced(text)[1:-1])) if len(p) == 2)


@dataclasses.dataclass(frozen=True, slots=True)
class Sharding:
    """An HLO sharding: ``{devices=[2,1,4]<=[8] last_tile_dim_replicate}``, ``{replicated}``,
    ``{maximal device=0}``, ``{manual}``, or a tuple of them.

    Attributes:
        text: as printed.
        kind: ``"tiled"``, ``"replicated"``, ``"maximal"``, ``"manual"``, ``"tuple"`` or
            ``"unknown"``.
        tiles: a tiled sharding's tile-assignment dimensions (``(2, 1, 4)``).
        devices: the device of each tile, row-major (the maximal device for ``maximal``).
        last_tile_dims: what the trailing tile dimensions that split no data stand for
            (``("replicated",)`` for ``last_tile_dim_replicate``).
        elements: a tuple sharding's shardings.
    """

    text: str
    kind: str
    tiles: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    last_tile_dims: tuple[str, ...] = ()
    elements: tuple[Sharding, ...] = ()

    @property
    def data_tiles(self) -> tuple[int, ...]:
        """How many ways each data dimension is split (the trailing replicated/manual dims left out)."""
        return self.tiles[: len(self.tiles) - len(self.last_tile_dims)]


_DEVICES = re.compile(r"devices=\[([\d,]+)\]")


def _tiled(text: str, body: str, at: re.Match) -> Sharding:
    tiles = _ints(at.group(1))
    rest = body[at.end():]
    iota = _IOTA.match("[" + at.group(1) + "]" + rest)
    if iota:
        perm = _ints(iota.group(3)) if iota.group(3) else tuple(range(len(_ints(iota.group(2)))))
        devices = tuple(_iota(_ints(iota.group(2)), perm))
    else:
        devices = _ints(re.match(r"[\d,\s]*", rest).group())
    last: tuple[str, ...] = ()
    if "last_tile_dim_replicate" in rest:
        last = ("replicated",)
    elif (where := rest.find("last_tile_dims=")) >= 0:
        last = tuple(x.strip() for x in braced(rest, where + len("last_tile_dims="))[1:-1].split(","))
    return Sharding(text, "tiled", tiles, devices, last)


@functools.lru_cache(maxsize=1024)
def parse_sharding(text: str) -> Sharding:
    """Read a sharding (``{...}``, the value of ``sharding=``).

    Example:
        >>> s = parse_sharding("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}")
        >>> s.tiles, s.data_tiles, s.devices
        ((2, 1, 4), (2, 1), (0, 2, 4, 6, 1, 3, 5, 7))
    """
    text = braced(text.strip()) if text.strip().startswith("{") else text.strip()
    body = text[1:-1].strip() if text.startswith("{") else text
    if body.startswith("{"):
        return Sharding(text, "tuple", elements=tuple(parse_sharding(p) for p in _split_top(body) if p.strip()))
    at = _DEVICES.search(body)
    if at is not None:
        return _tiled(text, body, at)
    for kind in ("replicated", "maximal", "manual"):
        if body.startswith(kind):
            device = _ints(body.partition("device=")[2][:12]) if kind == "maximal" else ()
            return Sharding(text, kind, devices=device[:1])
    return Sharding(text, "unknown")


# -- metadata ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Metadata:
    """An instruction's ``metadata={...}``: where it came from.

    Attributes:
        op_name: the JAX name stack (``jit(fn)/mm_1|aten::mm.default/dot_general``: the
            runtime's named scopes, then the JAX primitive), ``""`` when none.
        op_type: the primitive's type, when printed.
        source_file, source_line: the Python line that traced it, when printed.
        stack_frame_id: its entry in the module's stack-frame tables (0: none).
    """

    op_name: str = ""
    op_type: str = ""
    source_file: str = ""
    source_line: int = 0
    stack_frame_id: int = 0

    @property
    def scope(self) -> tuple[str, str]:
        """(FX node(s), aten op) of the runtime's scopes in ``op_name`` (see :func:`scope_parts`)."""
        return scope_parts(self.op_name)


_META_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')
_NO_METADATA = Metadata()


@functools.lru_cache(maxsize=8192)
def _metadata(text: str) -> Metadata:
    found = {k: v[1:-1] if v.startswith('"') else v for k, v in _META_FIELD.findall(text)}
    line, frame = found.get("source_line", "0"), found.get("stack_frame_id", "0")
    return Metadata(found.get("op_name", ""), found.get("op_type", ""), found.get("source_file", ""),
                    int(line) if line.lstrip("-").isdigit() else 0, int(frame) if frame.isdigit() else 0)


_NODE_OP = re.compile(r"([\w.]+)\|(aten::[\w.]+)")
_ATEN = re.compile(r"aten::[\w.]+")


def scope_parts(op_name: str) -> tuple[str, str]:
    """(FX node(s), aten op) named by a scope path.

    The runtime runs each FX node of a compiled graph in the scope ``<node>|<aten op>`` and
    each eager op in ``<aten op>``: ``jit(fn)/mm_1|aten::mm.default/dot_general`` is node
    ``mm_1`` of op ``aten::mm.default``; ``jit(f)/aten::add.Tensor/add`` op ``aten::add.Tensor``.
    XLA joins the scopes of instructions it combined,
    ``jit(fn)/(mm_2|aten::mm.default/dot_general:mm_1|aten::mm.default/dot_general)``: their
    nodes are listed, comma-separated, in that order, and the op is the first one's.
    """
    found = _NODE_OP.findall(op_name)
    if found:
        return ",".join(dict.fromkeys(n for n, _ in found)), found[0][1]
    op = _ATEN.search(op_name)
    return "", op.group(0) if op else ""


# -- instructions --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction: ``%name = <shape> <opcode>(<operands>), key=value, ...``.

    Attributes:
        name: its name, without ``%``.
        opcode: ``add``, ``fusion``, ``all-reduce-start``...
        shape: its result.
        operands: the names of the instructions it reads, in order.
        attributes: ``(key, value)`` of what follows the operands, values as printed
            (``("replica_groups", "{{0,1},{2,3}}")``).
        computation: the computation holding it (``""`` for one read on its own).
        is_root: it is its computation's ``ROOT``.
        line: its line in the module's text (0-based; -1 for one read on its own).
        literal: what a ``parameter`` or ``constant`` holds between its parentheses
            (``"0"`` for ``parameter(0)``).
    """

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...] = ()
    attributes: tuple[tuple[str, str], ...] = ()
    computation: str = ""
    is_root: bool = False
    line: int = -1
    literal: str = ""

    @property
    def parameter_number(self) -> int | None:
        """A ``parameter``'s index among its computation's parameters."""
        return int(self.literal) if self.opcode == "parameter" and self.literal.isdigit() else None

    def attr(self, key: str) -> str | None:
        """The value of attribute ``key`` as printed (None when absent)."""
        return next((v for k, v in self.attributes if k == key), None)

    @property
    def metadata(self) -> Metadata:
        text = self.attr("metadata")
        return _metadata(text) if text else _NO_METADATA

    @property
    def replica_groups(self) -> ReplicaGroups | None:
        text = self.attr("replica_groups")
        return None if text is None else parse_replica_groups(text)

    @property
    def source_target_pairs(self) -> tuple[tuple[int, int], ...] | None:
        """A permute's (source, target) device pairs."""
        text = self.attr("source_target_pairs")
        return None if text is None else _pairs(text)

    @property
    def sharding(self) -> Sharding | None:
        text = self.attr("sharding")
        return None if text is None else parse_sharding(text)

    @property
    def channel_id(self) -> int | None:
        text = self.attr("channel_id")
        return int(text) if text and text.isdigit() else None

    @property
    def called(self) -> tuple[str, ...]:
        """The computations it calls (a fusion's body, a reduction's combiner, a loop's body
        and condition, a conditional's branches...), in the order printed."""
        out: list[str] = []
        for key, value in self.attributes:
            if key in _CALLING:
                out.extend(n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip())
        return tuple(out)

    def ints(self, key: str) -> tuple[int, ...]:
        """The integers of attribute ``key`` (``dimensions={0,2}`` -> ``(0, 2)``; () when absent)."""
        text = self.attr(key)
        return _ints(text) if text else ()


# opcodes whose operands are literals, not instructions
_LITERAL_OPERANDS = ("constant", "parameter")
_NAME = re.compile(r"[\w.\-]+")
_OPCODE = re.compile(r"[a-z][\w\-]*")
_COMMENT = re.compile(r"/\*.*?\*/")  # "/*index=5*/%x": XLA numbers the operands of long lists


def _operand_names(opcode: str, text: str) -> tuple[str, ...]:
    if opcode in _LITERAL_OPERANDS or not text.strip():
        return ()
    names = []
    for piece in _split_top(text):
        piece = _COMMENT.sub("", piece).strip()
        last = piece.rsplit(" ", 1)[-1].lstrip("%")  # "f32[] %x" when shapes are printed
        if _NAME.fullmatch(last) and not last.lstrip("-").isdigit():
            names.append(last)
    return tuple(names)


# where an attribute starts, as XLA prints them: ", key=" (no value holds one outside a string)
_ATTRIBUTE_START = re.compile(r",\s*(?=[A-Za-z_][\w.]*=)")


def _balanced(piece: str) -> bool:
    return (piece.count("{") == piece.count("}") and piece.count("[") == piece.count("]")
            and piece.count("(") == piece.count(")") and piece.count('"') % 2 == 0)


def _attributes(text: str) -> tuple[tuple[str, str], ...]:
    """``, key=value, key={...}`` (after the operands) as pairs; a braced value stops where it closes."""
    pieces = _ATTRIBUTE_START.split(text)
    if not all(map(_balanced, pieces)):  # a cut inside a string or a bracket: cut exactly instead
        pieces = _split_top(text)
    out: list[tuple[str, str]] = []
    for piece in pieces:
        key, eq, value = piece.strip().partition("=")
        if not eq or not key.replace("_", "").replace(".", "").isalnum():
            continue
        if key == "device_ids" and out and out[-1][1].startswith("mesh["):
            # mesh replica groups print their device order after a comma of their own:
            # replica_groups=mesh['a'=4,'b'=2], device_ids=([2,2,2]T(0,2,1)) {'a'}
            out[-1] = (out[-1][0], f"{out[-1][1]}, {piece.strip()}")
            continue
        out.append((key, value.strip()))
    if out and out[-1][1].startswith("{") and not out[-1][1].endswith("}"):  # a log line's sentence after it
        out[-1] = (out[-1][0], braced(out[-1][1]))
    return tuple(out)


def _definition(line: str) -> tuple[str, str, str, str, str, bool] | None:
    """(name, shape text, opcode, operands text, attributes text, is root) of one instruction line."""
    text = line.strip()
    root = text.startswith("ROOT ")
    if root:
        text = text[5:].lstrip()
    name, eq, rest = text.partition(" = ")
    name = name.strip().lstrip("%")
    if not eq or not _NAME.fullmatch(name):
        return None
    rest = rest.lstrip()
    if rest.startswith("("):
        end = _closing(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode, paren, rest = rest.partition("(")
    if not paren or not _OPCODE.fullmatch(opcode):
        return None
    end = _closing("(" + rest, 0) - 1  # just past the operands' ")" in ``rest``
    if end > len(rest) - 1 and not rest.endswith(")"):  # an unclosed list: a line cut short
        return name, shape, opcode, rest, "", root
    return name, shape, opcode, rest[: end - 1], rest[end:], root


def parse_instruction(line: str, computation: str = "", number: int = -1) -> Instruction | None:
    """Read one instruction (a line of a module, or one quoted in a log), None if it is not one.

    Example:
        >>> i = parse_instruction('  %ar = f32[8]{0} all-reduce(%x), replica_groups=[2,4]<=[8], '
        ...                       'metadata={op_name="jit(f)/psum"}')
        >>> i.name, i.opcode, i.operands, i.replica_groups.groups, i.metadata.op_name
        ('ar', 'all-reduce', ('x',), ((0, 1, 2, 3), (4, 5, 6, 7)), 'jit(f)/psum')
    """
    found = _definition(line)
    if found is None:
        return None
    name, shape, opcode, operands, attributes, root = found
    literal = operands.strip() if opcode in _LITERAL_OPERANDS else ""
    return Instruction(name, opcode, parse_shape(shape), _operand_names(opcode, operands), _attributes(attributes),
                       computation, root, number, literal)


def instruction_name(line: str) -> str | None:
    """The name an instruction line defines (None for any other line)."""
    found = _definition(line) if " = " in line else None
    return found[0] if found else None


def stack_allocation(message: str) -> str | None:
    """The instruction a scoped-VMEM refusal names (``allocating on stack for %kernel.3 = ...``),
    None when ``message`` names none that way."""
    _, found, rest = message.partition("allocating on stack for ")
    return instruction_name(rest) if found else None


# -- computations and modules --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Computation:
    """One computation: its instructions in text order.

    Attributes:
        name: its name, without ``%``.
        is_entry: it is the ``ENTRY`` computation (what the program runs).
        instructions: in text order.
        line: its header's line in the module's text (0-based).
    """

    name: str
    is_entry: bool
    instructions: tuple[Instruction, ...]
    line: int = -1
    by_name: Mapping[str, Instruction] = dataclasses.field(default_factory=_empty, repr=False)

    def get(self, name: str) -> Instruction | None:
        return self.by_name.get(name)

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.is_root), self.instructions[-1] if self.instructions else None)


@dataclasses.dataclass(frozen=True, slots=True)
class StackTables:
    """The module's ``FileNames``, ``FunctionNames``, ``FileLocations`` and ``StackFrames``:
    id -> file, id -> function, id -> (file id, function id, line), id -> (location id, parent)."""

    files: Mapping[int, str] = dataclasses.field(default_factory=_empty)
    functions: Mapping[int, str] = dataclasses.field(default_factory=_empty)
    locations: Mapping[int, tuple[int, int, int]] = dataclasses.field(default_factory=_empty)
    frames: Mapping[int, tuple[int, int]] = dataclasses.field(default_factory=_empty)

    def stack(self, frame_id: int) -> tuple[tuple[str, int, str], ...]:
        """The Python stack of a ``stack_frame_id``, innermost frame first, as (file, line, function).

        A frame's ``parent_frame_id`` is printed one above the parent's own id (0, printed as 1,
        is the root's "no parent"), as jaxlib 0.10 prints it.
        """
        out, seen = [], set()
        while frame_id in self.frames and frame_id not in seen:
            seen.add(frame_id)
            location, parent = self.frames[frame_id]
            loc = self.locations.get(location)
            if loc is not None:
                out.append((self.files.get(loc[0], "?"), loc[2], self.functions.get(loc[1], "?")))
            frame_id = parent - 1
        return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Module:
    """A module's text, read: its header, computations and stack-frame tables.

    Attributes:
        name: the module's name (``jit_fn``).
        attributes: the header's ``(key, value)`` pairs (``num_partitions``, ``is_scheduled``...).
        computations: in text order.
        tables: the stack-frame tables metadata's ``stack_frame_id`` points into.
        text: the text it was read from.
    """

    name: str
    attributes: tuple[tuple[str, str], ...]
    computations: tuple[Computation, ...]
    tables: StackTables = dataclasses.field(default_factory=lambda: StackTables())
    text: str = dataclasses.field(repr=False, default="")
    by_name: Mapping[str, Computation] = dataclasses.field(default_factory=_empty, repr=False)

    @property
    def entry(self) -> Computation | None:
        return next((c for c in self.computations if c.is_entry), None)

    def computation(self, name: str) -> Computation | None:
        return self.by_name.get(name)

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction of every computation, in text order."""
        for c in self.computations:
            yield from c.instructions

    @property
    def devices(self) -> int:
        """Devices it runs on: its partitions times its replicas (1 for a one-device program)."""
        return _devices(self.attributes)

    def stack(self, frame_id: int) -> tuple[tuple[str, int, str], ...]:
        """The Python stack of a ``stack_frame_id`` (see :meth:`StackTables.stack`)."""
        return self.tables.stack(frame_id)


def _devices(attributes: tuple[tuple[str, str], ...]) -> int:
    found = dict(attributes)
    partitions, replicas = found.get("num_partitions", "1"), found.get("replica_count", "1")
    return (int(partitions) if partitions.isdigit() else 1) * (int(replicas) if replicas.isdigit() else 1)


_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_TABLE_FIELD = re.compile(r"(\w+)=(-?\d+)")


def _tables(rows: dict[str, dict[int, str]]) -> StackTables:
    def fields(text: str, *keys: str) -> tuple[int, ...]:
        found = dict(_TABLE_FIELD.findall(text))
        return tuple(int(found.get(k, 0)) for k in keys)

    return StackTables(
        MappingProxyType({k: v.strip().strip('"') for k, v in rows.get("FileNames", {}).items()}),
        MappingProxyType({k: v.strip().strip('"') for k, v in rows.get("FunctionNames", {}).items()}),
        MappingProxyType({k: fields(v, "file_name_id", "function_name_id", "line")
                          for k, v in rows.get("FileLocations", {}).items()}),
        MappingProxyType({k: fields(v, "file_location_id", "parent_frame_id")
                          for k, v in rows.get("StackFrames", {}).items()}),
    )


def _header(line: str) -> tuple[str, bool] | None:
    """(name, is entry) of a computation's header line: ``[ENTRY ]%name (...) -> ... {``."""
    text = line.rstrip()
    if not text.endswith("{") or text[:1].isdigit():
        return None
    entry = text.startswith("ENTRY ")
    name = (text[6:] if entry else text).lstrip().split(" ", 1)[0].split("(", 1)[0].lstrip("%")
    return (name, entry) if _NAME.fullmatch(name) else None


def _computation(head: tuple[str, bool, int], body: list[Instruction]) -> Computation:
    return Computation(head[0], head[1], tuple(body), head[2], MappingProxyType({i.name: i for i in body}))


def _open_braces(line: str) -> int:
    """Braces ``line`` opens and does not close, outside quoted strings."""
    if line.count("{") == line.count("}"):
        return 0  # the usual line: balanced whatever its strings hold
    depth, quoted, escaped = 0, False, False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif not quoted:
            depth += (ch == "{") - (ch == "}")
    return depth


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number, text) of each line, an instruction printed over several lines joined into one:
    a Pallas kernel's custom call prints its kernel metadata as a JSON object with newlines,
    whose continuation lines start at column 0 (one of them with ``}``, as a computation's end)."""
    pending: list[str] = []
    start = depth = 0
    for number, line in enumerate(text.splitlines()):
        if pending:
            pending.append(line)
            depth += _open_braces(line)
            if depth <= 0:
                yield start, "".join(pending)
                pending = []
            continue
        if line[:1] in (" ", "\t") and (opened := _open_braces(line)) > 0:
            pending, start, depth = [line], number, opened
            continue
        yield number, line
    if pending:
        yield start, "".join(pending)


def _read(text: str) -> Module:
    name, attributes, computations = "", (), []
    rows: dict[str, dict[int, str]] = {}
    table = head = None
    body: list[Instruction] = []
    for number, line in _logical_lines(text):
        if not line.strip():
            table = None
            continue
        if line[0] not in " \t":
            if line.startswith("HloModule"):
                first, _, rest = line[len("HloModule"):].strip().partition(",")
                name, attributes = first.strip(), _attributes(rest)
            elif line in _TABLES:
                table = line
                rows[table] = {}
            elif table is not None and line.split(" ", 1)[0].isdigit():
                key, _, rest = line.partition(" ")
                rows[table][int(key)] = rest
            elif line.startswith("}") and head is not None:
                computations.append(_computation(head, body))
                head, body = None, []
            elif (found := _header(line)) is not None:
                head, body, table = (*found, number), [], None
            continue
        if head is not None and (ins := parse_instruction(line, head[0], number)) is not None:
            body.append(ins)
    if head is not None:  # text cut after a computation's last instruction (an excerpt)
        computations.append(_computation(head, body))
    return Module(name, attributes, tuple(computations), _tables(rows), text,
                  MappingProxyType({c.name: c for c in computations}))


@functools.lru_cache(maxsize=4)
def parse_module(text: str) -> Module:
    """Read a module's text (``compiled.as_text()``): everything this reader knows, once.

    The last four modules read are kept (about four times their text's size each): the
    tracers, the roofline and ``fit`` read the same program's text several times in a row
    (``fit`` eight times per compiled step). A line that is not HLO is skipped.

    Example:
        >>> m = parse_module("HloModule m, num_partitions=2\\n\\nENTRY %e (p: f32[2]) -> f32[2] {\\n"
        ...                  "  ROOT %p = f32[2]{0} parameter(0)\\n}\\n")
        >>> m.devices, m.entry.name, [(i.name, i.opcode, str(i.shape)) for i in m.instructions()]
        (2, 'e', [('p', 'parameter', 'f32[2]{0}')])
    """
    return _read(text)


def module_devices(hlo: str) -> int:
    """Devices a module's text runs on: partitions times replicas, from its header line alone."""
    head = hlo.split("\n", 1)[0]
    return _devices(_attributes(head.partition(",")[2])) if head.startswith("HloModule") else 1


# -- what instructions compute -------------------------------------------------------------------


def matmul_flops(ins: Instruction, computation: Computation) -> float | None:
    """2 x output elements x contracted elements of a ``dot`` or ``convolution`` (None when the
    shapes are not known)."""
    out = ins.shape.array
    lhs = computation.get(ins.operands[0]) if ins.operands else None
    lhs_array = lhs.shape.array if lhs is not None else None
    if out is None or lhs_array is None or out.elements is None:
        return None
    lhs_dims = lhs_array.dims
    if ins.opcode == "dot":
        k = math.prod(lhs_dims[d] for d in ins.ints("lhs_contracting_dims") if d < len(lhs_dims))
        return 2.0 * out.elements * k
    labels = (ins.attr("dim_labels") or "").split("_", 1)[0]
    if "f" not in labels or labels.index("f") >= len(lhs_dims):
        return None
    window = re.search(r"\bsize=([\dx]+)", ins.attr("window") or "")
    taps = math.prod(int(s) for s in window.group(1).split("x")) if window else 1
    groups = ins.ints("feature_group_count")
    features = lhs_dims[labels.index("f")] // (groups[0] if groups else 1)
    return 2.0 * out.elements * features * taps


# -- colouring for display -----------------------------------------------------------------------

# token kinds of HLO and StableHLO lines, for a viewer to colour; a later rule wins where two overlap
_TOKEN_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("keyword", re.compile(r"\b(?:HloModule|ENTRY|ROOT|module|func\.func|return|attributes)\b")),
    ("opcode", re.compile(r"(?<=[\s=(])[a-z][\w\-]*(?=\()")),  # add(, fusion(
    ("opcode", re.compile(r"\bstablehlo\.[\w.]+|\bchlo\.[\w.]+|\bmhlo\.[\w.]+")),
    ("shape", re.compile(r"\b(?:pred|token|s2|s4|s8|s16|s32|s64|u2|u4|u8|u16|u32|u64|f8\w*|f16|bf16|f32|f64|c64"
                         r"|c128)\[[\d,]*\](?:\{[\d,:A-Z()]*\})?")),
    ("shape", re.compile(r"\btensor<[^>]*>")),
    ("name", re.compile(r"%[\w.\-]+|@[\w.\-]+")),
    ("attribute", re.compile(r"\b(?:metadata|backend_config|frontend_attributes)=\{.*?\}(?=,\s|$)")),
    ("string", re.compile(r'"(?:[^"\\]|\\.)*"')),
)


def tokens(line: str) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) of the tokens of one HLO or StableHLO line worth colouring, in the
    order to apply them: ``keyword``, ``opcode``, ``shape``, ``name``, ``attribute``, ``string``."""
    for kind, pattern in _TOKEN_RULES:
        for m in pattern.finditer(line):
            yield kind, m.start(), m.end()


# the serialized MLIR of a Pallas kernel, in its custom call's backend config
_KERNEL_BODY = re.compile(r'"body":"([A-Za-z0-9+/=]+)"')


def kernel_calls(text: str) -> list[tuple[str, str]]:
    """(name, base64 of its serialized MLIR, "" when the config holds none) of each Pallas
    kernel's custom call (``custom_call_target="tpu_custom_call"``) of a module's text."""
    out = []
    for inst in parse_module(text).instructions():
        if inst.opcode == "custom-call" and inst.attr("custom_call_target") == '"tpu_custom_call"':
            body = _KERNEL_BODY.search(inst.attr("backend_config") or "")
            out.append((inst.name, body.group(1) if body else ""))
    return out
