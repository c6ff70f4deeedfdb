"""Bounded caches: the runtime's executables and index arrays, least recently used out first.

A long run meets an unbounded number of shapes (a growing sequence length, a
last batch of another size, a sweep over models), and every cached executable
holds compiled code, its lowered module and its compile record. Each runtime
cache is an :class:`LruCache` whose bound is a field of ``runtime.config``
(read on every insertion, so a new setting applies from the next one); what
falls out is counted and handed to the cache's ``on_evict``, which for
executables tells the tracers (``probes`` ``on_evict``). A later call with an
evicted key compiles it again, like any first call.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["LruCache", "CacheCounts", "cache_counts"]

K = TypeVar("K")
V = TypeVar("V")


@dataclasses.dataclass(frozen=True, slots=True)
class CacheCounts:
    """How full one runtime cache is and how much it has let go.

    Attributes:
        name: what the cache holds (``"eager executables"``, ...).
        entries: entries held now.
        weight: their total weight (bytes for a byte-bounded cache; else ``entries``).
        limit: the bound in force (entries, or bytes for a byte-bounded cache).
        evicted: entries dropped to stay within the bound since the process started.
    """

    name: str
    entries: int
    weight: int
    limit: int
    evicted: int


class LruCache(Generic[K, V]):
    """A map holding at most ``limit()`` weight of entries, least recently used dropped first.

    Args:
        name: what it holds, for :func:`cache_counts`.
        limit: the bound, read on each insertion (a config field).
        weigh: an entry's weight; every entry weighs 1 (``limit`` counts entries) by default.
        uses: ``uses(key, value)``, a count the entry's user raises on every use (an
            executable's call count). With it, a hot path reads entries through
            ``lookup`` (the plain dict ``get``: no recency update, nothing beyond the
            lookup it would do anyway) and recency is read off the counts when an
            entry must go: the oldest entry used since the cache last looked gets a
            second chance at the recent end (the CLOCK approximation of LRU).
        on_evict: called as ``on_evict(key, value)`` for each entry dropped to respect the
            bound, after the cache's lock is released (so it may use the cache).

    Reads take no lock: ``lookup``, and ``get``'s lookup and move to the recent end, are
    single C calls on an ``OrderedDict``, atomic under the GIL.

    Example:
        >>> cache = LruCache("demo", lambda: 2)
        >>> for k in "abc":
        ...     cache.put(k, k.upper())
        >>> cache.keys(), cache.evicted
        (['b', 'c'], 1)
    """

    def __init__(
        self,
        name: str,
        limit: Callable[[], int],
        *,
        weigh: Callable[[V], int] | None = None,
        uses: Callable[[K, V], int] | None = None,
        on_evict: Callable[[K, V], None] | None = None,
    ) -> None:
        self.name = name
        self.evicted = 0
        self._limit = limit
        self._weigh = weigh
        self._uses = uses
        self._on_evict = on_evict
        self._entries: collections.OrderedDict[K, V] = collections.OrderedDict()
        self._weights: dict[K, int] = {}
        self._marks: dict[K, int] = {}  # with ``uses``: each entry's count when last looked at
        self._weight = 0
        self._lock = threading.Lock()
        self.lookup: Callable[[K], V | None] = self._entries.get
        _registry.append(self)

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        entries = self._entries
        value = entries.get(key)
        if value is not None:
            try:
                entries.move_to_end(key)
            except KeyError:  # evicted by another thread between the two calls
                pass
        return value

    def put(self, key: K, value: V) -> None:
        """Insert or replace ``key``, then drop least recently used entries over the bound.

        An entry heavier than the whole bound is not kept (nothing else is dropped for it).
        With ``uses``, ``put`` is taken to come just before the use the entry was made for
        (compile, cache, call): the entry counts as recent once used again after that."""
        weight = self._weigh(value) if self._weigh is not None else 1
        limit = int(self._limit())
        with self._lock:
            self._remove(key)
            if weight > limit:
                return  # heavier than the whole bound: used once, not kept
            dropped = self._shrink(limit - weight)
            self._entries[key] = value
            self._weights[key] = weight
            self._weight += weight
            if self._uses is not None:
                self._marks[key] = self._uses(key, value) + 1
        self._notify(dropped)

    def pop(self, key: K) -> V | None:
        """Remove ``key`` (not counted as an eviction); its value or None."""
        with self._lock:
            return self._remove(key)

    def clear(self) -> list[tuple[K, V]]:
        """Remove everything (not counted as evictions); returns what was held."""
        with self._lock:
            held = list(self._entries.items())
            self._entries.clear()
            self._weights.clear()
            self._marks.clear()
            self._weight = 0
        return held

    def counts(self) -> CacheCounts:
        return CacheCounts(self.name, len(self._entries), self._weight, int(self._limit()), self.evicted)

    def keys(self) -> list[K]:
        return list(self._entries.keys())

    def values(self) -> list[V]:
        return list(self._entries.values())

    def items(self) -> list[tuple[K, V]]:
        return list(self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())  # a snapshot: safe to delete while iterating

    def __delitem__(self, key: K) -> None:
        """Remove ``key`` (not counted as an eviction)."""
        if self.pop(key) is None:
            raise KeyError(key)

    def _remove(self, key: K) -> V | None:
        value = self._entries.pop(key, None)
        if value is not None:
            self._weight -= self._weights.pop(key)
            self._marks.pop(key, None)
        return value

    def _shrink(self, limit: int) -> list[tuple[K, V]]:
        """Drop the least recently used entries until the weight is within ``limit`` (lock
        held). With ``uses``, each entry is passed over at most once per call: the loop
        ends within twice the entries."""
        dropped: list[tuple[K, V]] = []
        entries, uses, marks = self._entries, self._uses, self._marks
        while self._weight > limit:
            key, value = entries.popitem(last=False)
            if uses is not None:
                count = uses(key, value)
                if count != marks[key]:  # used since last looked at: a second chance
                    marks[key] = count
                    entries[key] = value
                    continue
                del marks[key]
            self._weight -= self._weights.pop(key)
            dropped.append((key, value))
        self.evicted += len(dropped)
        return dropped

    def _notify(self, dropped: list[tuple[K, V]]) -> None:
        if self._on_evict is not None:
            for key, value in dropped:
                self._on_evict(key, value)


_registry: list[LruCache[Any, Any]] = []


def cache_counts() -> tuple[CacheCounts, ...]:
    """Entries, weight, bound and evictions of every runtime cache.

    Example::

        {c.name: c.evicted for c in tpu_debug.runtime.cache_counts()}
        # {'eager executables': 0, 'compiled programs': 0, ...}
    """
    return tuple(cache.counts() for cache in list(_registry))
