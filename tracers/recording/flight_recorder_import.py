"""Reading PyTorch Flight Recorder dumps (NCCL's, gloo's, the `tpu` process group's) as events.

A dump is what a rank of a PyTorch job wrote when its Flight Recorder was on
(``TORCH_FR_BUFFER_SIZE``/``TORCH_NCCL_TRACE_BUFFER_SIZE``): a pickled dict, one file per
rank, named ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE``, default
``/tmp/nccl_trace_rank_``), with ``version``, ``pg_config`` (each group's name,
description and global ranks) and ``entries``: each collective's ``record_id``,
``process_group`` (name, description), ``collective_seq_id`` / ``p2p_seq_id``,
``profiling_name`` (``nccl:all_reduce``, ``gloo:send 0->1``), sizes and dtypes of inputs
and outputs, ``state`` with its times (nanoseconds of the wall clock) and the Python
``frames`` (innermost first).

Each entry becomes the ``collective_call`` event a traced rank records (and a
``collective_done`` when the entry completed with a time), so the ranks report, the TUI
and the desync reader show an imported job as they show a traced one.

The dumps are pickles. :func:`read_dump` loads them with an unpickler that builds only
plain containers and scalars (dicts, lists, tuples, strings, numbers): a file holding any
other object is refused, and nothing in it is executed.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import math
import pickle
import re
from pathlib import Path
from typing import Any

from tpu_debug.core.collective_kinds import C10D_OF_FLIGHT_RECORDER, FLIGHT_RECORDER_NAMES, KINDS, of_c10d
from tpu_debug.core.errors import TpuDebugError
from tpu_debug.core.records import CollectiveDone, CollectiveInfo
from tpu_debug.tracers.events import CollectiveCallEvent, CollectiveDoneEvent, SourceLocation
from tpu_debug.tracers.location import is_library_file

__all__ = ["Dump", "DumpError", "dump_events", "find_dumps", "read_dump"]

#: c10's ScalarType names, as dumps spell dtypes, and their bytes
_DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8), "Int": ("int32", 4), "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1),
    "Bool": ("bool", 1), "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
}
# a send's or receive's profiling name: its Flight Recorder name, "<rank>-><peer>" or "<rank><-<peer>"
_P2P_NAMES = sorted({FLIGHT_RECORDER_NAMES[m] for k in KINDS for m in k.peer_argument})
_P2P = re.compile(rf"^({'|'.join(_P2P_NAMES)}) (\d+)(->|<-)(\d+)$")
_RANK_SUFFIX = re.compile(r"^(.*?)(\d+)$")


class DumpError(TpuDebugError, ValueError):
    """A file that is no Flight Recorder dump this reader can read."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: a dump holds nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"a Flight Recorder dump holds plain data; this file asks for {module}.{name}")


@dataclasses.dataclass(frozen=True, slots=True)
class Dump:
    """One rank's dump: ``rank`` (from the file name), ``version``, ``groups`` (name ->
    (description, global ranks)) and ``entries`` (the dicts as written, oldest first)."""

    path: Path
    rank: int
    version: str
    groups: dict[str, tuple[str, tuple[int, ...]]]
    entries: tuple[dict[str, Any], ...]


def read_dump(path: Path, rank: int) -> Dump:
    """Load the dump in ``path`` of global rank ``rank``.

    Raises:
        DumpError: the file is no Flight Recorder dump (not a pickle of plain data, or
            without ``entries``).
    """
    try:
        data = _PlainUnpickler(io.BytesIO(Path(path).read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DumpError(f"{path}: not a Flight Recorder dump ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no entries)")
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, cfg in (data.get("pg_config") or {}).items():
        try:
            ranks = tuple(int(r) for r in ast.literal_eval(str(cfg.get("ranks", "[]"))))
        except (ValueError, SyntaxError, TypeError):
            ranks = ()
        if name and ranks:
            groups[str(name)] = (str(cfg.get("desc", "")), ranks)
    entries = sorted((e for e in data["entries"] if isinstance(e, dict)), key=lambda e: e.get("record_id", 0))
    return Dump(Path(path), rank, str(data.get("version", "")), groups, tuple(entries))


def find_dumps(folder: Path, prefix: str | None = None) -> list[tuple[Path, int]]:
    """The dumps of a folder and their ranks: files named ``<prefix><rank>`` (the prefix
    the files share, when not given), as ``torchfrtrace`` finds them."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.name.endswith((".tmp", ".pipe")))
    found: dict[str, list[tuple[Path, int]]] = {}
    for p in files:
        if prefix is not None:
            if p.name.startswith(prefix) and p.name[len(prefix):].isdigit():
                found.setdefault(prefix, []).append((p, int(p.name[len(prefix):])))
            continue
        m = _RANK_SUFFIX.match(p.name)
        if m:
            found.setdefault(m.group(1), []).append((p, int(m.group(2))))
    if len(found) > 1:
        raise DumpError(f"{folder} holds dumps of several prefixes ({', '.join(sorted(found))}): give one with --prefix")
    return sorted(next(iter(found.values()), []), key=lambda pr: pr[1])


def _user_frame(frames: list[dict[str, Any]]) -> SourceLocation | None:
    """The innermost frame of the user's code (a dump's frames are innermost first)."""
    for f in frames or ():
        file = str(f.get("filename", ""))
        if file and not is_library_file(file):
            return SourceLocation(file, int(f.get("line", 0) or 0), str(f.get("name", "")))
    return None


def _sizes(entry: dict[str, Any], key: str) -> list[list[int]]:
    value = entry.get(key) or []
    return [list(s) for s in value if isinstance(s, (list, tuple))]


def dump_events(dump: Dump, members: dict[str, tuple[int, ...]], t0_ns: int,
                new_id: Any) -> tuple[list[CollectiveCallEvent], list[CollectiveDoneEvent]]:
    """One rank's entries as ``collective_call`` events (and ``collective_done`` for the ones
    that completed with a time), timestamped from ``t0_ns``.

    Args:
        dump: the rank's dump.
        members: each group's global ranks (all dumps' groups together).
        t0_ns: the wall-clock nanoseconds the timestamps count from.
        new_id: gives each event its id.
    """
    calls, dones = [], []
    for e in dump.entries:
        name = str(e.get("profiling_name", "")).partition(":")[2]
        p2p = _P2P.match(name)
        kind = p2p.group(1) if p2p else name
        op = C10D_OF_FLIGHT_RECORDER.get(kind)
        group = str((e.get("process_group") or ("?",))[0])
        ranks = members.get(group, ())
        if op is None or not ranks or dump.rank not in ranks:
            continue
        ins, outs = _sizes(e, "input_sizes"), _sizes(e, "output_sizes")
        # the call's tensors in the order of its arguments: the inputs alone when they are all of
        # them (in place, or a send), else the outputs (the first argument) then the inputs
        ins_at, outs_at = of_c10d(op).flight_recorder_arguments(op)
        shapes = ins if ins_at and set(outs_at) <= set(ins_at) else outs + ins
        dtype_names = list(e.get("input_dtypes") or e.get("output_dtypes") or [])
        dtypes = sorted({_DTYPES.get(d, (str(d).lower(), 0))[0] for d in dtype_names})
        size = _DTYPES.get(dtype_names[0], ("", 0))[1] if dtype_names else 0
        created = int(e.get("time_created_ns") or t0_ns)
        seq = int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id") or 0)
        peer = int(p2p.group(4)) if p2p else None
        call = CollectiveCallEvent(
            new_id(), (created - t0_ns) / 1e9, None, 0, _user_frame(e.get("frames") or []),
            CollectiveInfo(op, group, ranks, ranks.index(dump.rank), seq, tuple(tuple(s) for s in shapes),
                           ",".join(dtypes), sum(math.prod(s) for s in shapes) * size, None, peer),
        )
        calls.append(call)
        completed = e.get("time_discovered_completed_ns")
        if e.get("state") == "completed" and completed:
            dones.append(CollectiveDoneEvent(new_id(), (int(completed) - t0_ns) / 1e9, None, 0, None, CollectiveDone(
                op, group, call.rank, seq, (int(completed) - created) / 1e9)))
    return calls, dones
