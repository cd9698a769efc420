"""Caches of immutable structures built from a table's files, bounded in bytes.

A table reads through one :class:`Caches`: named parts (lookup, scan, search, deletions,
MemTable indexes) that share one byte budget. ``mw.open_table(uri, cache=...)`` sets it: a
byte budget gives the table caches of its own, a :class:`Caches` object is shared with every
table given the same object, and nothing gives the process default (:func:`default_caches`).

Example:
    >>> caches = Caches(1 << 20)
    >>> caches.lookup.get("kind", "uri", lambda: ("value", 10))
    'value'
    >>> caches.lookup.nbytes, caches.search.nbytes, caches.nbytes
    (10, 0, 10)
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from memwal_sql.errors import InvalidInputError

_T = TypeVar("_T")

#: The environment variable that sets the budget of :func:`default_caches` (bytes; 0: off).
BUDGET_ENV = "MEMWAL_LOOKUP_CACHE_BYTES"
#: The budget of :func:`default_caches` when :data:`BUDGET_ENV` is not set: 512 MiB.
DEFAULT_BUDGET = 512 << 20


class LookupCache:
    """An LRU of immutable structures, bounded in bytes.

    Generations never change once flushed, so their primary-key index, bloom filter and (for
    small generations) their rows are read once and kept, as RocksDB keeps SST blocks in its
    block cache. ``max_bytes`` is the budget (0 disables it). Entries are keyed by
    ``(part, kind, uri)``: :class:`Caches` gives each of its parts a name here, and counts each
    part's bytes, while one LRU order and one budget cover them all.

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
        self._entries: OrderedDict[tuple[str, str, str], tuple[Any, int]] = OrderedDict()
        self._part_bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(
        self,
        kind: str,
        uri: str,
        load: Callable[[], tuple[_T, int]],
        current: Callable[[_T], bool] | None = None,
        *,
        part: str = "",
    ) -> _T:
        """The cached value of ``(kind, uri)`` (if ``current`` accepts it), else ``load()``'s
        ``(value, nbytes)``, kept."""
        key = (part, kind, uri)
        with self._lock:
            if key in self._entries:
                value = self._entries[key][0]
                if current is None or current(value):
                    self._entries.move_to_end(key)
                    return value
        value, nbytes = load()
        with self._lock:
            if key in self._entries:
                self._drop(key)
            if nbytes <= self.max_bytes:
                self._entries[key] = (value, nbytes)
                self._count(part, nbytes)
                while self.nbytes > self.max_bytes:
                    self._drop(next(iter(self._entries)))
        return value

    def peek(self, kind: str, uri: str, *, part: str = "") -> object:
        """The cached value of ``(kind, uri)``, or None; loads nothing, evicts nothing."""
        with self._lock:
            entry = self._entries.get((part, kind, uri))
        return None if entry is None else entry[0]

    def contains(self, kind: str, uri: str, *, part: str = "") -> bool:
        """Whether ``(kind, uri)`` is cached (it may be evicted the next moment)."""
        with self._lock:
            return (part, kind, uri) in self._entries

    def discard(self, key_prefix: str, *, part: str | None = None) -> None:
        """Drop the entries (of every kind, of ``part`` or of every part) whose key starts
        with ``key_prefix``."""
        with self._lock:
            for key in [
                k
                for k in self._entries
                if k[2].startswith(key_prefix) and (part is None or k[0] == part)
            ]:
                self._drop(key)

    def clear(self, *, part: str | None = None) -> None:
        """Drop every entry (of ``part``, or of every part)."""
        self.discard("", part=part)

    def entries(self, *, part: str = "") -> list[tuple[str, str]]:
        """The ``(kind, uri)`` of ``part``'s entries, least recently used first."""
        with self._lock:
            return [(k, u) for p, k, u in self._entries if p == part]

    def part_bytes(self, part: str) -> int:
        """The bytes the entries of ``part`` hold."""
        with self._lock:
            return self._part_bytes.get(part, 0)

    def _count(self, part: str, nbytes: int) -> None:
        self.nbytes += nbytes
        self._part_bytes[part] = self._part_bytes.get(part, 0) + nbytes

    def _drop(self, key: tuple[str, str, str]) -> None:
        self._count(key[0], -self._entries.pop(key)[1])


class CachePart:
    """One named part of a :class:`Caches`: the same calls as :class:`LookupCache`, on its
    own entries, within the budget every part of its :class:`Caches` shares.

    Example:
        >>> caches = Caches(100)
        >>> caches.search.get("vectors", "g1", lambda: ("m", 80))
        'm'
        >>> caches.lookup.get("rows", "g1", lambda: ("r", 40)), caches.search.nbytes
        ('r', 0)
    """

    def __init__(self, pool: LookupCache, name: str) -> None:
        self.name = name
        self._pool = pool

    @property
    def max_bytes(self) -> int:
        """The budget this part shares with the others of its :class:`Caches`."""
        return self._pool.max_bytes

    @property
    def nbytes(self) -> int:
        """The bytes this part's entries hold."""
        return self._pool.part_bytes(self.name)

    def get(
        self,
        kind: str,
        uri: str,
        load: Callable[[], tuple[_T, int]],
        current: Callable[[_T], bool] | None = None,
    ) -> _T:
        """See :meth:`LookupCache.get`."""
        return self._pool.get(kind, uri, load, current, part=self.name)

    def peek(self, kind: str, uri: str) -> object:
        """See :meth:`LookupCache.peek`."""
        return self._pool.peek(kind, uri, part=self.name)

    def contains(self, kind: str, uri: str) -> bool:
        """See :meth:`LookupCache.contains`."""
        return self._pool.contains(kind, uri, part=self.name)

    def entries(self) -> list[tuple[str, str]]:
        """See :meth:`LookupCache.entries`."""
        return self._pool.entries(part=self.name)

    def discard(self, key_prefix: str) -> None:
        """See :meth:`LookupCache.discard`."""
        self._pool.discard(key_prefix, part=self.name)

    def clear(self) -> None:
        """Drop this part's entries."""
        self._pool.clear(part=self.name)


class Caches:
    """The caches a table reads through, as named parts of one byte budget.

    - ``lookup``: generations' and the base table's key indexes, bloom filters, small
      generations' and base fragments' rows read whole, opened generations, key-to-region maps.
    - ``scan``: what deduplicating scans keep (newest versions per key, superseded-row masks),
      generations' columns, base data files' schemas.
    - ``search``: vector matrices of generations, full-text pieces, tokenizers, base index facts.
    - ``deletions``: the base table's deletion files, read as row masks.
    - ``memtable``: MemTables' in-memory indexes (dropped when their MemTable is flushed).

    The parts share one budget and one LRU order rather than each having a fixed share: the
    workload decides how the memory splits (a lookup-heavy process gives it to key indexes, a
    search-heavy one to vector matrices), nothing is stranded in an idle part, and the policy
    is the one the benchmarks measured with a single cache. Each part counts its own bytes
    (``caches.search.nbytes``). Tables given separate ``Caches`` never evict each other's
    entries; tables given the same object share its budget.

    A ``Caches`` pickled to another process (a Spark executor) arrives as that process's
    :func:`default_caches`: cached structures are never shipped.

    Thresholds such as "a fragment read whole takes at most 1/16 of the cache" are shares of
    ``max_bytes``. Setting ``max_bytes`` takes effect at the next insertion (0: nothing is kept).

    Example:
        >>> import memwal_sql as mw, pyarrow as pa, tempfile
        >>> schema = pa.schema([pa.field("id", pa.int64(), False)])
        >>> tbl = mw.create_table(tempfile.mkdtemp(), schema, primary_key="id", cache=64 << 20)
        >>> tbl.caches.max_bytes
        67108864
    """

    def __init__(self, max_bytes: int = DEFAULT_BUDGET) -> None:
        self._pool = LookupCache(max_bytes)
        self.lookup = CachePart(self._pool, "lookup")
        self.scan = CachePart(self._pool, "scan")
        self.search = CachePart(self._pool, "search")
        self.deletions = CachePart(self._pool, "deletions")
        self.memtable = CachePart(self._pool, "memtable")

    @property
    def max_bytes(self) -> int:
        """The byte budget every part shares."""
        return self._pool.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._pool.max_bytes = value

    @property
    def nbytes(self) -> int:
        """The bytes every part's entries hold together."""
        return self._pool.nbytes

    def clear(self) -> None:
        """Drop every part's entries."""
        self._pool.clear()

    def __repr__(self) -> str:
        return f"Caches(max_bytes={self.max_bytes}, nbytes={self.nbytes})"

    def __reduce__(self) -> tuple[Callable[[], Caches], tuple[()]]:
        # What is cached is this process's memory: a plan shipped to another process (Spark
        # sends scan plans to its executors) reads through that process's default caches, as
        # every read there did when the cache was one per process.
        return default_caches, ()

    @classmethod
    def of(cls, cache: int | Caches | None) -> Caches:
        """The caches ``open_table(..., cache=cache)`` reads through: ``cache`` itself if it is
        a :class:`Caches` (shared), new caches of ``cache`` bytes if it is an int, else the
        process default (:func:`default_caches`).

        Example:
            >>> shared = Caches(1 << 20)
            >>> Caches.of(shared) is shared, Caches.of(1 << 10).max_bytes
            (True, 1024)
        """
        if isinstance(cache, Caches):
            return cache
        if cache is None:
            return default_caches()
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
            raise InvalidInputError(
                f"cache must be a byte budget (an int >= 0) or a Caches object, not {cache!r}"
            )
        return cls(cache)


_default: Caches | None = None
_default_lock = threading.Lock()


def default_caches() -> Caches:
    """The process default :class:`Caches`, which every table opened without ``cache=`` shares
    (as they shared one cache before tables owned theirs): created at the first such open, with
    the budget :data:`BUDGET_ENV` names (default :data:`DEFAULT_BUDGET`; 0 disables it).

    Example:
        >>> default_caches() is default_caches()
        True
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Caches(int(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET)))
        return _default
