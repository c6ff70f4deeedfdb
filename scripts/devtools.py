"""The few Chrome DevTools protocol calls our browser checks need, over one page's websocket
(``aiohttp``): the TUI-in-a-browser test and the TensorBoard screenshot both drive headless
Chromium with it."""

from __future__ import annotations

import asyncio
import json

__all__ = ["DevTools"]


class DevTools:
    """Commands to one page; ``read()`` must run as a task to deliver their replies."""

    def __init__(self, ws, patience: float = 60.0) -> None:
        self.ws = ws
        self.patience = patience
        self.next_id = 0
        self.pending: dict[int, asyncio.Future] = {}

    async def read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            future = self.pending.pop(data.get("id"), None)
            if future is not None:
                future.set_result(data)

    async def call(self, method: str, **params):
        self.next_id += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, self.patience)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description", result))
        return result["result"].get("value")
