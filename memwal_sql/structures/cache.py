"""A cache of immutable structures built from a table's files, bounded in bytes.

Example:
    >>> LookupCache(1 << 20).get("kind", "uri", lambda: ("value", 10))
    'value'
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


class LookupCache:
    """Per-process LRU of immutable per-generation structures, bounded in bytes.

    Generations never change once flushed, so their primary-key index, bloom filter and (for
    small generations) their rows are read once and kept, as RocksDB keeps SST blocks in its
    block cache. ``MEMWAL_LOOKUP_CACHE_BYTES`` sets the budget (default 512 MiB; 0 disables).

    Example:
        >>> c = LookupCache(100)
        >>> c.get("k", "a", lambda: ("v", 60)), c.get("k", "b", lambda: ("w", 60))
        ('v', 'w')
        >>> c.nbytes  # "a" was evicted to stay within 100 bytes
        60
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        # Values of one kind are of one type: what that kind's load() returns.
        self._entries: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self,
        kind: str,
        uri: str,
        load: Callable[[], tuple[_T, int]],
        current: Callable[[_T], bool] | None = None,
    ) -> _T:
        """The cached value of ``(kind, uri)`` (if ``current`` accepts it), else ``load()``'s
        ``(value, nbytes)``, kept."""
        key = (kind, uri)
        with self._lock:
            if key in self._entries:
                value = self._entries[key][0]
                if current is None or current(value):
                    self._entries.move_to_end(key)
                    return value
        value, nbytes = load()
        with self._lock:
            if key in self._entries:
                self.nbytes -= self._entries.pop(key)[1]
            if nbytes <= self.max_bytes:
                self._entries[key] = (value, nbytes)
                self.nbytes += nbytes
                while self.nbytes > self.max_bytes:
                    _, (_, n) = self._entries.popitem(last=False)
                    self.nbytes -= n
        return value

    def peek(self, kind: str, uri: str) -> object:
        """The cached value of ``(kind, uri)``, or None; loads nothing, evicts nothing."""
        with self._lock:
            entry = self._entries.get((kind, uri))
        return None if entry is None else entry[0]

    def contains(self, kind: str, uri: str) -> bool:
        """Whether ``(kind, uri)`` is cached (it may be evicted the next moment)."""
        with self._lock:
            return (kind, uri) in self._entries

    def discard(self, key_prefix: str) -> None:
        """Drop the entries (of every kind) whose key starts with ``key_prefix``."""
        with self._lock:
            for key in [k for k in self._entries if k[1].startswith(key_prefix)]:
                self.nbytes -= self._entries.pop(key)[1]

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0


CACHE = LookupCache(int(os.environ.get("MEMWAL_LOOKUP_CACHE_BYTES", 512 << 20)))
