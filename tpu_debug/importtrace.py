"""Read a ``TORCH_TRACE`` directory (PyTorch's structured trace logs) into tpu_debug runs.

Each ``dedicated_log_torch_trace*.log`` file (one per rank) becomes one run holding
dynamo's compiles (``compilation_metrics``: frame, compile time), recompiles with their
failed guards (the ``recompile_reasons`` artifact) and graph breaks with their reason
and user line (the ``dynamo_graph_break_reason`` artifact), as the same events a live
run records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tpu_debug.runs import new_run_dir
from tpu_debug.tracers.events import CompileEvent, GraphBreakEvent, GuardFailureEvent, SourceLocation
from tpu_debug.tracers.store import DB_NAME, RunWriter

__all__ = ["import_trace", "parse_log"]

# glog-style prefix: level+date, time, thread, file:line], then the JSON header
_HEADER = re.compile(r"^[VIWE]\d{4} (\d\d):(\d\d):([\d.]+) \d+ [^\]]+\] (\{.*\})$")
_BREAK_AT = re.compile(r"Graph break in user code at (.+):(\d+)")
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


def _events(entries: list[tuple[float, dict[str, Any], str]], writer: RunWriter) -> None:
    strings: dict[int, str] = {}
    starts: dict[str, tuple[str, SourceLocation | None]] = {}  # compile id -> function, user call
    pending: dict[str, tuple[float, tuple[str, ...]]] = {}  # compile id -> failed guards
    t0 = entries[0][0] if entries else 0.0
    for ts, head, payload in entries:
        clock = ts - t0
        if "str" in head:
            text, index = head["str"]
            strings[index] = text
        elif "dynamo_start" in head:
            stack = head["dynamo_start"].get("stack") or [{}]
            frames = [
                SourceLocation(strings.get(f.get("filename"), "?"), f.get("line", 0), f.get("name", "?"))
                for f in stack
            ]
            call = frames[-2] if len(frames) > 1 else None
            starts[_compile_id(head)] = (frames[-1].function, call)
            if _compile_id(head) in pending:  # the reasons come just before their compile's start
                when, guards = pending.pop(_compile_id(head))
                _guard_failure(writer, when, _compile_id(head), guards, (frames[-1].function, call))
        elif head.get("artifact", {}).get("name") == "recompile_reasons":
            pending[_compile_id(head)] = (clock, tuple(_payload_lines(payload)))
        elif head.get("artifact", {}).get("name") == "dynamo_graph_break_reason":
            _graph_break(writer, clock, head, payload, starts)
        elif "compilation_metrics" in head:
            _compile(writer, clock, head["compilation_metrics"], starts)
    for compile_id, (when, guards) in pending.items():  # a log cut off before the compile started
        earlier = starts.get(compile_id.split("/")[0] + "/0", (f"frame {compile_id.split('/')[0]}", None))
        _guard_failure(writer, when, compile_id, guards, earlier)


def _guard_failure(writer: RunWriter, clock: float, compile_id: str, guards: tuple, start: tuple) -> None:
    function, call = start
    writer.put(GuardFailureEvent(writer.new_id(), clock, "compiled", 0, call, function, compile_id, guards))


def _payload_lines(payload: str) -> list[str]:
    text = payload.strip()
    try:
        value = json.loads(text)  # the artifact is declared json, yet its payload may be plain text
    except json.JSONDecodeError:
        return [line for line in text.splitlines() if line.strip()]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _graph_break(writer: RunWriter, clock: float, head: dict, payload: str, starts: dict) -> None:
    function, _call = starts.get(_compile_id(head), (f"frame {head.get('frame_id')}", None))
    lines = payload.splitlines()
    at = _BREAK_AT.search(payload)
    location = SourceLocation(at.group(1), int(at.group(2)), function) if at else None
    reason = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("Graph Break Reason:")), ""
    )
    detail = next((line.strip() for line in lines if line.strip().startswith("Explanation:")), "")
    full = f"{reason} {detail}".strip() or payload.strip()[:500]
    writer.put(GraphBreakEvent(writer.new_id(), clock, "compiled", 0, location, function, full))


def _compile(writer: RunWriter, clock: float, metrics: dict, starts: dict) -> None:
    if metrics.get("co_name") is None:
        return
    compile_id = str(metrics.get("compile_id"))
    location = SourceLocation(
        str(metrics.get("co_filename")), int(metrics.get("co_firstlineno") or 0), metrics["co_name"]
    )
    seconds = float(metrics.get("entire_frame_compile_time_s") or 0.0)
    name = metrics["co_name"]
    identity = f"{name} in {Path(location.file).name}"
    fail = metrics.get("fail_reason")
    signature = f"dynamo {compile_id}" + (f" (failed: {fail})" if fail else "")
    writer.put(
        CompileEvent(
            writer.new_id(), clock, "compiled", 0, location, name, signature, (), seconds, identity=identity
        )
    )


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
        _events(parse_log(log), writer)
        writer.close({"status": "finished", "exit_status": 0})
        runs.append(run_dir)
    return runs
