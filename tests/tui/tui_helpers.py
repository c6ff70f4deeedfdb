"""Helpers shared by the TUI tests (a module of its own: test files cannot import conftest)."""

from __future__ import annotations

from snapshot import svg_text
from textual.worker import WorkerCancelled

SIZE = (120, 36)  # every pilot and snapshot test runs at this terminal size


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
        if any(not w.is_finished for w in app.workers) or getattr(app.screen, "_pending", False):
            # the overview looks for transfer findings after a short delay: wait for them
            quiet = 0
            await pilot.pause(0.05)
            continue
        quiet += 1
        if quiet >= rounds:
            return


def screen_text(app) -> str:
    return svg_text(app.export_screenshot())


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
