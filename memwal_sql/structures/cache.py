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
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from memwal_sql.errors import InvalidInputError

_T = TypeVar("_T")
#: An entry's key: its part, kind and uri.
_Key = tuple[str, str, str]

#: The environment variable that sets the budget of :func:`default_caches` (bytes; 0: off).
BUDGET_ENV = "MEMWAL_LOOKUP_CACHE_BYTES"
#: The budget of :func:`default_caches` when :data:`BUDGET_ENV` is not set: 512 MiB.
DEFAULT_BUDGET = 512 << 20


_HITS, _MISSES, _EVICTIONS = 0, 1, 2  # positions of a part's counters

#: The share of the budget the protected segment may hold (the rest is probation's), as the
#: protected segment of a segmented LRU (Caffeine's is 80%).
PROTECTED_SHARE = 0.8
#: How many budgets' worth of evicted keys a cache remembers (keys only, no values).
REMEMBERED = 3


@dataclass(frozen=True)
class CacheStats:
    """What a cache (or one part of it) answered since it was made: ``hits`` from memory,
    ``misses`` that called the loader, ``evictions`` to stay within the budget.

    Example:
        >>> c = LookupCache(100)
        >>> _ = c.get("k", "a", lambda: ("A", 60)), c.get("k", "a", lambda: ("A", 60))
        >>> c.stats()
        CacheStats(hits=1, misses=1, evictions=0)
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(
            self.hits + other.hits, self.misses + other.misses, self.evictions + other.evictions
        )


class LookupCache:
    """A scan-resistant cache of immutable structures, bounded in bytes.

    Generations never change once flushed, so their primary-key index, bloom filter and (for
    small generations) their rows are read once and kept, as RocksDB keeps SST blocks in its
    block cache. ``max_bytes`` is the budget (0 disables it). Entries are keyed by
    ``(part, kind, uri)``: :class:`Caches` gives each of its parts a name here, and counts each
    part's bytes, while one eviction order and one budget cover them all.

    The policy is a segmented LRU with 2Q's memory of evicted keys, so that a working set
    bigger than the budget keeps part of itself rather than thrashing (a plain LRU misses on
    every access of a cyclic pass over more than it holds):

    - a new entry enters the *probation* segment; hit again there, it moves to the
      *protected* segment (at most :data:`PROTECTED_SHARE` of the budget; what it pushes out
      goes back to probation, most recently used end);
    - eviction takes probation's least recently used entry first, protected's only when
      probation is empty: a one-off scan of new entries replaces other new entries, never
      the entries that were hit again;
    - evicted keys are remembered (a key alone, up to :data:`REMEMBERED` budgets of them), as
      2Q's A1out: a remembered key loaded again goes straight to the protected segment while
      it has room; once protected is full, only if it is asked for clearly more often than
      protected's least recently used entry (TinyLFU's admission, with counts halved every few
      accesses per entry held), which it pushes out; otherwise it enters probation at the
      evicting end (BIP's insertion), so that it goes before the entries it would push out.
      A cyclic pass over a working set up to ``REMEMBERED + 1`` budgets asks for each key as
      often: protected keeps what filled it and probation what it held, both hit on every
      pass (over 1.5 budgets, a pass loads only the third that does not fit), while entries
      that were hot once and no longer are give way.

    Each operation is O(1) (``OrderedDict`` segments), under one lock.

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
        self._probation: OrderedDict[_Key, tuple[Any, int]] = OrderedDict()
        self._protected: OrderedDict[_Key, tuple[Any, int]] = OrderedDict()
        self._protected_bytes = 0
        # Keys evicted lately, with the bytes they held: no values.
        self._ghosts: OrderedDict[_Key, int] = OrderedDict()
        self._ghost_bytes = 0
        # How often each key held or remembered was asked for, halved now and then.
        self._freq: dict[_Key, int] = {}
        self._accesses = 0
        self._part_bytes: dict[str, int] = {}
        # Per part: hits, misses, evictions (plain counters: a lookup asks the cache a few
        # dozen times, and a CacheStats object per ask cost 5% of a point lookup).
        self._stats: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        # Discards asked for by finalizers (see discard_later): appending takes no lock.
        self._pending: deque[tuple[str, str | None]] = deque()

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
            if self._pending:
                self._apply_pending()
            self._seen(key)
            entry = self._protected.get(key) or self._probation.get(key)
            if entry is not None and (current is None or current(entry[0])):
                self._touch(key, entry)
                self._tally(part, _HITS)
                return entry[0]
            self._tally(part, _MISSES)
        value, nbytes = load()
        with self._lock:
            if self._pending:
                self._apply_pending()
            held = key in self._protected or key in self._probation
            remembered = key in self._ghosts
            self._forget(key)
            if nbytes > self.max_bytes:
                self._freq.pop(key, None)  # neither held nor remembered: not counted
            else:
                self._freq.setdefault(key, 1)
                self._count(part, nbytes)
                # A stale value reloaded is a hit again; a remembered key is one too, but
                # takes protected room from its least recently used entry only if it is used
                # more often (see the class's docstring).
                if nbytes <= self._protected_room() and (
                    held or (remembered and self._worth_protecting(key, nbytes))
                ):
                    self._promote(key, (value, nbytes))
                else:
                    self._probation[key] = (value, nbytes)
                    if remembered:
                        # Evicted before it was asked for again, as every entry of a cyclic
                        # pass over more than the budget is: it goes first, rather than the
                        # entries it would push out, which the pass asks for again (BIP).
                        self._probation.move_to_end(key, last=False)
                self._evict()
        return value

    def resize(self, kind: str, uri: str, nbytes: int, *, part: str = "") -> None:
        """Count ``nbytes`` for the entry of ``(kind, uri)`` from now on (if it is held), and
        evict to stay within the budget (the entry itself if it outgrew it).

        For values that grow in place after they were loaded: a MemTable's index, extended
        as the MemTable grows; versions that keep the base's row masks they computed.

        Example:
            >>> c = LookupCache(100)
            >>> _ = c.get("k", "a", lambda: ([1], 8))
            >>> c.resize("k", "a", 90); c.nbytes
            90
        """
        key = (part, kind, uri)
        with self._lock:
            if self._pending:
                self._apply_pending()
            segment = self._protected if key in self._protected else self._probation
            entry = segment.get(key)
            if entry is None or entry[1] == nbytes:
                return
            segment[key] = (entry[0], nbytes)
            self._count(part, nbytes - entry[1])
            if segment is self._protected:
                self._protected_bytes += nbytes - entry[1]
                if nbytes > self._protected_room():
                    self._protected_bytes -= nbytes
                    self._probation[key] = self._protected.pop(key)
                else:
                    self._demote()
            self._evict()

    def peek(self, kind: str, uri: str, *, part: str = "") -> object:
        """The cached value of ``(kind, uri)``, or None; loads nothing, evicts nothing."""
        key = (part, kind, uri)
        with self._lock:
            if self._pending:
                self._apply_pending()
            entry = self._protected.get(key) or self._probation.get(key)
        return None if entry is None else entry[0]

    def contains(self, kind: str, uri: str, *, part: str = "") -> bool:
        """Whether ``(kind, uri)`` is cached (it may be evicted the next moment)."""
        key = (part, kind, uri)
        with self._lock:
            if self._pending:
                self._apply_pending()
            return key in self._protected or key in self._probation

    def discard(self, key_prefix: str, *, part: str | None = None) -> None:
        """Drop the entries (of every kind, of ``part`` or of every part) whose key starts
        with ``key_prefix``, and forget them."""
        with self._lock:
            self._apply_pending()
            self._discard(key_prefix, part)

    def discard_later(self, key_prefix: str, *, part: str | None = None) -> None:
        """:meth:`discard`, done at the cache's next use: for finalizers and weak-reference
        callbacks, which run wherever a garbage collection happens, possibly inside an
        operation of this cache in the same thread, its (non-reentrant) lock held."""
        self._pending.append((key_prefix, part))

    def clear(self, *, part: str | None = None) -> None:
        """Drop every entry (of ``part``, or of every part)."""
        self.discard("", part=part)

    def entries(self, *, part: str = "") -> list[tuple[str, str]]:
        """The ``(kind, uri)`` of ``part``'s entries, in eviction order: the next to go first
        (probation's least recently used first, then protected's)."""
        with self._lock:
            if self._pending:
                self._apply_pending()
            return [(k, u) for p, k, u in [*self._probation, *self._protected] if p == part]

    def part_bytes(self, part: str) -> int:
        """The bytes the entries of ``part`` hold."""
        with self._lock:
            if self._pending:
                self._apply_pending()
            return self._part_bytes.get(part, 0)

    def stats(self, *, part: str | None = None) -> CacheStats:
        """Hits, misses and evictions of ``part``'s entries (of every part's: None).

        Example:
            >>> c = LookupCache(100)
            >>> _ = c.get("k", "a", lambda: ("A", 1), part="x")
            >>> c.stats(part="x").misses, c.stats(part="y").misses, c.stats().misses
            (1, 0, 1)
        """
        with self._lock:
            if self._pending:
                self._apply_pending()
            if part is not None:
                return CacheStats(*self._stats.get(part, (0, 0, 0)))
            return sum((CacheStats(*n) for n in self._stats.values()), CacheStats())

    def _discard(self, key_prefix: str, part: str | None) -> None:
        for segment in (self._probation, self._protected, self._ghosts):
            for key in [
                k for k in segment if k[2].startswith(key_prefix) and (part is None or k[0] == part)
            ]:
                self._forget(key)
                self._freq.pop(key, None)

    def _apply_pending(self) -> None:
        """The discards :meth:`discard_later` deferred (the lock held)."""
        while self._pending:
            self._discard(*self._pending.popleft())

    def _protected_room(self) -> int:
        return int(self.max_bytes * PROTECTED_SHARE)

    def _seen(self, key: _Key) -> None:
        """Count an access of ``key`` (a key neither held nor remembered starts counting when
        it is kept); halve every count every four accesses per entry held, so that what was
        used often long ago counts less than what is used now (TinyLFU's reset)."""
        if key in self._freq:
            self._freq[key] += 1
        self._accesses += 1
        if self._accesses >= 4 * max(16, len(self._probation) + len(self._protected)):
            self._freq = {k: n >> 1 for k, n in self._freq.items()}
            self._accesses = 0

    def _worth_protecting(self, key: _Key, nbytes: int) -> bool:
        """Whether a remembered key loaded again goes to the protected segment: while it has
        room, or if the key is used more often than the protected entry it would push out."""
        if self._protected_bytes + nbytes <= self._protected_room():
            return True
        victim = next(iter(self._protected))
        # By more than one: halving rounds down, so keys asked for as often (a cyclic pass)
        # may differ by one, and must not push each other out.
        return self._freq.get(key, 0) > self._freq.get(victim, 0) + 1

    def _touch(self, key: _Key, entry: tuple[Any, int]) -> None:
        """A hit: most recently used in protected, moved there from probation if it fits."""
        if key in self._protected:
            self._protected.move_to_end(key)
        elif entry[1] > self._protected_room():
            self._probation.move_to_end(key)
        else:
            del self._probation[key]
            self._promote(key, entry)

    def _promote(self, key: _Key, entry: tuple[Any, int]) -> None:
        self._protected[key] = entry
        self._protected_bytes += entry[1]
        self._demote()

    def _demote(self) -> None:
        while self._protected_bytes > self._protected_room():
            # Pushed out of protected: probation's most recently used, a second chance.
            demoted, held = self._protected.popitem(last=False)
            self._protected_bytes -= held[1]
            self._probation[demoted] = held

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes:
            segment = self._probation or self._protected
            key, (_, nbytes) = next(iter(segment.items()))
            self._forget(key)
            self._tally(key[0], _EVICTIONS)
            self._ghosts[key] = nbytes
            self._ghost_bytes += nbytes
        # Remember keys of at most REMEMBERED budgets, and at most REMEMBERED keys per entry
        # held: a key costs what a held entry's key costs (a few hundred bytes, next to
        # entries of kilobytes), and a cyclic pass over up to REMEMBERED + 1 budgets finds
        # its keys remembered.
        held = len(self._probation) + len(self._protected)
        while self._ghosts and (
            self._ghost_bytes > REMEMBERED * self.max_bytes or len(self._ghosts) > REMEMBERED * held
        ):
            key, nbytes = self._ghosts.popitem(last=False)
            self._ghost_bytes -= nbytes
            self._freq.pop(key, None)

    def _forget(self, key: _Key) -> None:
        """Drop ``key`` from whichever segment holds it, entry or remembered key."""
        if key in self._probation:
            self._count(key[0], -self._probation.pop(key)[1])
        elif key in self._protected:
            nbytes = self._protected.pop(key)[1]
            self._protected_bytes -= nbytes
            self._count(key[0], -nbytes)
        elif key in self._ghosts:
            self._ghost_bytes -= self._ghosts.pop(key)

    def _count(self, part: str, nbytes: int) -> None:
        self.nbytes += nbytes
        self._part_bytes[part] = self._part_bytes.get(part, 0) + nbytes

    def _tally(self, part: str, counter: int) -> None:
        counts = self._stats.get(part)
        if counts is None:
            counts = self._stats[part] = [0, 0, 0]
        counts[counter] += 1


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

    def discard_later(self, key_prefix: str) -> None:
        """See :meth:`LookupCache.discard_later` (for finalizers)."""
        self._pool.discard_later(key_prefix, part=self.name)

    def resize(self, kind: str, uri: str, nbytes: int) -> None:
        """See :meth:`LookupCache.resize`."""
        self._pool.resize(kind, uri, nbytes, part=self.name)

    def clear(self) -> None:
        """Drop this part's entries."""
        self._pool.clear(part=self.name)

    def stats(self) -> CacheStats:
        """This part's hits, misses and evictions (see :meth:`LookupCache.stats`)."""
        return self._pool.stats(part=self.name)


class Caches:
    """The caches a table reads through, as named parts of one byte budget.

    - ``lookup``: generations' and the base table's key indexes, bloom filters, small
      generations' and base fragments' rows read whole, opened generations, key-to-region maps.
    - ``scan``: what deduplicating scans keep (newest versions per key, superseded-row masks),
      generations' columns, base data files' schemas.
    - ``search``: vector matrices of generations, full-text pieces, tokenizers, base index facts.
    - ``deletions``: the base table's deletion files, read as row masks.
    - ``memtable``: MemTables' in-memory indexes (dropped when their MemTable is flushed), and
      the WAL tails a reader replayed of other writers' regions, with their indexes.

    The parts share one budget and one eviction order rather than each having a fixed share: the
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

    def stats(self) -> CacheStats:
        """Every part's hits, misses and evictions together; ``caches.lookup.stats()`` gives
        one part's.

        Example:
            >>> caches = Caches(100)
            >>> _ = [caches.scan.get("k", "a", lambda: ("A", 10)) for _ in range(3)]
            >>> caches.stats(), caches.scan.stats().hits, caches.lookup.stats().hits
            (CacheStats(hits=2, misses=1, evictions=0), 2, 0)
        """
        return self._pool.stats()

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
