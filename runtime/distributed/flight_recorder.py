"""PyTorch's Flight Recorder for the `tpu` process group: each rank's last collectives in a
ring, written as Flight Recorder dumps that ``torchfrtrace`` reads.

PyTorch's NCCL and gloo process groups keep, per process, a ring of their last collective
calls and write it as a pickled dict, one file per rank, named ``TORCH_FR_DUMP_TEMP_FILE``
(default ``/tmp/nccl_trace_rank_``) followed by the rank. The variables users set for
those work here the same way:

- ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``): entries kept; 0, the
  default, records nothing;
- ``TORCH_NCCL_DUMP_ON_TIMEOUT`` (default on): write the dump when the live check raises
  (a rank that did not arrive, or ranks that differ) and when the process leaves with an
  exception;
- ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: a named pipe ``<prefix><rank>.pipe`` is made; writing
  to it writes the dump (a thread waits on it, so a rank whose main thread is stuck dumps);
- ``SIGUSR1`` writes the dump (the handler runs when the main thread runs Python);
- ``TPU_DEBUG_FLIGHT_RECORDER_AT_EXIT=1`` writes it at exit.

The dump holds what ``torchfrtrace`` reads (the loader and ``components/types.py`` of
``torch.distributed.flight_recorder``): ``version`` "2.10", ``pg_config`` (each group's
name, description and global ranks), ``pg_status`` and ``entries``, each with
``record_id``, ``pg_id``, ``process_group`` (name, description), ``collective_seq_id``,
``p2p_seq_id``, ``op_id``, ``profiling_name`` (``gloo:all_reduce``, ``gloo:send 0->1``:
gloo is the engine underneath), sizes and dtypes of inputs and outputs, ``state``
(scheduled, started, completed) with its times in nanoseconds of the wall clock, the
Python ``frames`` (innermost first) and ``timeout_ms``.
"""

from __future__ import annotations

import collections
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["VERSION", "FlightRecorder", "configure", "dtype_name", "recorder"]

#: the dump layout written, as ``torchfrtrace`` checks it (major.minor)
VERSION = "2.10"
_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
_FRAMES = 64
_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """c10's ScalarType name of a torch dtype (``Float``, ``BFloat16``, ``Long``), as the dumps
    of PyTorch's own process groups spell it."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        import torch

        name = str(torch.empty(0, dtype=dtype).type()).removeprefix("torch.").removesuffix("Tensor")
        _DTYPE_NAMES[dtype] = name
    return name


def _frames() -> list[dict[str, Any]]:
    """The calling stack, innermost first, from the first frame outside tpu_debug (the c10d
    function the user called), as PyTorch's process groups record it."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tpu_debug"):
        frame = frame.f_back
    out = []
    while frame is not None and len(out) < _FRAMES:
        out.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return out


class FlightRecorder:
    """This process's ring of collective entries and the dumps written from it.

    Args:
        capacity: entries kept (the oldest go first).
        prefix: the dump's path without the rank.
        dump_on_error: write the dump when a check raises or the process leaves by an exception.
    """

    def __init__(self, capacity: int, prefix: str, *, dump_on_error: bool = True) -> None:
        self.capacity = capacity
        self.prefix = prefix
        self.dump_on_error_enabled = dump_on_error
        self.rank: int | None = None
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self._groups: dict[str, dict[str, str]] = {}
        self._status: dict[str, dict[str, int]] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self.dumped: list[Path] = []

    def record(self, group: tuple[str, str, tuple[int, ...]], op: str, seq: tuple[int, int, bool],
               sizes: tuple[list, list], dtypes: tuple[list, list], timeout_ms: int) -> dict[str, Any]:
        """A new entry, scheduled: ``group`` (name, description, global ranks), ``op`` its
        profiling name, ``seq`` (collective sequence, point-to-point sequence, is it one),
        ``sizes`` and ``dtypes`` (inputs, outputs)."""
        name, desc, ranks = group
        collective_seq, p2p_seq, is_p2p = seq
        now = time.time_ns()
        thread = threading.current_thread()
        with self._lock:
            if name not in self._groups:
                self._groups[name] = {"name": name, "desc": desc, "ranks": str(list(ranks))}
            status = self._status.setdefault(name, {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                    "last_completed_collective": -1})
            if not is_p2p:
                status["last_enqueued_collective"] = collective_seq
            entry = {
                "record_id": self._next_id, "pg_id": list(self._groups).index(name), "process_group": (name, desc),
                "collective_seq_id": collective_seq, "p2p_seq_id": p2p_seq, "op_id": self._next_id + 1,
                "profiling_name": f"gloo:{op}", "time_created_ns": now, "duration_ms": None,
                "input_sizes": sizes[0], "input_dtypes": dtypes[0], "output_sizes": sizes[1],
                "output_dtypes": dtypes[1], "state": "scheduled", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None, "retired": False, "timeout_ms": timeout_ms,
                "is_p2p": is_p2p, "thread_id": str(thread.ident), "thread_name": thread.name, "frames": _frames(),
            }
            self._next_id += 1
            self._entries.append(entry)
        return entry

    def started(self, entry: dict[str, Any]) -> None:
        entry["state"] = "started"
        entry["time_discovered_started_ns"] = time.time_ns()
        if not entry["is_p2p"]:
            self._status[entry["process_group"][0]]["last_started_collective"] = entry["collective_seq_id"]

    def completed(self, entry: dict[str, Any]) -> None:
        now = time.time_ns()
        if entry["time_discovered_started_ns"] is None:
            entry["time_discovered_started_ns"] = now
        entry["state"] = "completed"
        entry["time_discovered_completed_ns"] = now
        entry["duration_ms"] = (now - entry["time_created_ns"]) / 1e6
        entry["retired"] = True
        if not entry["is_p2p"]:
            self._status[entry["process_group"][0]]["last_completed_collective"] = entry["collective_seq_id"]

    def snapshot(self) -> dict[str, Any]:
        """The dump: the dict PyTorch's process groups pickle."""
        with self._lock:
            entries = [dict(e) for e in self._entries]
            return {"version": VERSION, "pg_config": {k: dict(v) for k, v in self._groups.items()},
                    "pg_status": {k: dict(v) for k, v in self._status.items()}, "comm_lib_version": "",
                    "entries": entries}

    def path(self) -> Path:
        return Path(f"{self.prefix}{self.rank if self.rank is not None else 0}")

    def dump(self) -> Path | None:
        """Write the dump to :meth:`path` (whole, through a temporary file); None when it
        cannot be written (the program goes on)."""
        path = self.path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(self.snapshot()))
            os.replace(tmp, path)
        except OSError as exc:
            print(f"tpu_debug: the Flight Recorder dump could not be written to {path}: {exc}", file=sys.stderr)
            return None
        self.dumped.append(path)
        return path

    def dump_on_error(self, *, timeout: bool = False) -> None:
        """A check raised (``timeout``: a rank did not arrive), or the process leaves by an exception."""
        if self.dump_on_error_enabled:
            self.dump()


def _listen_on_pipe(fr: FlightRecorder, pipe: Path) -> None:
    """Write the dump each time something is written to ``pipe`` (a thread blocks on it)."""
    while True:
        try:
            with open(pipe, "rb") as f:
                if f.read(1):
                    fr.dump()
        except OSError:
            return


def _on_sigusr1(previous: Any, fr: FlightRecorder) -> Any:
    def handler(signum: int, frame: Any) -> None:
        fr.dump()
        if callable(previous):
            previous(signum, frame)

    return handler


recorder: FlightRecorder | None = None
_configured = False


def configure(rank: int, environ: dict[str, str] | None = None) -> FlightRecorder | None:
    """This process's recorder, made once from the environment (None when
    ``TORCH_FR_BUFFER_SIZE``/``TORCH_NCCL_TRACE_BUFFER_SIZE`` asks for none); ``rank``, the
    process's global rank, names its dump."""
    global recorder, _configured
    if _configured:
        return recorder
    _configured = True
    env = os.environ if environ is None else environ
    try:
        capacity = int(env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")) or 0)
    except ValueError:
        capacity = 0
    if capacity <= 0:
        return None
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE", env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", _DEFAULT_PREFIX))
    on_error = env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1").strip().lower() not in ("0", "false", "no", "off")
    fr = FlightRecorder(capacity, prefix, dump_on_error=on_error)
    fr.rank = rank
    pipe_prefix = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
    if pipe_prefix:
        pipe = Path(f"{pipe_prefix}{rank}.pipe")
        try:
            if not pipe.exists():
                os.mkfifo(pipe)
            threading.Thread(target=_listen_on_pipe, args=(fr, pipe), name="tpu_debug-flight-recorder-pipe",
                             daemon=True).start()
        except OSError as exc:
            print(f"tpu_debug: the Flight Recorder pipe {pipe} could not be made: {exc}", file=sys.stderr)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, _on_sigusr1(signal.getsignal(signal.SIGUSR1), fr))
    recorder = fr
    return fr
