"""Point-lookup operators: probe each source by key, newest first, and stop at the first hit.

* :class:`TakeLastExec` finds the newest row of each requested key in *one* source: a flushed
  generation through its ``_pk_index`` (sorted keys to row offsets, read once per generation and
  cached: generations are immutable), a MemTable through a key index built once per snapshot,
  or the base table through its primary-key btree index (a filtered Lance read).
* :class:`BloomFilterGuardExec` passes on only the keys a generation's ``bloom_filter.bin`` may
  hold, so a miss costs a hash and a bit test, not an index probe.
* :class:`CoalesceFirstExec` runs its children newest first, each on the keys still unresolved;
  a key resolved by a tombstone is resolved as absent.

Keys travel as Arrow tables of the primary-key columns; each source is probed once per batch of
keys, never once per key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import BASE_GENERATION, ROWADDR, TOMBSTONE, ExecNode
from exec_nodes.dedup import newest_per_key
from exec_nodes.keyset import KeySet
from exec_nodes.scan import tag
from memwal_sql.errors import ObjectNotFoundError
from memwal_sql.storage import ObjectStore
from memwal_sql.writer.bloom import BloomFilter, pk_hashes
from memwal_sql.writer.pk_index import read_pk_index

HASH = "__memwal_key_hash"  # keys may carry their bloom hashes, computed once per lookup
_CACHE_SIZE = 256
_cache: OrderedDict[tuple[str, str], object] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(kind: str, uri: str, load: object) -> object:
    """Per-process LRU of immutable per-generation structures (pk index, bloom filter)."""
    key = (kind, uri)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    value = load()  # type: ignore[operator]
    with _cache_lock:
        _cache[key] = value
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return value


def _key_index(values: pa.Table, ids: np.ndarray) -> tuple[KeySet, np.ndarray]:
    """KeySet over distinct keys and, per key, the highest row id (a later duplicate that
    Lance's writer masked with a deletion vector is always the higher id)."""
    if values.num_rows == 0:
        return KeySet(values), ids
    t = values.append_column("__id", pa.array(ids.astype(np.int64)))
    best = t.group_by(values.column_names, use_threads=False).aggregate([("__id", "max")])
    return KeySet(best.select(values.column_names)), best.column("__id_max").to_numpy()


class LookupSource(ExecNode):
    """One source that can be probed by key; counts probes (tests check what was touched)."""

    def __init__(self, region_id: str | None, generation: int, schema: pa.Schema) -> None:
        self.region_id = region_id
        self.generation = generation
        self._schema = schema
        self.probes = 0
        self._lock = threading.Lock()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def take_last(self, keys: pa.Table) -> pa.Table:
        """The newest row (tombstones included) of each of ``keys`` present in this source."""
        with self._lock:
            self.probes += 1
        return self._take_last(keys)

    def _take_last(self, keys: pa.Table) -> pa.Table:
        raise NotImplementedError


class TakeLastExec(LookupSource):
    """Newest row per key of one generation or MemTable (``origin`` says which)."""

    name = "TakeLastExec"

    def __init__(self, region_id: str, generation: int, schema: pa.Schema,
                 primary_key: Sequence[str], *, uri: str | None = None,
                 batches: Sequence[pa.RecordBatch] | None = None,
                 storage_options: dict[str, str] | None = None, origin: str = "generation") -> None:
        super().__init__(region_id, generation, schema)
        self.primary_key = list(primary_key)
        self.uri = uri
        self.batches = list(batches or [])
        self.storage_options = storage_options
        self.origin = origin
        self._mem: pa.Table | None = None

    def describe(self) -> str:
        where = self.uri.rsplit("/", 1)[-1] if self.uri else f"{self.origin} " \
            f"rows={sum(b.num_rows for b in self.batches)}"
        how = "_pk_index" if self.uri else "key index"
        return f"{self.name}: region={(self.region_id or '')[:8]} gen={self.generation} " \
               f"{where} via {how}"

    def _take_last(self, keys: pa.Table) -> pa.Table:
        if self.uri is not None:
            return self._from_generation(keys)
        return self._from_memtable(keys)

    def _from_generation(self, keys: pa.Table) -> pa.Table:
        assert self.uri is not None
        uri, opts = self.uri, self.storage_options

        def load() -> tuple[KeySet, np.ndarray]:
            index = read_pk_index(uri, opts)
            values = index.column("values")
            if len(self.primary_key) == 1:
                table = pa.table({self.primary_key[0]: values})
            else:  # composite keys are stored encoded; probe with the same encoding
                table = pa.table({"__key": values.cast(pa.binary())})
            return _key_index(table, index.column("ids").to_numpy())

        keyset, ids = _cached("pk_index", uri, load)  # type: ignore[misc]
        probe = keys.select(self.primary_key) if len(self.primary_key) == 1 \
            else _encoded_keys(keys.select(self.primary_key))
        pos = keyset.positions(probe)
        hit = pos >= 0
        if not hit.any():
            return self.schema.empty_table()
        row_ids = ids[pos[hit]].astype(np.uint64)
        ds = _cached("dataset", uri, lambda: lance.dataset(uri, storage_options=opts))
        names = [f.name for f in self.schema if f.name in ds.schema.names]
        # Row addresses of fragment 0 are the offsets the _pk_index stores.
        rows = ds._take_rows(pa.array(row_ids), columns=names)
        out = tag(rows, self.generation, self.schema)
        cols = [pa.array(row_ids) if f.name == ROWADDR else out.column(f.name) for f in self.schema]
        return pa.Table.from_arrays(cols, schema=self.schema)

    def _from_memtable(self, keys: pa.Table) -> pa.Table:
        with self._lock:
            if self._mem is None:
                self._mem = tag(pa.Table.from_batches(self.batches), self.generation,
                                self.schema) if self.batches else self.schema.empty_table()
            table = self._mem
        # One pass over the MemTable's key column(s) with the requested keys as the small set,
        # then the last occurrence of each matching key: cheaper than indexing the MemTable.
        if len(self.primary_key) == 1:
            k = self.primary_key[0]
            mask = pc.is_in(table.column(k), value_set=keys.column(k).combine_chunks())
        else:
            k = self.primary_key[0]
            mask = pc.is_in(table.column(k), value_set=pc.unique(keys.column(k).combine_chunks()))
        idx = np.nonzero(mask.to_numpy(zero_copy_only=False))[0]
        if len(idx) == 0:
            return self.schema.empty_table()
        cand = table.take(pa.array(idx))
        if len(self.primary_key) > 1:
            exact = KeySet(keys.select(self.primary_key)).contains(cand.select(self.primary_key))
            cand = cand.filter(pa.array(exact))
        newest = newest_per_key(cand, self.primary_key)
        if newest.num_rows == cand.num_rows:
            return cand
        # A MemTable row's address is its position, so the winners are taken straight back.
        return table.take(pa.array(newest.column(ROWADDR).to_numpy().astype(np.int64)))


class BaseLookupExec(LookupSource):
    """Newest row per key in the base table: a filtered Lance read the btree index serves."""

    name = "BaseLookupExec"

    def __init__(self, dataset: lance.LanceDataset, schema: pa.Schema,
                 primary_key: Sequence[str]) -> None:
        super().__init__(None, BASE_GENERATION, schema)
        self.dataset = dataset
        self.primary_key = list(primary_key)

    def describe(self) -> str:
        indexed = any(i["fields"] == [self.primary_key[0]] and i["type"] == "BTree"
                      for i in self.dataset.list_indices())
        return (f"{self.name}: version={self.dataset.version} gen={BASE_GENERATION} "
                f"key={self.primary_key} btree={'yes' if indexed else 'no (scan)'}")

    def _take_last(self, keys: pa.Table) -> pa.Table:
        if keys.num_rows == 0:
            return self.schema.empty_table()
        filt = _key_filter(keys, self.primary_key)
        names = [f.name for f in self.schema if f.name in self.dataset.schema.names]
        rows = self.dataset.to_table(columns=names, filter=filt, with_row_address=True)
        if len(self.primary_key) > 1 and rows.num_rows:
            rows = rows.filter(pa.array(KeySet(keys.select(self.primary_key)).contains(
                rows.select(self.primary_key))))
        addr = rows.column(ROWADDR)
        out = tag(rows.drop_columns([ROWADDR]), BASE_GENERATION, self.schema)
        cols = [addr.cast(pa.uint64()) if f.name == ROWADDR else out.column(f.name)
                for f in self.schema]
        return pa.Table.from_arrays(cols, schema=self.schema)


class BloomFilterGuardExec(ExecNode):
    """Lets through only the keys a generation's bloom filter may hold."""

    name = "BloomFilterGuardExec"

    def __init__(self, child: TakeLastExec, store: ObjectStore, bloom_path: str) -> None:
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

    def take_last(self, keys: pa.Table) -> pa.Table:
        def load() -> BloomFilter | None:
            try:
                return BloomFilter.from_bytes(self.store.get(self.bloom_path))
            except ObjectNotFoundError:
                return None  # no filter: every key passes

        bloom = _cached("bloom", self.store.uri_for(self.bloom_path), load)
        if bloom is not None:
            hashes = (keys.column(HASH).to_numpy() if HASH in keys.column_names
                      else pk_hashes(keys))
            mask = bloom.might_contain(hashes)  # type: ignore[union-attr]
            self.skipped += int((~mask).sum())
            if not mask.any():
                return self.schema.empty_table()
            keys = keys.filter(pa.array(mask))
        self.passed += keys.num_rows
        return self.child.take_last(keys)


class CoalesceFirstExec(ExecNode):
    """Children newest first; each sees only the keys no newer child resolved."""

    name = "CoalesceFirstExec"

    def __init__(self, children: Sequence[ExecNode], primary_key: Sequence[str],
                 schema: pa.Schema, label: str = "") -> None:
        self._children = list(children)
        self.primary_key = list(primary_key)
        self._schema = schema
        self.label = label

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def children(self) -> list[ExecNode]:
        return self._children

    def describe(self) -> str:
        return f"{self.name}: {self.label} newest first, stop at the first hit".strip()

    def take_last(self, keys: pa.Table) -> tuple[pa.Table, pa.Table]:
        """(rows found, tombstones included; keys still unresolved)."""
        found = []
        remaining = keys
        for child in self._children:
            if remaining.num_rows == 0:
                break
            rows = child.take_last(remaining)  # type: ignore[attr-defined]
            if rows.num_rows:
                found.append(rows)
                resolved = KeySet(rows.select(self.primary_key))
                remaining = remaining.filter(pa.array(~resolved.contains(remaining)))
        table = pa.concat_tables(found) if found else self._schema.empty_table()
        return table, remaining


def _encoded_keys(keys: pa.Table) -> pa.Table:
    from memwal_sql.writer.pk_index import encode_composite_keys

    enc = pa.chunked_array(encode_composite_keys(keys)).combine_chunks().cast(pa.binary())
    return pa.table({"__key": enc})


def _key_filter(keys: pa.Table, primary_key: Sequence[str]) -> pc.Expression:
    """``first_key_column IN (...)``: exact for one-column keys; composite keys are narrowed
    by it (the btree index serves it) and then matched exactly by the caller."""
    k = primary_key[0]
    return pc.field(k).isin(pc.unique(keys.column(k).combine_chunks()))


def live_rows(rows: pa.Table) -> pa.Table:
    """Drop tombstones (a tombstone resolves its key as absent)."""
    if rows.num_rows == 0:
        return rows
    return rows.filter(pc.invert(rows.column(TOMBSTONE)))


__all__ = [
    "BaseLookupExec", "BloomFilterGuardExec", "CoalesceFirstExec", "LookupSource",
    "TakeLastExec", "live_rows",
]
