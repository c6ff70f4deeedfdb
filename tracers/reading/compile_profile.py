"""A run's compile time by source line as a pprof profile (``pprof -top``, ``pprof -http``, and
the viewers that read Google's ``profile.proto``, as JAX's equation profiles are read).

One sample per line of :func:`~tpu_debug.tracers.reading.compile_time.compile_time`'s
``lines``, with three values: the compile time estimated for the line (nanoseconds), the
StableHLO operations and the optimized HLO instructions counted for it. Its location is
the line, its function the user's function there; what no line is known for is the
function ``(no source line)``. The samples add up to the run's compile time and HLO
counts, as ``compiles.lines`` in the report's JSON does. Written with plain bytes
(gzipped protobuf), no generated classes.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from tpu_debug.tracers.reading.compile_time import LINES_METHOD, CompileTime, LineTime, compile_time
from tpu_debug.tracers.reading.view import RunView

__all__ = ["NO_LINE", "SAMPLE_TYPES", "compile_profile", "write_compile_profile"]

#: the function of the sample that holds what no source line is known for
NO_LINE = "(no source line)"
#: (type, unit) of each sample value, in order
SAMPLE_TYPES = (("compile_time", "nanoseconds"), ("hlo_before", "count"), ("hlo_after", "count"))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields write a negative number in two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _packed(number: int, values: list[int]) -> bytes:
    return _bytes(number, b"".join(_varint(v) for v in values)) if values else b""


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))


def nanoseconds(line: LineTime) -> int:
    """A line's compile time as the profile holds it."""
    return round(line.seconds * 1e9)


def compile_profile(ct: CompileTime) -> bytes:
    """The gzipped pprof ``Profile`` of ``ct``'s lines (see the module's docstring)."""
    strings = _Strings()
    # Profile: sample_type = 1, sample = 2, location = 4, function = 5, string_table = 6,
    # comment = 13, default_sample_type = 14. ValueType: type = 1, unit = 2.
    body = b"".join(_bytes(1, _int(1, strings(t)) + _int(2, strings(u))) for t, u in SAMPLE_TYPES)
    functions: dict[tuple[str, str], int] = {}
    locations: dict[tuple[str, str, int], int] = {}
    function_msgs, location_msgs, samples = [], [], []
    for line in ct.lines:
        file = line.file or ""
        name = line.function if line.file is not None and line.function else NO_LINE
        fid = functions.get((file, name))
        if fid is None:
            fid = functions[(file, name)] = len(functions) + 1
            # Function: id = 1, name = 2, system_name = 3, filename = 4
            function_msgs.append(_bytes(5, _int(1, fid) + _int(2, strings(name)) + _int(3, strings(name))
                                        + _int(4, strings(file))))
        place = (file, name, line.line or 0)
        lid = locations.get(place)
        if lid is None:
            lid = locations[place] = len(locations) + 1
            # Location: id = 1, line = 4 (Line: function_id = 1, line = 2)
            location_msgs.append(_bytes(4, _int(1, lid) + _bytes(4, _int(1, fid) + _int(2, line.line or 0))))
        # Sample: location_id = 1, value = 2 (both packed)
        samples.append(_bytes(2, _packed(1, [lid]) + _packed(2, [nanoseconds(line), line.hlo_before,
                                                                 line.hlo_after])))
    comment = strings(f"tpu_debug compile time by source line; {LINES_METHOD}")
    body += b"".join(samples) + b"".join(location_msgs) + b"".join(function_msgs)
    body += b"".join(_bytes(6, s.encode()) for s in strings.index)
    body += _packed(13, [comment]) + _int(14, strings(SAMPLE_TYPES[0][0]))
    return gzip.compress(body, mtime=0)


def write_compile_profile(session: RunView, path: Path | str) -> Path:
    """Write the run's compile profile (gzipped pprof) to ``path``.

    Example::

        write_compile_profile(tpu_debug.open_run(), "compile.pb.gz")
        # then: pprof -top compile.pb.gz
    """
    path = Path(path)
    path.write_bytes(compile_profile(compile_time(session)))
    return path
