"""Read a ``TORCH_TRACE`` directory (PyTorch's structured trace logs) into tpu_debug runs.

Each ``dedicated_log_torch_trace*.log`` file (one per rank) becomes one run holding
dynamo's compiles (``compilation_metrics``: frame, compile time), recompiles with their
failed guards (the ``recompile_reasons`` artifact) and graph breaks with their reason
and user line (the ``dynamo_graph_break_reason`` artifact), as the same events a live
run records.

A recompile is linked as a live run links it: its ``previous`` is the compile of the
cached entry whose guard failed most recently (dynamo lists them most recent first),
its ``diffs`` that guard read into :class:`~.events.KeyDiff` records by the same
functions the live tracer uses (``dynamo_events.guard_diffs``, ``recompiles.read_guard``),
and its location the user's line the guard came from (the guard's "User stack trace").

A log records only the calls that compiled, so an imported run's steps are those calls:
each compile of the function compiled most often starts one (``detected="torch_trace"``).
The advisor then reads a recompile that keeps coming back as it does in a live run.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
from pathlib import Path
from typing import Any

from tpu_debug.runs import new_run_dir
from tpu_debug.tracers.recording.dynamo_events import clean_guard, guard_diffs, pretty_function
from tpu_debug.tracers.events import (
    CompileEvent,
    GraphBreakEvent,
    GuardFailureEvent,
    KeyDiff,
    SourceLocation,
)
from tpu_debug.tracers.location import split_frames
from tpu_debug.tracers.reading.recompile_analysis import read_guard
from tpu_debug.tracers.recording.step_tracker import steps_between
from tpu_debug.tracers.store import DB_NAME
from tpu_debug.tracers.recording.run_writer import RunWriter

__all__ = ["STEPS_DETECTED", "import_trace", "parse_log"]

# StepEvent.detected of an imported run: its steps are the calls the log shows compiling
STEPS_DETECTED = "torch_trace"

# glog-style prefix: level+date, time, thread, file:line], then the JSON header
_HEADER = re.compile(r"^[VIWE]\d{4} (\d\d):(\d\d):([\d.]+) \d+ [^\]]+\] (\{.*\})$")
_BREAK_AT = re.compile(r"Graph break in user code at (.+):(\d+)")
_FRAME_LINE = re.compile(r'File "(.+)", line (\d+), in (\S+)')
_RANK = re.compile(r"rank_(\d+)")


def parse_log(path: Path) -> list[tuple[float, dict[str, Any], str]]:
    """The entries of one trace log: (seconds of the day, JSON header, payload text)."""
    entries: list[tuple[float, dict[str, Any], str]] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("\t") and entries:
            ts, head, payload = entries[-1]
            entries[-1] = (ts, head, payload + line[1:] + "\n")
            continue
        match = _HEADER.match(line)
        if match is None:
            continue
        try:
            head = json.loads(match.group(4))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        ts = int(match.group(1)) * 3600 + int(match.group(2)) * 60 + float(match.group(3))
        entries.append((ts, head, ""))
    return entries


def _compile_id(head: dict[str, Any]) -> str:
    return f"{head.get('frame_id')}/{head.get('frame_compile_id')}"


@dataclasses.dataclass(slots=True)
class _Compile:
    """What the log says about one dynamo compile id, gathered until its metrics come."""

    start: float  # the first entry of this compile id
    function: str | None = None
    call: SourceLocation | None = None
    guards: tuple[str, ...] = ()  # the recompile reasons as dynamo wrote them
    guards_at: float | None = None
    event: int | None = None  # the CompileEvent's id, once written


class _Importer:
    """Turns one log's entries into events, in the order the log has them."""

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer
        self.strings: dict[int, str] = {}
        self.compiles: dict[str, _Compile] = {}
        self.written: list[tuple[str, CompileEvent]] = []  # (dynamo frame id, its compile)
        self.meta: dict[str, Any] = {}  # what the log says of the program that wrote it

    def read(self, entries: list[tuple[float, dict[str, Any], str]]) -> None:
        t0 = entries[0][0] if entries else 0.0
        for ts, head, payload in entries:
            clock = ts - t0
            if "str" in head:
                text, index = head["str"]
                self.strings[index] = text
                continue
            known = self._known(head, clock)
            artifact = head.get("artifact", {}).get("name")
            if "dynamo_start" in head and known is not None:
                self._start(head, known)
            elif artifact == "recompile_reasons" and known is not None:
                known.guards, known.guards_at = tuple(_payload_lines(payload)), clock
            elif artifact == "dynamo_graph_break_reason":
                _graph_break(self.writer, clock, head, payload, known)
            elif "compilation_metrics" in head:
                self._compile(head["compilation_metrics"])
        for compile_id, known in self.compiles.items():  # a log cut off before the compile started
            if known.guards and known.function is None:
                first = self.compiles.get(compile_id.split("/")[0] + "/0")
                known.function = first.function if first else f"frame {compile_id.split('/')[0]}"
                self._guard_failure(compile_id, known)
        _steps(self.writer, self.written)
        if entries:
            self.meta["duration"] = entries[-1][0] - t0
        self.writer.set_meta(**self.meta)

    def _known(self, head: dict[str, Any], clock: float) -> _Compile | None:
        if head.get("frame_id") is None:
            return None
        return self.compiles.setdefault(_compile_id(head), _Compile(clock))

    def _start(self, head: dict[str, Any], known: _Compile) -> None:
        stack = head["dynamo_start"].get("stack") or [{}]
        frames = [
            SourceLocation(self.strings.get(f.get("filename"), "?"), f.get("line", 0), f.get("name", "?"))
            for f in stack
        ]
        first = known.function is None  # a restarted compile may start again
        # the call is the user's line that reached the compiled function, past any wrapper a
        # library put around it (tpu_debug.compile's), as a live run's location is
        known.function, known.call = frames[-1].function, split_frames(frames[:-1])[0]
        if known.guards and first:  # the reasons come just before their compile's start
            self._guard_failure(_compile_id(head), known)

    def _guard_failure(self, compile_id: str, known: _Compile) -> None:
        when = known.guards_at if known.guards_at is not None else known.start
        guards = tuple(": ".join(p for p in clean_guard(text) if p) for text in known.guards)
        self.writer.put(
            GuardFailureEvent(
                self.writer.new_id(), when, "compiled", 0, known.call, known.function, compile_id, guards
            )
        )

    def _compile(self, metrics: dict[str, Any]) -> None:
        if metrics.get("co_name") is None:
            return
        self._versions(metrics)
        compile_id = str(metrics.get("compile_id"))
        known = self.compiles.get(compile_id) or _Compile(0.0)
        name = str(metrics["co_name"])
        defined = SourceLocation(
            str(metrics.get("co_filename")), int(metrics.get("co_firstlineno") or 0), name
        )
        direction = "forward" if metrics.get("is_forward", True) is not False else "backward"
        identity = f"{pretty_function(name)} in {os.path.basename(defined.file)} ({direction})"
        previous, diffs, guarded_at = self._recompile_of(known)
        fail = metrics.get("fail_reason")
        signature = f"dynamo {compile_id}" + (f" (failed: {fail})" if fail else "")
        seconds = float(metrics.get("entire_frame_compile_time_s") or 0.0)
        event = CompileEvent(
            self.writer.new_id(),
            known.start,
            "compiled",
            0,
            guarded_at or known.call or defined,
            name,
            signature,
            (),
            seconds,
            previous=previous,
            diffs=diffs,
            identity=identity,
        )
        known.event = event.id
        self.writer.put(event)
        self.written.append((compile_id.split("/")[0], event))

    def _versions(self, metrics: dict[str, Any]) -> None:
        if "start_time" not in self.meta and isinstance(metrics.get("start_time"), (int, float)):
            start = _dt.datetime.fromtimestamp(metrics["start_time"], _dt.UTC)
            self.meta["start_time"] = start.isoformat(timespec="milliseconds")
        if metrics.get("pytorch_version"):
            self.meta["torch_version"] = str(metrics["pytorch_version"])
        if metrics.get("python_version"):
            self.meta["python_version"] = str(metrics["python_version"]).split()[0]

    def _recompile_of(self, known: _Compile) -> tuple[int | None, tuple[KeyDiff, ...], SourceLocation | None]:
        """The compile a recompile replaces (the entry whose guard failed most recently), how it
        differs (that guard, read as live runs read it) and the user's line of the guard."""
        if not known.guards:
            return None, (), None
        entry, guard = clean_guard(known.guards[0])
        earlier = self.compiles.get(entry) if entry is not None else None
        diffs = tuple(read_guard(d) for d in guard_diffs(guard)) if guard else ()
        user, _context = split_frames(
            [SourceLocation(f, int(n), fn) for f, n, fn in _FRAME_LINE.findall(known.guards[0])]
        )
        return (earlier.event if earlier is not None else None), diffs, user


def _payload_lines(payload: str) -> list[str]:
    text = payload.strip()
    try:
        value = json.loads(text)  # the artifact is declared json, yet its payload may be plain text
    except json.JSONDecodeError:
        return [text] if text else []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _graph_break(writer: RunWriter, clock: float, head: dict, payload: str, known: _Compile | None) -> None:
    function = (known.function if known is not None else None) or f"frame {head.get('frame_id')}"
    lines = payload.splitlines()
    at = _BREAK_AT.search(payload)
    location = SourceLocation(at.group(1), int(at.group(2)), function) if at else None
    reason = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("Graph Break Reason:")), ""
    )
    detail = next((line.strip() for line in lines if line.strip().startswith("Explanation:")), "")
    full = f"{reason} {detail}".strip() or payload.strip()[:500]
    writer.put(GraphBreakEvent(writer.new_id(), clock, "compiled", 0, location, function, full))


def _steps(writer: RunWriter, written: list[tuple[str, CompileEvent]]) -> None:
    """One step per compile of the function compiled most often: the calls the log shows.
    A step runs from that compile's first entry to the next one's (the last to the last compile);
    the step tracker counts what is in it."""
    frames: dict[str, list[CompileEvent]] = {}
    for frame, c in written:
        frames.setdefault(frame, []).append(c)
    compiles = [c for _frame, c in written]
    if not frames:
        return
    anchor = max(frames.values(), key=len)  # the first frame on a tie: dicts keep their order
    starts = [c.ts for c in anchor]
    last = max(c.ts + c.seconds for c in compiles)
    for step in steps_between([*starts, max(last, starts[-1])], compiles, STEPS_DETECTED, writer.new_id):
        writer.put(step)


def import_trace(trace_dir: Path, logdir: Path, name: str | None = None) -> list[Path]:
    """Write one run per trace log in ``trace_dir``; returns the run directories.

    Raises:
        FileNotFoundError: ``trace_dir`` holds no trace log.
    """
    logs = sorted(Path(trace_dir).glob("dedicated_log_torch_trace*.log"))
    if not logs:
        raise FileNotFoundError(f"no dedicated_log_torch_trace*.log in {trace_dir}")
    runs = []
    for log in logs:
        rank = _RANK.search(log.name)
        run_name = (name or "torch_trace") + (f"-rank{rank.group(1)}" if rank else "")
        run_dir = new_run_dir(Path(logdir), run_name)
        meta = {"name": run_name, "status": "running", "imported_from": str(log), "argv": [], "command": []}
        if rank:
            meta["rank"] = int(rank.group(1))
        writer = RunWriter(run_dir / DB_NAME, meta)
        _Importer(writer).read(parse_log(log))
        writer.close({"status": "finished", "exit_status": 0})
        runs.append(run_dir)
    return runs
