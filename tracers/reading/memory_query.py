"""``session.memory``: each compiled program's memory at its peak, buffer by buffer
(``tracers.reading.peak_buffers`` records it from the compiler's buffer assignment)."""

from __future__ import annotations

from tpu_debug.tracers.events import ProgramBuffer, ProgramMemoryEvent
from tpu_debug.tracers.reading.reader import Part

__all__ = ["MemoryQuery", "line_of"]


def line_of(buffer: ProgramBuffer) -> tuple[str, int] | None:
    """(file, line) that made a buffer, None when no line is known (an input, a folded row)."""
    return (buffer.file, buffer.line) if buffer.file and buffer.line is not None else None


class MemoryQuery(Part):
    """``session.memory()``: the programs' peaks, the one that needs the most first."""

    __slots__ = ()

    def __call__(self, source: str | None = None) -> list[ProgramMemoryEvent]:
        """Each distinct program's peak (``tracers.events.ProgramMemoryEvent``): the programs the
        TPU compiler refused first, then by the bytes they need, most first.

        Args:
            source: ``"local"`` or ``"target"`` keeps that compiler's only.

        Example::

            top = session.memory()[0]
            [(b.kind, b.nbytes, b.line) for b in top.buffers[:5]]
        """
        events: list[ProgramMemoryEvent] = self._run.events(ProgramMemoryEvent.kind)  # type: ignore[assignment]
        if source is not None:
            events = [e for e in events if e.source == source]
        return sorted(events, key=lambda e: (e.status != "hbm_oom", -e.total_bytes, e.id))

    def peak(self) -> ProgramMemoryEvent | None:
        """The program the run's memory answer is about: a refused one, else the one that needs
        the most (the TPU target's figures before this machine's when both were recorded)."""
        events = self()
        target = [e for e in events if e.source == "target"]
        return (target or events or [None])[0]

    def by_line(self, event: ProgramMemoryEvent) -> dict[tuple[str, int] | None, int]:
        """A program's bytes at its peak per line that made them (None: inputs, folded rows,
        the heap's unused bytes), most first."""
        lines: dict[tuple[str, int] | None, int] = {}
        for b in event.buffers:
            key = line_of(b)
            lines[key] = lines.get(key, 0) + b.nbytes
        return dict(sorted(lines.items(), key=lambda kv: -kv[1]))
