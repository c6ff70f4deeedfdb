"""The work objects the `tpu` process group's calls return: a collective's, done before its
call returned, and a send's or receive's, posted to gloo and finished when waited for."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tpu_debug.runtime.distributed.c10d.host_engine import write_back
from tpu_debug.runtime.distributed.c10d.live_check import LiveCheck

__all__ = ["DoneWork", "PostedWork"]


class DoneWork(dist.Work):
    """The work of a collective that finished before its call returned.

    Its future's value is the collective's output tensors (on their own device): DDP's
    reducer reads a bucket's reduced gradients from it.
    """

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        return None

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


class PostedWork(dist.Work):
    """A send or receive posted to gloo: like gloo's own, it finishes when waited for. The
    wait first reads the peer's side from the live check (a peer that posts another size,
    left or died, or does not post in time is named), then waits for gloo and writes a
    received tensor back to its device. A send reaches gloo only once the receiver's side
    matches it (:meth:`LiveCheck.hold`): ``post`` gives it to gloo."""

    def __init__(self, post: Callable[[], Any], copies: list[tuple[torch.Tensor, torch.Tensor]],
                 outputs: list[torch.Tensor], ticket: dict | None, check: LiveCheck | None,
                 finish: Callable[[], None]) -> None:
        super().__init__()
        self._post = post
        self._host_work: Any = None
        self._copies = copies
        self._outputs = outputs
        self.ticket = ticket
        self._check = check
        self._finish = finish
        self._error: BaseException | None = None
        self.done = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Give the call to gloo (once)."""
        with self._lock:
            if self._host_work is None:
                self._host_work = self._post()

    def fail(self, error: BaseException) -> None:
        """The peer's side does not match: the wait raises ``error``."""
        self._error = error

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.done:
            return True
        if self._error is not None:
            raise self._error
        if self.ticket is not None and self._check is not None:
            self._check.match(self.ticket)
        self.start()
        self._host_work.wait()
        with self._lock:
            if not self.done:
                write_back([(d, h) for d, h in self._copies if any(d is o for o in self._outputs)])
                self.done = True
                self._finish()
        return True

    def is_completed(self) -> bool:
        if not self.done and self._host_work is not None and self._host_work.is_completed():
            self.wait()
        return self.done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        # a future of a posted call completes at its wait: waited for here
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

