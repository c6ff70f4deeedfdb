"""Helpers shared by the TUI tests (a module of its own: test files cannot import conftest)."""

from __future__ import annotations

import io

from rich.console import Console
from snapshot import svg_text
from textual.widgets import OptionList
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
