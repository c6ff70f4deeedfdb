"""XPlane profiles (what xprof reads) written and extended without their generated protobuf classes.

The TensorBoard exporter (``tracers/recording/tensorboard_exporter.py``) captures a run's
profile; this module reads its start time, adds planes to it (the TPU target's memory as a
counter track, the target's programs as HLO protos for xprof's memory viewer), and writes a
multi-process run's c10d collectives as one row per rank (``tpu-debug tensorboard``). Plain
bytes: no torch, no jax, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from pathlib import Path
from typing import Any

__all__ = [
    "PROGRAMS_FILE",
    "RANK_PLANE",
    "TENSORBOARD_DIR",
    "RankSpan",
    "counter_plane",
    "profile_files",
    "profile_start",
    "span_plane",
    "write_programs",
    "write_rank_spans",
]

TENSORBOARD_DIR = "tensorboard"  # inside the run directory
_COUNTER_LINE = "_counters_"


def profile_files(logdir: Path | str) -> list[Path]:
    """The ``.xplane.pb`` files of the profiles under ``logdir``, oldest session first."""
    root = Path(logdir) / "plugins" / "profile"
    if not root.is_dir():
        return []
    return sorted(root.rglob("*.xplane.pb"))


# event_metadata = 4 (map<int64, XEventMetadata>), stat_metadata = 5, stats = 6 };
# XLine { id = 1, name = 2, timestamp_ns = 3, events = 4 }; XEvent { metadata_id = 1,
# offset_ps = 2, stats = 4 }; XStat { metadata_id = 1, double_value = 2, uint64_value = 3,
# int64_value = 4 }; X*Metadata { id = 1, name = 2 }. The profiler stores times relative
# to the stat "profile_start_time" of its "Task Environment" plane (wall-clock ns).


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes):
    """(field number, wire type, value) of each field of one message."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 2:
            n, i = _read_varint(data, i)
            value, i = data[i : i + n], i + n
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        yield number, wire, value


def profile_start(data: bytes) -> tuple[int | None, list[int]]:
    """The profile's start time (wall-clock ns) and the ids of its planes."""
    start = None
    ids = []
    for number, _wire, plane in _fields(data):
        if number != 1:
            continue
        fields = list(_fields(plane))
        ids += [v for n, w, v in fields if n == 1 and w == 0]
        if not any(n == 2 and v == b"Task Environment" for n, _, v in fields):
            continue
        names = {}
        for n, _, entry in fields:
            if n == 5:  # stat_metadata map entry: key = 1, value = 2
                parts = {k: v for k, _, v in _fields(entry)}
                meta = {k: v for k, _, v in _fields(parts.get(2, b""))}
                names[parts.get(1)] = meta.get(2)
        for n, _, stat in fields:
            if n == 6:
                values = {k: v for k, _, v in _fields(stat)}
                if names.get(values.get(1)) == b"profile_start_time":
                    start = values.get(3, values.get(4))
    return start, ids


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _message_field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _double_field(number: int, value: float) -> bytes:
    return _varint((number << 3) | 1) + struct.pack("<d", value)


def counter_plane(plane_id: int, name: str, counter: str, stat: str, samples: list[tuple[int, float]]) -> bytes:
    """An XSpace ``planes`` field holding one counter line: ``samples`` are (ps since the
    profile's start, value)."""
    events = b"".join(
        _message_field(4, _int_field(1, 1) + _int_field(2, ps) + _message_field(4, _int_field(1, 1) + _double_field(2, v)))
        for ps, v in samples
    )
    line = _message_field(3, _int_field(1, 1) + _message_field(2, _COUNTER_LINE.encode()) + _int_field(3, 0) + events)
    event_meta = _message_field(4, _int_field(1, 1) + _message_field(2, _int_field(1, 1) + _message_field(2, counter.encode())))
    stat_meta = _message_field(5, _int_field(1, 1) + _message_field(2, _int_field(1, 1) + _message_field(2, stat.encode())))
    return _message_field(1, _int_field(1, plane_id) + _message_field(2, name.encode()) + line + event_meta + stat_meta)


# -- programs for xprof's memory viewer ----------------------------------------------------

#: the profile file holding the programs a run compiled for its target (in the session's directory)
PROGRAMS_FILE = "tpu_debug_programs.xplane.pb"
# how JAX's profiler keeps a program for xprof: an event metadata of the "/host:metadata" plane
# named "<module>(<program id>)", with the stats "Hlo Proto" (the serialized HloProto) and
# "program_id"; xprof's memory viewer lists the programs by that name
_METADATA_PLANE = "/host:metadata"


def _raw_fields(data: bytes):
    """(field number, the field's bytes, key included) of each field of one message."""
    i = 0
    while i < len(data):
        start = i
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = _read_varint(data, i)
        elif wire == 2:
            n, i = _read_varint(data, i)
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        yield key >> 3, data[start:i]


def _renamed(proto: bytes, name: str) -> bytes:
    """An ``HloProto`` whose module (field 1) is named ``name`` (its field 1): xprof lists a
    program by its module's name."""
    out = b""
    for number, raw in _raw_fields(proto):
        if number == 1:
            module = b"".join(r for n, r in _raw_fields(next(v for _, _, v in _fields(raw))) if n != 1)
            raw = _message_field(1, _message_field(1, name.encode()) + module)
        out += raw
    return out


def write_programs(logdir: Path | str, protos: list[Any], *, session: Path | None = None) -> Path:
    """Write ``protos`` (:class:`~.events.ProgramProtoEvent`) as a profile xprof's memory viewer
    reads: one plane ``/host:metadata`` holding each program's ``HloProto``.

    Args:
        logdir: the run's TensorBoard directory.
        protos: the programs, each listed by its ``name`` and ``program_id``.
        session: the profile session's directory to write into (the capture's); None makes one
            under ``logdir/plugins/profile/``.

    Returns:
        The file written (``PROGRAMS_FILE`` in the session's directory).
    """
    import base64

    if session is None:
        session = Path(logdir) / "plugins" / "profile" / time.strftime("%Y_%m_%d_%H_%M_%S_tpu_debug")
    stats = {"Hlo Proto": 1, "program_id": 2}
    body = _int_field(1, 1) + _message_field(2, _METADATA_PLANE.encode())
    for meta_id, event in enumerate(protos, 1):
        label = f"{event.name}({event.program_id})".encode()
        proto = _renamed(base64.b64decode(event.proto), event.name)
        meta = (_int_field(1, meta_id) + _message_field(2, label) + _message_field(4, label)
                + _message_field(5, _int_field(1, stats["Hlo Proto"]) + _message_field(6, proto))
                + _message_field(5, _int_field(1, stats["program_id"]) + _int_field(3, event.program_id)))
        body += _message_field(4, _int_field(1, meta_id) + _message_field(2, meta))
    for name, stat_id in stats.items():
        body += _message_field(5, _int_field(1, stat_id) + _message_field(2, _int_field(1, stat_id)
                                                                          + _message_field(2, name.encode())))
    session.mkdir(parents=True, exist_ok=True)
    path = session / PROGRAMS_FILE
    path.write_bytes(_message_field(1, body))
    return path


# -- the ranks of a multi-process run, side by side ---------------------------------------

RANK_PLANE = "/device:CUSTOM:rank {rank}"


@dataclasses.dataclass(frozen=True, slots=True)
class RankSpan:
    """One collective of one rank on the group timeline: ``start`` (POSIX seconds) and
    ``seconds`` long, on the line ``lane`` (the c10d group), called ``name``, with ``args``."""

    start: float
    seconds: float
    lane: str
    name: str
    args: tuple[tuple[str, str], ...] = ()


def span_plane(plane_id: int, name: str, spans: list[RankSpan], t0: float) -> bytes:
    """An XSpace ``planes`` field named ``name`` holding ``spans`` (their ``start`` in seconds
    on the clock of ``t0``, the plane's time 0), one line per lane, in the lanes' first order.
    The trace viewer shows a ``/device:CUSTOM:...`` plane as a process row, a line as a
    thread row, and spans of one line that nest as a stack."""
    names: dict[str, int] = {}
    stat_names: dict[str, int] = {}
    lines: dict[str, list[bytes]] = {}
    for span in spans:
        meta_id = names.setdefault(span.name, len(names) + 1)
        stats = b"".join(
            _message_field(4, _int_field(1, stat_names.setdefault(k, len(stat_names) + 1))
                           + _message_field(5, v.encode()))
            for k, v in span.args
        )
        event = (_int_field(1, meta_id) + _int_field(2, max(int((span.start - t0) * 1e12), 0))
                 + _int_field(3, max(int(span.seconds * 1e12), 1)) + stats)
        lines.setdefault(span.lane, []).append(_message_field(4, event))
    body = _int_field(1, plane_id) + _message_field(2, name.encode())
    for line_id, (lane, events) in enumerate(lines.items(), 1):
        body += _message_field(3, _int_field(1, line_id) + _int_field(10, line_id) + _message_field(2, lane.encode())
                               + b"".join(events))
    for meta_name, meta_id in names.items():
        body += _message_field(4, _int_field(1, meta_id) + _message_field(2, _int_field(1, meta_id)
                                                                          + _message_field(2, meta_name.encode())))
    for stat, stat_id in stat_names.items():
        body += _message_field(5, _int_field(1, stat_id) + _message_field(2, _int_field(1, stat_id)
                                                                          + _message_field(2, stat.encode())))
    return _message_field(1, body)


def write_rank_spans(path: Path, spans: dict[int, list[RankSpan]]) -> Path:
    """Write a profile (``.xplane.pb``) holding one plane per rank, named ``/device:CUSTOM:rank
    <r>`` (the trace viewer shows each plane as a process row), with each rank's spans on one
    line per lane. xprof reads the file as it reads a recorded profile.

    Returns:
        ``path``.
    """
    starts = [span.start for rank_spans in spans.values() for span in rank_spans]
    # offsets from the first span: a POSIX time in picoseconds would not fit xprof's int64
    t0 = min(starts) if starts else 0.0
    planes = b"".join(span_plane(plane_id, RANK_PLANE.format(rank=rank), rank_spans, t0)
                      for plane_id, (rank, rank_spans) in enumerate(sorted(spans.items()), 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(planes)
    return path
