"""XLA's own warnings about a sharded program, caught while the runtime compiles it.

XLA's SPMD partitioner writes some findings about the user's shardings to the
process's stderr through its C++ logging, at compile time, where no Python code
sees them: "[SPMD] Involuntary full rematerialization. The compiler cannot go from
sharding {devices=[2,1,4]<=[4,2]T(1,0)} to {devices=[1,8,1]<=[8]} efficiently for
HLO operation %mul.1 = f32[8,16,4]{2,1,0} multiply(...)" means the program gathers a
whole tensor onto every device to re-split it, because two values meeting in one
op were sharded differently (or a reshape merged or split a sharded dimension).

While a tracer reads them and a mesh exists, :func:`capture` redirects file descriptor 2
around the runtime's compile (the C++ logger writes there, below Python), keeps the
lines it recognises as :class:`RematWarning` records for the tracers (:func:`take`),
and writes every other byte back to the real stderr when the compile ends, so
nothing is lost (what another thread writes to stderr meanwhile comes out then too).
Lines of two compiles running at once cannot be told apart: all go back as they
were. Anything going wrong in the capture leaves the compile and the program's
output as they would have been. A compile read back from the disk cache logs
nothing, so the warnings are kept beside its cache entry (:func:`remember`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tpu_debug.core.hlo_text import braced, parse_instruction, scope_parts
from tpu_debug.runtime.distributed import placement

__all__ = ["KEPT_SUFFIX", "RematWarning", "add_reader", "capture", "parse_line", "remember", "remove_reader", "take"]

_MARK = b"Involuntary full rematerialization"
_FROM, _TO = "go from sharding ", " to "
# the instruction follows: "HLO operation %mul.1 = f32[8,16,4]{2,1,0} multiply(...), ..." (newer XLA),
# "HLO operation: %pad = f64[96]{0} pad(...), ..." (older); the reader reads it as any instruction
_OPERATION = "HLO operation"


@dataclasses.dataclass(frozen=True, slots=True)
class RematWarning:
    """One "Involuntary full rematerialization" line of XLA's SPMD partitioner.

    Attributes:
        from_sharding: the sharding the value had (``{devices=[2,1,4]<=[4,2]T(1,0)}``).
        to_sharding: the sharding its user needed (``{devices=[1,8,1]<=[8]}``).
        instruction: the HLO instruction resharded (``%mul.1``), "" when XLA did not name it.
        shape: its per-device shape (``f32[8,16,4]``), "" when not named.
        opcode: its HLO opcode (``multiply``, ``parameter``), "" when not named.
        op_name: its ``op_name`` metadata (``jit(fn)/mul|aten::mul.Tensor/mul``).
        node: the FX node(s) that metadata names (``mul``, comma-separated when XLA
            combined several), "" for an eager op.
        aten_op: the aten op it names (``aten::mul.Tensor``), "" when none.
        text: the message without the logger's prefix.
    """

    from_sharding: str
    to_sharding: str
    instruction: str
    shape: str
    opcode: str
    op_name: str
    node: str
    aten_op: str
    text: str


def parse_line(line: str) -> RematWarning | None:
    """The warning a log line holds, or None when it is not one.

    Example:
        >>> w = parse_line("W1204 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. "
        ...                "The compiler cannot go from sharding {devices=[2,1]<=[2]} to {devices=[1,2]<=[2]} "
        ...                "efficiently for HLO operation %add.2 = f32[4,8]{1,0} add(%a, %b), ...")
        >>> (w.instruction, w.shape, w.opcode)
        ('%add.2', 'f32[4,8]', 'add')
    """
    at = line.find(_MARK.decode())
    if at < 0:
        return None
    start = line.rfind("[", 0, at)
    text = line[start if start >= 0 else at:].strip()
    shardings = _shardings(text)
    if shardings is None:
        return None
    at = text.find(_OPERATION)
    op = parse_instruction(text[text.find("%", at):]) if at >= 0 and "%" in text[at:] else None
    op_name = op.metadata.op_name if op else ""
    node, aten = scope_parts(op_name)
    return RematWarning(shardings[0], shardings[1], f"%{op.name}" if op else "", op.shape.plain() if op else "",
                        op.opcode if op else "", op_name, node, aten, text)


def _shardings(text: str) -> tuple[str, str] | None:
    """The (from, to) shardings of the warning's "go from sharding {...} to {...}"."""
    at = text.find(_FROM)
    if at < 0 or text[at + len(_FROM):at + len(_FROM) + 1] != "{":
        return None
    source = braced(text, at + len(_FROM))
    to = at + len(_FROM) + len(source)
    if not text.startswith(_TO + "{", to):
        return None
    return source, braced(text, to + len(_TO))


_local = threading.local()  # .taken: the RematWarnings of this thread's last captured compile
_lock = threading.Lock()
_depth = 0  # captures in progress (threads compiling at once share one redirect)
_shared: dict = {}  # while _depth > 0: "file", "saved" (the real stderr's fd), "overlap"


_readers = 0  # tracers that take the warnings (a capture nobody reads would swallow them)


def add_reader() -> None:
    """A tracer will :func:`take` the warnings of each compile: capture them from now on."""
    global _readers
    with _lock:
        _readers += 1


def remove_reader() -> None:
    """A tracer of :func:`add_reader` stopped: with no reader left, XLA's lines stay on stderr."""
    global _readers
    with _lock:
        _readers = max(0, _readers - 1)


def take() -> tuple[RematWarning, ...]:
    """The warnings of this thread's last captured compile, once (then they are gone)."""
    found = getattr(_local, "taken", ())
    _local.taken = ()
    return found


def _begin() -> bool:
    global _depth
    with _lock:
        if _depth:
            _shared["overlap"] = True
            _depth += 1
            return True
        sys.stderr.flush()  # what Python wrote before the compile goes out before it
        file = tempfile.TemporaryFile()  # noqa: SIM115 - open until the last capture ends, in _end
        try:
            saved = os.dup(2)
        except OSError:
            file.close()
            return False
        try:
            os.dup2(file.fileno(), 2)
        except OSError:
            os.close(saved)
            file.close()
            return False
        _shared.update(file=file, saved=saved, overlap=False)
        _depth = 1
        return True


def _end() -> tuple[bytes, bool] | None:
    """Restore stderr when the last capture ends: (the bytes caught, whether compiles overlapped)."""
    global _depth
    with _lock:
        _depth -= 1
        if _depth:
            return None
        file, saved, overlap = _shared.pop("file"), _shared.pop("saved"), _shared.pop("overlap")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        try:
            file.seek(0)
            return file.read(), overlap
        finally:
            file.close()


def _sort(caught: bytes, overlap: bool) -> tuple[tuple[RematWarning, ...], bytes]:
    """(the warnings for this compile, the bytes to write back). Lines of compiles that ran at
    once cannot be told apart: then every line goes back as it was, none is kept."""
    if overlap or _MARK not in caught:
        return (), caught
    kept, rest = [], []
    for line in caught.splitlines(keepends=True):
        warning = parse_line(line.decode("utf-8", "replace")) if _MARK in line else None
        if warning is None:
            rest.append(line)
        else:
            kept.append(warning)
    return tuple(kept), b"".join(rest)


@contextlib.contextmanager
def capture(enabled: bool = True) -> Iterator[None]:
    """Around one local compile: XLA's rematerialization warnings become :func:`take`'s records.

    Args:
        enabled: False passes straight through (a compile for another target).

    The redirect happens only while a mesh exists and a tracer reads the records
    (:func:`add_reader`); otherwise the block runs untouched.

    Example::

        with capture():
            compiled = lowered.compile()
        take()
        # (RematWarning(from_sharding='{devices=[2,1,4]<=[4,2]T(1,0)}', ...),)
    """
    _local.taken = ()
    if not (enabled and placement.active and _readers):
        yield
        return
    try:
        began = _begin()
    except Exception:  # noqa: BLE001 - no capture is the safe answer; the compile runs as ever
        began = False
    try:
        yield
    finally:
        if began:
            _finish()


def _finish() -> None:
    try:
        ended = _end()
    except Exception:  # noqa: BLE001 - stderr could not be put back: nothing more to do safely
        return
    if ended is None:
        return
    caught, overlap = ended
    try:
        _local.taken, rest = _sort(caught, overlap)
    except Exception:  # noqa: BLE001 - an unreadable log goes back whole
        _local.taken, rest = (), caught
    with contextlib.suppress(OSError):
        while rest:
            rest = rest[os.write(2, rest):]


KEPT_SUFFIX = ".xla-log"  # beside a compile cache entry: the warnings its compile logged, one per line


def remember(entry: Path | None, from_cache: bool) -> None:
    """Keep this thread's warnings beside the compile cache's ``entry`` it just wrote, or, for an
    executable read back from ``entry`` (XLA compiled nothing, so logged nothing), take back the
    warnings its compile logged. A file that cannot be read or written costs the warnings only."""
    if entry is None or not (placement.active and _readers):
        return
    kept = entry.with_name(entry.name + KEPT_SUFFIX)
    try:
        if from_cache:
            if kept.exists():
                found = (parse_line(line) for line in kept.read_text().splitlines())
                _local.taken = tuple(w for w in found if w is not None)
        elif getattr(_local, "taken", ()):
            tmp = kept.with_name(f".tmp-{os.getpid()}-{threading.get_native_id()}{KEPT_SUFFIX}")
            tmp.write_text("".join(w.text + "\n" for w in _local.taken))
            os.replace(tmp, kept)
        else:
            kept.unlink(missing_ok=True)  # compiled again, cleanly
    except (OSError, UnicodeDecodeError):
        return
