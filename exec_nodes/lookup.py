"""Point-lookup operators: probe each source by key, newest first, and stop at the first hit.

* A leaf with :class:`~exec_nodes.source.Lookup` access finds the newest row of each requested
  key in *one* source: a flushed generation through its ``_pk_index`` (sorted keys to row
  offsets), a MemTable through a key index, the base table through its key index or btree.
  What is immutable (a generation's index, filter and, when small, rows; the base key index of
  one version) is kept in the table's byte-bounded lookup cache (``caches.lookup``).
* :class:`BloomFilterGuardExec` passes on only the keys a generation's ``bloom_filter.bin`` may
  hold, so a miss costs a hash and a bit test, not an index probe.
* :class:`CoalesceFirstExec` runs its children newest first, each on the keys still unresolved;
  a key resolved by a tombstone is resolved as absent.

Keys travel as Arrow tables of the primary-key columns; each source is probed once per batch of
keys, never once per key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec, index_keys, stored_keys
from exec_nodes.regions import raise_if_shared
from exec_nodes.source import KeyedExec, KeyProbe, Probe
from memwal_sql.errors import ObjectNotFoundError
from memwal_sql.formats.bloom import BloomFilter, pk_hashes
from memwal_sql.formats.generation import (
    read_generation_pk_index,
    verify_bloom_filter,
)
from memwal_sql.formats.source_rows import (
    TOMBSTONE,
    empty_rows,
)
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet, last_per_key

HASH = "__memwal_key_hash"  # keys may carry their bloom hashes, computed once per lookup


class GenerationIndexExec(KeyedExec):
    """One key index over a region's flushed generations: the newest version of each key
    across all of them (newest generation, then highest row), built once from their
    ``_pk_index`` files and cached, as the set of generations never changes.

    Probing it costs one vectorised search and then one take per generation that holds a
    hit, where probing generation by generation costs a bloom test and an index search for
    each; for a batch of keys that the region spec cannot route (every region is asked for
    every key) that is most of a lookup's time. Its children are the generations.
    """

    name = "GenerationIndexExec"

    def __init__(
        self,
        generations: Sequence[GenerationSourceExec],
        primary_key: Sequence[str],
        schema: pa.Schema,
        keys: pa.Table | None = None,
        *,
        caches: Caches,
    ) -> None:
        self.caches = caches
        self.generations = list(generations)  # newest first
        self._cache_key = self.cache_key(self.generations)
        self.primary_key = list(primary_key)
        self._schema = schema
        self.keys = keys
        self.probes = 0

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def children(self) -> list[ExecNode]:
        return list(self.generations)

    def describe(self) -> str:
        return f"{self.name}: {len(self.generations)} generation(s), newest version per key"

    def _index(self) -> tuple[KeySet, np.ndarray, np.ndarray]:
        gens, pk = self.generations, self.primary_key

        def load() -> tuple[tuple[KeySet, np.ndarray, np.ndarray], int]:
            parts, ranks = [], []
            for i, g in enumerate(gens):
                index = read_generation_pk_index(g.uri, g.storage_options)
                parts.append(stored_keys(index, pk))
                ids = index.column("ids").to_numpy().astype(np.int64)
                ranks.append(((len(gens) - i) << 32) | ids)  # newer generation ranks higher
            keyset, best = KeySet.indexing(
                *last_per_key(pa.concat_tables(parts), np.concatenate(ranks))
            )
            which = (len(gens) - (best >> 32)).astype(np.int64)  # position, newest first
            offsets = best & 0xFFFFFFFF
            return (keyset, which, offsets), keyset.nbytes + which.nbytes + offsets.nbytes

        return self.caches.lookup.get("generation_index", self._cache_key, load)

    @staticmethod
    def cache_key(generations: Sequence[GenerationSourceExec]) -> str:
        """The lookup-cache key of the merged index of ``generations``."""
        return "\n".join(g.uri or "" for g in generations)

    @classmethod
    def is_cached(cls, generations: Sequence[GenerationSourceExec], caches: Caches) -> bool:
        """Whether the merged key index of these generations is in ``caches`` already (then
        probing it beats a bloom test per generation even for one key)."""
        return caches.lookup.contains("generation_index", cls.cache_key(generations))

    def probe(self, keys: pa.Table) -> Probe:
        self.probes += 1
        if keys.num_rows == 0:
            return Probe(empty_rows(self.schema), np.zeros(0, dtype=bool))
        keyset, which, offsets = self._index()
        pos = keyset.positions(index_keys(keys, self.primary_key))
        hit = pos >= 0
        found = pos[hit]
        parts = [
            self.generations[g].take_offsets(offsets[found[which[found] == g]])
            for g in np.unique(which[found])
        ]
        rows = pa.concat_tables(parts) if parts else empty_rows(self.schema)
        return Probe(rows, hit)


class BloomFilterGuardExec(KeyedExec):
    """Lets through only the keys a generation's bloom filter may hold."""

    name = "BloomFilterGuardExec"

    def __init__(
        self,
        child: GenerationSourceExec,
        store: ObjectStore,
        bloom_path: str,
        keys: pa.Table | None = None,
    ) -> None:
        self.keys = keys
        self.child = child
        self.store = store
        self.bloom_path = bloom_path
        self.skipped = 0  # keys the filter ruled out
        self.passed = 0

    @property
    def schema(self) -> pa.Schema:
        return self.child.schema

    @property
    def children(self) -> list[ExecNode]:
        return [self.child]

    def describe(self) -> str:
        return f"{self.name}: {self.bloom_path.rsplit('/', 2)[-2]}/bloom_filter.bin"

    def probe(self, keys: pa.Table) -> Probe:
        """As :meth:`~exec_nodes.source.SourceLeaf.probe`, asking the child only for keys the
        filter passes."""

        def load() -> tuple[BloomFilter | None, int]:
            try:
                data = self.store.get(self.bloom_path)
            except ObjectNotFoundError:
                return None, 64  # no filter: every key passes
            verify_bloom_filter(self.child.uri, self.child.storage_options)
            return BloomFilter.from_bytes(data), len(data)

        # A generation's filter is kept with its key index, in the child's lookup cache.
        bloom = self.child.caches.lookup.get("bloom", self.store.uri_for(self.bloom_path), load)
        if bloom is None:
            self.passed += keys.num_rows
            return self.child.probe(keys)
        hashes = keys.column(HASH).to_numpy() if HASH in keys.column_names else pk_hashes(keys)
        mask = bloom.might_contain(hashes)
        passed = np.nonzero(mask)[0]
        self.skipped += keys.num_rows - len(passed)
        self.passed += len(passed)
        if len(passed) == 0:
            return Probe(empty_rows(self.schema), mask)
        rows, found = self.child.probe(keys.take(pa.array(passed)))
        hit = np.zeros(keys.num_rows, dtype=bool)
        hit[passed[found]] = True
        return Probe(rows, hit)


class CoalesceFirstExec(KeyedExec):
    """Children newest first; each sees only the keys no newer child resolved."""

    name = "CoalesceFirstExec"

    def __init__(
        self,
        children: Sequence[KeyedExec],
        primary_key: Sequence[str],
        schema: pa.Schema,
        label: str = "",
        keys: pa.Table | None = None,
        region_id: str | None = None,
        routed: bool = False,
    ) -> None:
        self._children = list(children)
        self.primary_key = list(primary_key)
        self._schema = schema
        self.label = label
        self.keys = keys
        self.region_id = region_id
        self.routed = routed  # asked only the keys the region spec routes to this region

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def children(self) -> list[ExecNode]:
        return list(self._children)

    def describe(self) -> str:
        keys = "" if self.keys is None else f" {self.keys.num_rows} key(s),"
        return f"{self.name}: {self.label}{keys} newest first, stop at the first hit".strip()

    def probe(self, keys: pa.Table) -> Probe:
        """The rows the newest child holding each key has (tombstones included)."""
        found = []
        open_rows = np.arange(keys.num_rows)  # the keys no child has resolved yet
        for child in self._children:
            if len(open_rows) == 0:
                break
            asked = keys if len(open_rows) == keys.num_rows else keys.take(pa.array(open_rows))
            rows, hit = child.probe(asked)
            if rows.num_rows:
                found.append(rows)
                open_rows = open_rows[~hit]
        resolved = np.ones(keys.num_rows, dtype=bool)
        resolved[open_rows] = False
        table = pa.concat_tables(found) if found else empty_rows(self._schema)
        return Probe(table, resolved)


class PointLookupExec(ExecNode):
    """The root of a point lookup: each region's :class:`CoalesceFirstExec` on its keys, then
    the base table for the keys no region resolved; tombstones dropped.

    The base table's random reads dominate a big batch and Lance releases the GIL for them:
    from ``parallel_keys`` keys on, the base is probed for every key on another thread while
    this one resolves the regions (mostly in-memory probes), and its rows for keys a region
    resolved are dropped. For a few keys the thread hand-off costs more than it saves.
    """

    name = "PointLookupExec"

    def __init__(
        self,
        keys: pa.Table,
        regions: Sequence[CoalesceFirstExec],
        base: BaseSourceExec,
        parallel_keys: int = 256,
        *,
        tombstones: bool = False,
    ) -> None:
        self.keys = keys
        self.regions = list(regions)
        self.base = base
        self.parallel_keys = parallel_keys
        self.tombstones = tombstones  # give the tombstone of a deleted key, not drop it

    @property
    def schema(self) -> pa.Schema:
        return self.base.schema

    @property
    def children(self) -> list[ExecNode]:
        return [*self.regions, self.base]

    def describe(self) -> str:
        return (
            f"{self.name}: {self.keys.num_rows} key(s), {len(self.regions)} region(s), "
            "then the base for keys no region resolved"
        )

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        pk = self.base.primary_key
        early = None
        if self.keys.num_rows >= self.parallel_keys:
            early = _POOL.submit(self.base.probe, self.keys)
        found = []
        for region in self.regions:
            assert region.keys is not None  # region_lookups binds each region's keys
            found.append(region.probe(region.keys).rows)
        raise_if_shared([(r.region_id, rows, r.routed) for r, rows in zip(self.regions, found)], pk)
        # The base answers only the keys *no* region resolved (found or deleted there): a key
        # that could not be routed was asked of every region, and one region's answer is
        # newer than the base's.
        resolved = [r.select(pk) for r in found if r.num_rows]
        rest = self.keys.select(pk)
        if resolved:
            rest = rest.filter(
                pa.array(~KeySet(distinct_keys(pa.concat_tables(resolved))).contains(rest))
            )
        if early is not None:
            base_rows = early.result().rows
            if base_rows.num_rows and rest.num_rows < self.keys.num_rows:
                base_rows = base_rows.filter(pa.array(KeySet(rest).contains(base_rows.select(pk))))
            found.append(base_rows)
        elif rest.num_rows:
            found.append(self.base.probe(rest).rows)
        rows = pa.concat_tables(found) if found else empty_rows(self.schema)
        yield from (rows if self.tombstones else live_rows(rows)).to_batches()


_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memwal-lookup")


def distinct_keys(keys: pa.Table) -> pa.Table:
    """The distinct rows of a table of key columns."""
    if keys.num_rows <= 1:
        return keys
    if keys.num_columns == 1:
        return pa.table({keys.column_names[0]: pc.unique(keys.column(0).combine_chunks())})
    return keys.group_by(keys.column_names, use_threads=False).aggregate([])


def live_rows(rows: pa.Table) -> pa.Table:
    """Drop tombstones (a tombstone resolves its key as absent)."""
    tombstones = rows.column(TOMBSTONE)
    if rows.num_rows == 0 or not pc.any(tombstones).as_py():
        return rows
    # A lookup's rows come in one small chunk per source; filtering pays per chunk.
    rows = rows.combine_chunks()
    return rows.filter(pc.invert(rows.column(TOMBSTONE)))


__all__ = [
    "BloomFilterGuardExec",
    "CoalesceFirstExec",
    "GenerationIndexExec",
    "KeyProbe",
    "KeyedExec",
    "PointLookupExec",
    "Probe",
    "distinct_keys",
    "live_rows",
]
