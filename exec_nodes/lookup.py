"""Point-lookup operators: probe each source by key, newest first, and stop at the first hit.

* :class:`GenerationSourceExec` finds the newest row of each requested key in *one* source: a flushed
  generation through its ``_pk_index`` (sorted keys to row offsets), a MemTable through a key
  index; :class:`BaseLookupExec` does it for the base table through its key index or btree.
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

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.generation_source import GenerationSourceExec, index_keys, stored_keys
from exec_nodes.regions import raise_if_shared
from exec_nodes.source import KeyedExec, KeyProbe, Probe, whole_fragment
from memwal_sql.compat.lance import data_file_paths, take_rows
from memwal_sql.errors import ObjectNotFoundError
from memwal_sql.formats.bloom import BloomFilter, pk_hashes
from memwal_sql.formats.generation import (
    read_generation_pk_index,
    verify_bloom_filter,
)
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    ROWADDR,
    TOMBSTONE,
    conform,
    empty_rows,
    gather,
    stored_columns,
)
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet, last_per_key
from memwal_sql.structures.rowmask import split_addresses

HASH = "__memwal_key_hash"  # keys may carry their bloom hashes, computed once per lookup


_KEY_INDEX_ROW_BYTES = 16  # a cached base key index entry: key and row address, in key order
_KEY_INDEX_SHARE = 4  # a base's key index may take a quarter of the cache
# Lookups read a base's fragments whole only while all of them, with its key index, fit in
# half the cache: a batch of lookups touches every fragment, and a plain LRU cache over
# budget evicts what the next batch needs, which is slower than random takes
# (benchmarks/bench_lookup.py with a base of several million rows). Their size in memory is
# estimated at 3x their stored size (what bench_read's rows take in Arrow).
_WHOLE_BASE_SHARE = 2
_MEMORY_PER_STORED_BYTE = 3


def fragment_rows_key(uri: str, fragment: lance.LanceFragment) -> str:
    """The lookup cache's key (kind ``"rows"``) of a base fragment's rows kept whole: data
    files are immutable and uniquely named, so the same files hold the same rows."""
    return f"{uri}#{','.join(data_file_paths(fragment))}"


@dataclass(frozen=True)
class _BaseFacts:
    rows: int
    cache_key: str  # names the version's rows in the lookup cache
    stored_bytes: int | None  # of every data file; None when a file's size is not recorded


# Per opened dataset (the planner and every probe of a lookup ask): its row count and
# cache key cost a deletion-file read and a fragment listing.
_BASE_FACTS: weakref.WeakKeyDictionary[lance.LanceDataset, _BaseFacts] = weakref.WeakKeyDictionary()


def _base_facts(ds: lance.LanceDataset) -> _BaseFacts:
    facts = _BASE_FACTS.get(ds)
    if facts is None:
        frags = ds.get_fragments()
        # Data file names are random: they tell a table recreated at the same uri apart.
        files = [data_file_paths(fr)[0] for fr in (frags[0], frags[-1])] if frags else []
        sizes = [f.file_size_bytes for fr in frags for f in fr.data_files()]
        stored = sum(n for n in sizes if n is not None) if None not in sizes else None
        facts = _BaseFacts(ds.count_rows(), f"{ds.uri}@{ds.version}:{files}", stored)
        _BASE_FACTS[ds] = facts
    return facts


class LookupSource(KeyedExec):
    """One source that can be probed by key; counts probes (tests check what was touched)."""

    def __init__(
        self,
        region_id: str | None,
        generation: int,
        schema: pa.Schema,
        primary_key: Sequence[str],
        keys: pa.Table | None = None,
    ) -> None:
        self.keys = keys
        self.region_id = region_id
        self.generation = generation
        self._schema = schema
        self.primary_key = list(primary_key)
        self.probes = 0
        self._lock = threading.Lock()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def probe(self, keys: pa.Table) -> Probe:
        """The newest row (tombstones included) of each of ``keys`` present in this source,
        and a mask of the keys that were present."""
        with self._lock:
            self.probes += 1
        if keys.num_rows == 0:
            return Probe(empty_rows(self.schema), np.zeros(0, dtype=bool))
        return self._probe(keys)

    def _probe(self, keys: pa.Table) -> Probe:
        raise NotImplementedError

    def _take_newest(
        self,
        keys: pa.Table,
        keyset: KeySet,
        newest: np.ndarray,
        take: Callable[[np.ndarray], pa.Table],
    ) -> Probe:
        """Probe ``keyset`` and ``take`` the rows ``newest`` names for the keys it holds."""
        pos = keyset.positions(keys)
        hit = pos >= 0
        if not hit.any():
            return Probe(empty_rows(self.schema), hit)
        return Probe(take(newest[pos[hit]]), hit)


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
                index = read_generation_pk_index(g.uri, g.storage_options)  # type: ignore[arg-type]
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


class BaseLookupExec(LookupSource):
    """Newest row per key in the base table, found through an index, never a scan.

    The base table's keys and row addresses at the pinned version are read once (one column,
    like Lance's own btree pages) and cached, so a batch of keys costs a vectorised probe and
    then the rows that exist: from small fragments kept whole in the lookup cache, else one
    random ``take``. A base table whose key index would not fit the lookup cache is probed
    through its primary-key btree instead (a filtered Lance read).
    """

    name = "BaseLookupExec"

    def __init__(
        self,
        dataset: lance.LanceDataset,
        schema: pa.Schema,
        primary_key: Sequence[str],
        fragment_ids: Sequence[int] | None = None,
        keys: pa.Table | None = None,
        *,
        caches: Caches,
    ) -> None:
        super().__init__(None, BASE_GENERATION, schema, primary_key, keys)
        self.caches = caches
        self.dataset = dataset
        self.fragment_ids = None if fragment_ids is None else list(fragment_ids)

    def describe(self) -> str:
        indexed = any(
            d.field_names == [self.primary_key[0]] and d.index_type == "BTree"
            for d in self.dataset.describe_indices()
        )
        how = "btree"
        if self._fits_cache():
            how = "cached key index, " + (
                "rows from whole fragments" if self._fragments_fit_cache() else "random takes"
            )
        frags = "" if self.fragment_ids is None else f" fragments={self.fragment_ids}"
        return (
            f"{self.name}: version={self.dataset.version} gen={BASE_GENERATION} "
            f"key={self.primary_key} btree={'yes' if indexed else 'no (scan)'} via {how}" + frags
        )

    def uses_key_index(self) -> bool:
        """True if keys are probed in the cached key index, not through the btree."""
        return self._fits_cache()

    def _fits_cache(self) -> bool:
        return (
            _base_facts(self.dataset).rows * _KEY_INDEX_ROW_BYTES
            <= self.caches.max_bytes // _KEY_INDEX_SHARE
        )

    def addresses_of(self, keys: pa.Table) -> np.ndarray | None:
        """The sorted row addresses of the base rows holding ``keys`` (keys it does not hold
        are left out), from the cached key index; None when the base is too big to keep one.

        Example:
            ``BaseLookupExec(ds, schema, ["id"], caches=caches).addresses_of(pa.table({"id": [3]}))``
        """
        index = self._key_index()
        if index is None:
            return None
        keyset, addrs = index
        pos = keyset.positions(keys.select(self.primary_key))
        return np.sort(addrs[pos[pos >= 0]].astype(np.uint64))

    def _key_index(self) -> tuple[KeySet, np.ndarray] | None:
        if not self._fits_cache():
            return None
        ds, pk = self.dataset, self.primary_key

        def load() -> tuple[tuple[KeySet, np.ndarray], int]:
            table = ds.to_table(columns=pk, with_row_address=True)
            keyset, addrs = KeySet.indexing(table.select(pk), table.column(ROWADDR).to_numpy())
            return (keyset, addrs), keyset.nbytes + addrs.nbytes

        return self.caches.lookup.get("base_keys", _base_facts(ds).cache_key, load)

    def _probe(self, keys: pa.Table) -> Probe:
        names = stored_columns(self.schema, self.dataset)
        index = self._key_index()
        if index is not None:
            keyset, addrs = index
            return self._take_newest(
                keys.select(self.primary_key),
                keyset,
                addrs,
                lambda hit: self._take_addresses(hit, names),
            )
        fragments = (
            None if self.fragment_ids is None else [self._fragment(i) for i in self.fragment_ids]
        )
        if fragments == []:
            rows = (
                empty_rows(self.dataset.schema)
                .select(names)
                .append_column(ROWADDR, pa.array([], pa.uint64()))
            )
        else:
            rows = self.dataset.scanner(
                columns=names,
                fragments=fragments,
                filter=_key_filter(keys, self.primary_key),
                with_row_address=True,
            ).to_table()
        if len(self.primary_key) > 1 and rows.num_rows:  # the filter was on the first column
            rows = rows.filter(
                pa.array(
                    KeySet(keys.select(self.primary_key)).contains(rows.select(self.primary_key))
                )
            )
        found = KeySet(rows.select(self.primary_key)).contains(keys.select(self.primary_key))
        return Probe(
            self._tagged(rows.drop_columns([ROWADDR]), rows.column(ROWADDR).cast(pa.uint64())),
            found,
        )

    def _take_addresses(self, addrs: np.ndarray, names: list[str]) -> pa.Table:
        """The rows at ``addrs``, in order: from cached whole fragments where small enough,
        else with one random ``take`` for the rest."""
        fragment, offset = split_addresses(addrs)
        whole = self._fragments_fit_cache()
        kept = {
            int(f): self._fragment_rows(int(f), names) if whole else None
            for f in np.unique(fragment)
        }
        # Fragments too big to keep are one owner (-1): one take for all of their rows.
        too_big = [f for f, rows in kept.items() if rows is None]
        owners = np.where(np.isin(fragment, too_big), -1, fragment)

        def read(owner: int, at: np.ndarray) -> pa.Table:
            rows = kept.get(int(owner))
            if rows is not None:
                return rows.take(pa.array(offset[at]))
            taken = take_rows(self.dataset, pa.array(addrs[at]), names)
            return conform(taken, self.schema, BASE_GENERATION)

        table = gather(owners, read)
        return table.set_column(
            table.schema.get_field_index(ROWADDR), self.schema.field(ROWADDR), pa.array(addrs)
        )

    def _fragments_fit_cache(self) -> bool:
        facts = _base_facts(self.dataset)
        if facts.stored_bytes is None:
            return False
        index = facts.rows * _KEY_INDEX_ROW_BYTES if self._fits_cache() else 0
        memory = facts.stored_bytes * _MEMORY_PER_STORED_BYTE + index
        return memory <= self.caches.max_bytes // _WHOLE_BASE_SHARE

    def _fragment_rows(self, fragment_id: int, names: list[str]) -> pa.Table | None:
        fragment = self._fragment(fragment_id)
        return self.caches.lookup.get(
            "rows",
            fragment_rows_key(self.dataset.uri, fragment),
            lambda: whole_fragment(
                fragment, names, BASE_GENERATION, self.schema, self.caches.max_bytes
            ),
        )

    def _fragment(self, fragment_id: int) -> lance.LanceFragment:
        fragment = self.dataset.get_fragment(fragment_id)
        # The planner's fragment ids and the key index's row addresses are of this version.
        assert fragment is not None, f"fragment {fragment_id} not in version {self.dataset.version}"
        return fragment

    def _tagged(self, rows: pa.Table, addr: pa.Array | pa.ChunkedArray) -> pa.Table:
        out = conform(rows, self.schema, BASE_GENERATION)
        return out.set_column(out.schema.get_field_index(ROWADDR), self.schema.field(ROWADDR), addr)


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
        """As :meth:`LookupSource.probe`, asking the child only for keys the filter passes."""

        def load() -> tuple[BloomFilter | None, int]:
            try:
                data = self.store.get(self.bloom_path)
            except ObjectNotFoundError:
                return None, 64  # no filter: every key passes
            verify_bloom_filter(self.child.uri, self.child.storage_options)  # type: ignore[arg-type]
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
        base: BaseLookupExec,
        parallel_keys: int = 256,
    ) -> None:
        self.keys = keys
        self.regions = list(regions)
        self.base = base
        self.parallel_keys = parallel_keys

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
        yield from live_rows(rows).to_batches()


_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memwal-lookup")


def distinct_keys(keys: pa.Table) -> pa.Table:
    """The distinct rows of a table of key columns."""
    if keys.num_rows <= 1:
        return keys
    if keys.num_columns == 1:
        return pa.table({keys.column_names[0]: pc.unique(keys.column(0).combine_chunks())})
    return keys.group_by(keys.column_names, use_threads=False).aggregate([])


def _key_filter(keys: pa.Table, primary_key: Sequence[str]) -> pc.Expression:
    """``first_key_column IN (...)``: exact for one-column keys; composite keys are narrowed
    by it (the btree index serves it) and then matched exactly by the caller."""
    k = primary_key[0]
    return pc.field(k).isin(pc.unique(keys.column(k).combine_chunks()))


def live_rows(rows: pa.Table) -> pa.Table:
    """Drop tombstones (a tombstone resolves its key as absent)."""
    tombstones = rows.column(TOMBSTONE)
    if rows.num_rows == 0 or not pc.any(tombstones).as_py():
        return rows
    # A lookup's rows come in one small chunk per source; filtering pays per chunk.
    rows = rows.combine_chunks()
    return rows.filter(pc.invert(rows.column(TOMBSTONE)))


__all__ = [
    "BaseLookupExec",
    "BloomFilterGuardExec",
    "CoalesceFirstExec",
    "GenerationIndexExec",
    "KeyProbe",
    "KeyedExec",
    "LookupSource",
    "PointLookupExec",
    "Probe",
    "distinct_keys",
    "live_rows",
]
