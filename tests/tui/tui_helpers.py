"""Helpers shared by the TUI tests (a module of its own: test files cannot import conftest)."""

from __future__ import annotations

import io
import re

from rich.console import Console
from snapshot import svg_text
from textual.widgets import DataTable, OptionList
from textual.worker import WorkerCancelled

SIZE = (120, 36)  # the pilot tests run at this terminal size unless they name another


async def settle(pilot, rounds: int = 2) -> None:
    """Let workers finish and the messages they posted be handled (several times over:
    a handler may start the next worker)."""
    app = pilot.app
    quiet = 0
    for _ in range(100):
        try:
            await app.workers.wait_for_complete()
        except WorkerCancelled:  # an exclusive worker replaced by a newer one: that is fine
            pass
        await pilot.pause()
        # a worker not started yet counts too: under load a screen's first load can still be
        # pending when the last one finished (the overview then showed no findings yet)
        if any(not w.is_finished for w in app.workers) or _looking_for_transfers(app.screen):
            # the overview looks for transfer findings after a short delay: wait for them
            quiet = 0
            await pilot.pause(0.05)
            continue
        quiet += 1
        if quiet >= rounds:
            return


def _looking_for_transfers(screen) -> bool:
    """The overview still shows "looking through the transfers…" in its findings."""
    for findings in screen.query("#findings").results(OptionList):
        return any(findings.get_option_at_index(i).id == "pending" for i in range(findings.option_count))
    return False


def screen_text(app) -> str:
    return svg_text(app.export_screenshot())


def widget_text(widget) -> str:
    """What a ``Static`` shows, as plain text: its content rendered by rich, wide enough
    that no line wraps."""
    console = Console(width=400, color_system=None, file=io.StringIO())
    with console.capture() as captured:
        console.print(widget.content)
    return captured.get()


def drive(app, scenario, size=SIZE) -> None:
    """Run ``app`` headless at ``size``, let it load, then ``await scenario(pilot)``.
    (Plain pytest: no asyncio plugin is needed.)"""
    import asyncio

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await scenario(pilot)

    asyncio.run(main())


async def press(pilot, *keys: str) -> None:
    """Press keys one by one, letting what each started finish."""
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


# a whole duration with its unit, as format_seconds writes it
DURATION = re.compile(r"^(\d+(\.\d+)? (s|ms|µs|ns)|-)$")


def column_lines(app, table: DataTable, key: str) -> list[str]:
    """What the screen shows in ``table``'s column ``key``, one string per screen row (the
    header first): read from the rendered screen, not from the table's data."""
    lines = screen_text(app).split("\n")
    x = table.region.x
    for column_key, column in table.columns.items():
        width = column.get_render_width(table)
        if column_key.value == key:
            rows = lines[table.region.y : table.region.y + table.region.height]
            return [row[x : x + width].strip() for row in rows]
        x += width
    raise AssertionError(f"column {key!r} is not shown: {[k.value for k in table.columns]}")


def cells(lines: list[str]) -> list[str]:
    return [line for line in lines[1:] if line]
