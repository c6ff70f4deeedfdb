"""The CPU shadow of each device storage: what a pure-CPU run would hold there.

Each device storage maps weakly (the shadow dies with the storage) to a CPU
copy of its values in a pure-CPU run, with the device payload it shadows: a
write that did not go through the tracer replaces the payload, and a shadow
whose payload is no longer the storage's is stale. A storage whose CPU value
equals the device's, bit for bit, needs no shadow: the device's value is it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from tpu_debug.runtime.tensor import to_jax
from tpu_debug.tracers.recording.divergence.triage import Causes
from tpu_debug.tracers.recording.divergence.values import covers, geometry, host_copy, payload_of

__all__ = ["Shadow", "Shadows"]


class Shadow:
    """A storage's CPU shadow: its values in a pure-CPU run, the device payload it shadows,
    and why they differ (``causes``, see :mod:`.triage`)."""

    __slots__ = ("causes", "host", "payload")

    def __init__(self, host: torch.Tensor, payload: Any, causes: frozenset = frozenset()) -> None:
        self.host = host  # contiguous, any shape (the payload's, or a covering tensor's)
        self.payload = payload
        self.causes = causes


class Shadows:
    """The shadows of the device storages (``before`` below: the payloads an op's
    argument storages held before it ran, by ``id`` of storage)."""

    def __init__(self) -> None:
        self._map: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, storage: Any) -> Shadow | None:
        return self._map.get(storage)

    def adopt_device(self, t: torch.Tensor, before: dict) -> None:
        """``t``'s shadow becomes the device's value (random or loaded data)."""
        storage = t.untyped_storage()
        entry = self._map.get(storage)
        if entry is None:
            return
        if entry.payload is before.get(id(storage), entry.payload) and not covers(t):
            geometry(entry.host, t).copy_(host_copy(to_jax(t), t.dtype))
            entry.payload = payload_of(t)
        else:
            del self._map[storage]

    def update(
        self, t: torch.Tensor, value: torch.Tensor | None, exact: bool, before: dict, causes: frozenset = frozenset()
    ) -> None:
        """``t`` now holds ``value`` in the CPU run (None: unknown); ``exact``: the device holds it
        too; ``causes``: why the value differs (a partial write keeps those of the rest)."""
        storage = t.untyped_storage()
        payload = payload_of(t)
        entry = self._map.get(storage)
        valid = entry is not None and entry.payload is before.get(id(storage), None)
        if value is None or tuple(value.shape) != tuple(t.shape):
            if entry is not None:
                del self._map[storage]
            return
        if value.dtype != t.dtype:
            value = value.to(t.dtype)
        if covers(t):
            if exact:
                if entry is not None:
                    del self._map[storage]
            else:
                self._map[storage] = Shadow(value.detach().contiguous(), payload, causes)
            return
        if valid:
            geometry(entry.host, t).copy_(value)
            entry.payload = payload
            if causes:
                entry.causes = Causes.merge(entry.causes, causes)
        elif exact:
            if entry is not None:
                del self._map[storage]
        else:
            host = host_copy(payload, t.dtype)
            geometry(host, t).copy_(value)
            self._map[storage] = Shadow(host, payload, causes)
