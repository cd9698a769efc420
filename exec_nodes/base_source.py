"""The base-table leaf: the Lance dataset at the snapshot's version, read by any access
method through Lance (its scanner, key index or btree, vector index, data files).

* A scan takes the projection and the filter directly in Lance, except for a fragment with a
  deletion vector, which is read from its data file (see :meth:`BaseSourceExec._direct_file`);
  it may cover only some fragments, or row ranges of them (a big fragment is split so that
  partitions are even). A filtered scan of a small base (see :func:`scan_in_memory`)
  evaluates its filter over the fragments kept whole in the lookup cache instead.
* A lookup probes the base table's keys and row addresses at the pinned version, read once
  (one column, like Lance's own btree pages) and cached, so a batch of keys costs a
  vectorised probe and then the rows that exist: from small fragments kept whole in the
  lookup cache, else one random ``take``. A base table whose key index would not fit the
  lookup cache is probed through its primary-key btree instead (a filtered Lance read).
* A KNN search uses its vector index when there is one (``nprobes`` partitions, candidates
  re-ranked by exact distance with ``refine_factor``), and a flat search of the rows the
  index does not cover yet.
* Full text reads the base's inverted index for the query's terms and corrects its statistics
  to the latest corpus (:class:`~exec_nodes.fts_index.BaseTextIndex`); the fragments the index
  does not cover, or all of them when the index's layout is not one read here, are tokenized
  fragment by fragment: the terms of a fragment's data files are kept (they never change), its
  deletions read per version.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.file import LanceFileReader

from exec_nodes.fts_index import BaseTextIndex, open_text_index
from exec_nodes.source import (
    Access,
    FragmentRange,
    FullText,
    Knn,
    Lookup,
    Probe,
    Scan,
    SourceLeaf,
    lance_nearest,
    take_addresses,
    whole_fragment,
)
from memwal_sql.compat.lance import (
    data_file_paths,
    row_addr_treemap,
    single_data_file,
    storage_options_of,
    take_rows,
)
from memwal_sql.expressions.substrait import lance_filter
from memwal_sql.expressions.visitors import evaluate, referenced_columns
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    ROWADDR,
    conform,
    empty_rows,
    gather,
    stored_columns,
)
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet
from memwal_sql.structures.rowmask import RowMask, split_addresses
from memwal_sql.writer.memtable_indexes import Piece

# Each base batch costs a trip through Lance's stream, the deletion mask and ``conform`` in
# Python, so small batches multiply that work (a narrow scan of TPC-H ``lineitem``,
# benchmarks/bench_tpch.py).
# No column asked (``count(*)``): only row addresses, which cost nothing to make.
_ROWS_BATCH = 1 << 15
_ADDRESSES_BATCH = 1 << 16
# Batches Lance's file reader decodes ahead: a few keep both cores busy, more only hold memory
# (a batch each; benchmarks/bench_tpch.py after tbl.maintain()).
_FILE_READAHEAD = 4


def _deleted_rows(
    dataset: lance.LanceDataset, fragment: lance.LanceFragment, caches: Caches
) -> RowMask:
    """The rows of ``fragment`` that its deletion vector deletes, kept in ``caches.deletions``
    (a deletion file never changes: a new one gets a new id). Found once from the row addresses
    Lance's scanner returns for the fragment, which skip them."""
    dv = fragment.metadata.deletion_file
    assert dv is not None
    fid, rows = fragment.fragment_id, fragment.physical_rows

    def load() -> tuple[RowMask, int]:
        live = (
            dataset.scanner(
                columns=[],
                with_row_address=True,
                fragments=[fragment],
                batch_size=_ADDRESSES_BATCH,
            )
            .to_table()
            .column(ROWADDR)
            .to_numpy()
        )
        deleted = np.ones(rows, dtype=bool)
        deleted[split_addresses(live)[1]] = False
        addresses = (np.uint64(fid) << np.uint64(32)) | np.flatnonzero(deleted).astype(np.uint64)
        mask = RowMask(addresses, {fid: rows})
        return mask, mask.nbytes + 64

    key = f"{dataset.uri}#{fid}#{dv.id}-{dv.read_version}"
    return caches.deletions.get("deletions", key, load)


_KEY_INDEX_ROW_BYTES = 16  # a cached base key index entry: key and row address, in key order
_KEY_INDEX_SHARE = 4  # a base's key index may take a quarter of the cache
# A base of at least this many rows with a btree on its first key column builds its key index
# in the background (from the second query that wants it), and is probed through the btree
# meanwhile: the first query after an open costs what Lance's own lookup costs, not a read of
# every key (benchmarks/bench_scale.py at 2M rows). Below it, reading every key costs less than
# a first probe of the btree (benchmarks/bench_lookup.py's cold first lookup at 600k rows).
BACKGROUND_KEY_INDEX_ROWS = 1 << 20
# A lookup of fewer keys does not ask for a big base's key index: the btree finds them about
# as fast (one key at 2M rows, bench_scale: 2.7 ms against 2.3 through the index), while the
# build reads every key and sorts them (hundreds of milliseconds of both cores, beside the
# queries that follow). A scan, or a lookup of more keys, asks for it.
FEW_KEYS = 64
# One build at a time: each reads a whole key column, and a second would only compete.
_KEY_INDEX_BUILDS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memwal-lookup-keys")
_building: set[str] = set()
_building_lock = threading.Lock()
# Lookups read a base's fragments whole only while all of them, with its key index, fit in
# half the cache: a batch of lookups touches every fragment, and a plain LRU cache over
# budget evicts what the next batch needs, which is slower than random takes
# (benchmarks/bench_lookup.py with a base of several million rows). Their size in memory is
# estimated at 3x their stored size (what bench_read's rows take in Arrow).
_WHOLE_BASE_SHARE = 2
_MEMORY_PER_STORED_BYTE = 3
# Keys are found by reading the whole key column rather than by probing the btree from
# (base rows / _KEYS_PER_SCAN) keys on.
_KEYS_PER_SCAN = 256


def scan_in_memory(dataset: lance.LanceDataset, caches: Caches) -> bool:
    """Whether a filtered scan of ``dataset`` should evaluate its filter over the fragments
    kept whole in the lookup cache (the rows lookups keep) rather than through a Lance scan.

    Only while the whole base fits the share lookups may keep whole, and once a filtered scan
    of this base version has run (:func:`count_filtered_scan`): a process that scans once (a
    CLI call) reads only what Lance's filtered scan reads. A Lance scan costs a few
    milliseconds whatever it returns (planning, decoding the filter columns); over rows in
    memory a selective filter costs a fraction of that (benchmarks/bench_read.py).

    Example:
        ``scan_in_memory(tbl.dataset(), tbl.caches)`` -> ``False`` before the first scan
    """
    facts = _base_facts(dataset)
    return _whole_base_fits(facts, caches) and _filtered_scans(facts, caches)[0] > 0


def count_filtered_scan(dataset: lance.LanceDataset, caches: Caches) -> None:
    """Count a filtered scan of ``dataset`` that ran (see :func:`scan_in_memory`).

    Example:
        ``count_filtered_scan(tbl.dataset(), tbl.caches)``
    """
    _filtered_scans(_base_facts(dataset), caches)[0] += 1  # a race loses a count: harmless


def _filtered_scans(facts: _BaseFacts, caches: Caches) -> list[int]:
    return caches.lookup.get("base_scans", facts.cache_key, lambda: ([0], 64))


def _whole_base_fits(facts: _BaseFacts, caches: Caches) -> bool:
    """Whether every fragment of the base, kept whole, fits the lookup cache's share for them
    (with the key index, when that fits too)."""
    if facts.stored_bytes is None:
        return False
    index = facts.rows * _KEY_INDEX_ROW_BYTES if _key_index_fits(facts, caches) else 0
    memory = facts.stored_bytes * _MEMORY_PER_STORED_BYTE + index
    return memory <= caches.max_bytes // _WHOLE_BASE_SHARE


def _key_index_fits(facts: _BaseFacts, caches: Caches) -> bool:
    return facts.rows * _KEY_INDEX_ROW_BYTES <= caches.max_bytes // _KEY_INDEX_SHARE


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


_KEY_BATCH_ROWS = 1 << 17  # key column rows read at once when looking many keys up


class _Member:
    """Which of a column's values (no nulls) are among ``wanted``, one batch at a time, of a
    column of about ``rows`` values: integers whose wanted values span less than 8 per row
    by a table (a fifth of the hash set's time on bench_scale's 2M keys), anything else by
    Arrow's hash set.

    Example:
        ``_Member(pa.array([5]), 3)(pa.array([1, 5, 9]))`` -> ``array([False, True, False])``
    """

    def __init__(self, wanted: pa.Array, rows: int) -> None:
        self.wanted = wanted
        self.table: np.ndarray | None = None
        if pa.types.is_integer(wanted.type) and len(wanted):
            want = wanted.to_numpy().astype(np.int64)
            self.lo, hi = int(want.min()), int(want.max())
            if hi - self.lo < 8 * max(rows, 1):
                self.table = np.zeros(hi - self.lo + 1, dtype=bool)
                self.table[want - self.lo] = True

    def __call__(self, values: pa.Array) -> np.ndarray:
        if self.table is None:
            return pc.is_in(values, value_set=self.wanted).to_numpy(zero_copy_only=False)
        at = np.subtract(
            values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), self.lo
        )
        # Values outside the wanted span are not wanted: looked up clipped to its ends, then
        # dropped (one gather, no masked copies: half the time on 10M keys).
        hit = np.take(self.table, at, mode="clip")
        hit &= at.view(np.uint64) < np.uint64(len(self.table))
        return hit


def _key_filter(keys: pa.Table, primary_key: Sequence[str]) -> pc.Expression:
    """``first_key_column IN (...)``: exact for one-column keys; composite keys are narrowed
    by it (the btree index serves it) and then matched exactly by the caller."""
    k = primary_key[0]
    return pc.field(k).isin(pc.unique(keys.column(k).combine_chunks()))


class BaseSourceExec(SourceLeaf):
    """The base table (``dataset``, at the snapshot's version) read by ``access``; its rows
    in the source ``schema`` (a scan reads the table's own columns and ``_rowaddr``).

    Example:
        ``BaseSourceExec(ds, schema, Lookup(("id",)), caches=tbl.caches).probe(keys)``
    """

    name = "BaseSourceExec"
    _locks: tuple[str, ...] = (*SourceLeaf._locks, "_text_lock")
    _computed: tuple[str, ...] = (*SourceLeaf._computed, "_text")

    def __init__(
        self,
        dataset: lance.LanceDataset,
        schema: pa.Schema,
        access: Access,
        *,
        caches: Caches,
        keys: pa.Table | None = None,
    ) -> None:
        super().__init__(None, BASE_GENERATION, schema, access, caches=caches, keys=keys)
        self.dataset = dataset
        self._uses_key_index: bool | None = None
        if isinstance(access, Scan):
            table = dataset.schema  # Lance builds it anew on each access
            self.columns = table.names if access.columns is None else list(access.columns)
            self.predicate = access.predicate
            self.ranges = None if access.ranges is None else list(access.ranges)
            self.batch_size = access.batch_size
            fields = [table.field(c) for c in self.columns]
            self._schema = pa.schema([*fields, pa.field(ROWADDR, pa.uint64(), False)])
        elif isinstance(access, Lookup):
            ids = access.fragment_ids
            self.fragment_ids = None if ids is None else list(ids)
        elif isinstance(access, Knn):
            self.in_lance = True
            self.index = access.index
            self.nprobes = access.nprobes
            self.refine_factor = access.refine_factor
            ids = access.fragment_ids if access.index is not None else None
            self.fragment_ids = None if ids is None else list(ids)
        else:
            self._fragments = dataset.get_fragments()
            self._text: BaseTextIndex | str | None = None
        self._text_lock = threading.Lock()  # apart: pieces() asks for the index under _lock

    @functools.cached_property
    def _pushed(self) -> tuple[pc.Expression | None, bool]:
        # Made when first asked: a scan served from memory never pushes its filter to Lance.
        return lance_filter(self.predicate, self.dataset.schema)

    @property
    def filter(self) -> pc.Expression | None:
        """The scan's filter as Lance takes it (None: none, or one Lance cannot take)."""
        return self._pushed[0]

    @property
    def exact(self) -> bool:
        """Whether :attr:`filter` is the whole predicate (else it is evaluated here)."""
        return self._pushed[1]

    def _where(self) -> str:
        return f"version={self.dataset.version} gen={BASE_GENERATION}"

    def _how(self) -> str:
        access = self.access
        if isinstance(access, Scan):
            frags = "all" if self.ranges is None else f"[{', '.join(map(str, self.ranges))}]"
            if access.in_memory and self.predicate is not None:
                how = f"filter {self.predicate} over whole fragments in memory"
                return f"{access} fragments={frags} columns={self.columns} {how}"
            return f"{access} fragments={frags} columns={self.columns} filter={self.filter}" + (
                "" if self.exact else f" then {self.predicate}"
            )
        if isinstance(access, Lookup):
            indexed = self._has_key_btree()
            how = "btree" + ("" if self._fits_cache() else " (key index too big for the cache)")
            if self.uses_key_index():
                how = "cached key index, " + (
                    "rows from whole fragments" if self._fragments_fit_cache() else "random takes"
                )
            frags = "" if self.fragment_ids is None else f" fragments={self.fragment_ids}"
            return f"{access} btree={'yes' if indexed else 'no (scan)'} via {how}" + frags
        if isinstance(access, Knn):
            return str(access) + (
                f" index {self.index} nprobes={self.nprobes} refine_factor={self.refine_factor}"
                + ("" if self.fragment_ids is None else f" indexed rows only {self.fragment_ids}")
                if self.index
                else " flat (no vector index)"
            )
        found = self._text_index()
        if isinstance(found, str):
            return f"{access} tokenizing all {len(self._fragments)} fragments ({found})"
        rest = len(self._fragments) - len(found.covered)
        return f"{access} through {found.describe()}, tokenizing {rest} unindexed fragments"

    # Scan

    def _scan(self, partition: int) -> Iterator[pa.RecordBatch]:
        parts: list[tuple[lance.LanceFragment, FragmentRange | None]] = []
        if self.ranges is None:
            parts = [(f, None) for f in self.dataset.get_fragments()]
        for r in self.ranges or []:
            fragment = self.dataset.get_fragment(r.fragment_id)
            # The planner splits this very version's fragments into partitions.
            assert fragment is not None, f"fragment {r} not in version {self.dataset.version}"
            parts.append((fragment, r))
        wholes = [self._in_memory(f) for f, _ in parts]
        files = [
            None if w is not None else self._direct_file(f) for (f, _), w in zip(parts, wholes)
        ]
        rest = [p for p, w, uri in zip(parts, wholes, files) if w is None and uri is None]
        if rest:
            every = self.ranges is None and len(rest) == len(parts)  # Lance lists them itself
            yield from self._lance_scan(None if every else rest)
        for (fragment, part), whole, uri in zip(parts, wholes, files):
            if whole is not None:
                yield from self._memory_scan(fragment, part, whole)
            elif uri is not None:
                yield from self._file_scan(fragment, part, uri)

    def _in_memory(self, fragment: lance.LanceFragment) -> pa.Table | None:
        """The whole rows of ``fragment`` (from the lookup cache, read once) that an
        ``in_memory`` scan evaluates its filter over, or None to read it through Lance."""
        assert isinstance(self.access, Scan)
        if not self.access.in_memory or self.predicate is None:
            return None
        if fragment.metadata.deletion_file is not None and self.caches.deletions.max_bytes == 0:
            return None  # its deleted rows would be found anew by every query
        names = stored_columns(self.source_schema, self.dataset)
        # The whole rows hold no true row addresses: a filter on one is Lance's to apply.
        if not {*self.columns, *referenced_columns(self.predicate)} <= set(names):
            return None
        return self._whole(fragment, names)

    def _memory_scan(
        self, fragment: lance.LanceFragment, part: FragmentRange | None, whole: pa.Table
    ) -> Iterator[pa.RecordBatch]:
        """The live rows of ``fragment`` (or of a row range of it) that match the filter,
        from its rows kept whole: the filter evaluated over them, the matches taken."""
        assert self.predicate is not None
        start = 0 if part is None else part.start
        end = whole.num_rows if part is None or part.end is None else part.end
        hit = pc.fill_null(evaluate(self.predicate, whole.slice(start, end - start)), False)
        at = pc.indices_nonzero(hit).to_numpy().astype(np.uint64) + np.uint64(start)
        addresses = (np.uint64(fragment.fragment_id) << np.uint64(32)) | at
        if fragment.metadata.deletion_file is not None and len(at):
            deleted = _deleted_rows(self.dataset, fragment, self.caches).hits(addresses)
            if deleted is not None:
                at, addresses = at[~deleted], addresses[~deleted]
        if not len(at):
            return
        taken = whole.select(self.columns).take(pa.array(at))  # no columns: count(*)
        columns = [
            *conform(taken, self._schema.remove(len(self.columns))).columns,
            pa.array(addresses),
        ]
        rows = pa.Table.from_arrays(columns, schema=self._schema)
        yield from rows.to_batches(max_chunksize=_ROWS_BATCH)

    def _lance_scan(
        self, parts: list[tuple[lance.LanceFragment, FragmentRange | None]] | None
    ) -> Iterator[pa.RecordBatch]:
        fragments = None if parts is None else [f for f, _ in parts]
        allow: bytes | None = None
        if parts is not None and not all(r is None or r.whole for _, r in parts):
            allow = row_addr_treemap(
                {
                    f.fragment_id: None
                    if r is None or r.whole
                    else range(r.start, r.end or f.physical_rows)
                    for f, r in parts
                }
            )
        # A filter Lance cannot take is applied here, on every column it may read.
        columns = self.columns if self.exact else None
        scanner = self.dataset.scanner(
            columns=columns,
            filter=self.filter,
            fragments=fragments,
            with_row_address=True,
            batch_size=self.batch_size or (_ROWS_BATCH if columns != [] else _ADDRESSES_BATCH),
            scan_in_order=True,
            row_addr_allowlist=allow,
        )
        for batch in scanner.to_batches():
            if not self.exact and batch.num_rows:
                assert self.predicate is not None  # lance_filter calls no predicate exact
                batch = batch.filter(pc.fill_null(evaluate(self.predicate, batch), False))
            if batch.num_rows:
                # Lance marks _rowaddr nullable; the node's schema says what it is (not null).
                yield pa.RecordBatch.from_arrays(
                    batch.select(self._schema.names).columns, schema=self._schema
                )

    def _direct_file(self, fragment: lance.LanceFragment) -> str | None:
        """The data file of a fragment with a deletion vector that is read here, not through
        Lance's scanner, or None.

        Lance's scanner reads a fragment that has a deletion vector (what every merge leaves)
        several times slower than one without, whatever the number of deleted rows, than its
        data file read with Lance's file reader and the deleted rows dropped here
        (benchmarks/bench_tpch.py, the stage after tbl.maintain(); docs/performance.md). Only a fragment whose one data
        file holds exactly the table's columns (names and types, in order: no column added,
        dropped or renamed since) is read so, only while the deletions cache keeps its deleted
        rows (finding them costs a scan of its row addresses), and not for a filter on an
        indexed column.
        """
        if fragment.metadata.deletion_file is None or self.caches.deletions.max_bytes == 0:
            return None
        if self.predicate is not None:
            # Lance answers a filter on an indexed column from the index, reading only the
            # matching rows; the file would be read whole.
            indexed = {f for i in self.dataset.list_indices() for f in i["fields"]}
            if indexed & referenced_columns(self.predicate):
                return None
        uri = single_data_file(self.dataset, fragment)
        if uri is None:
            return None
        options = storage_options_of(self.dataset)

        def load() -> tuple[pa.Schema, int]:
            file_schema = LanceFileReader(uri, storage_options=options).metadata().schema
            return file_schema, 64 * len(file_schema)

        stored = self.caches.scan.get("file_schema", uri, load)
        table = self.dataset.schema
        same = stored.names == table.names and stored.types == table.types
        return uri if same else None

    def _file_scan(
        self, fragment: lance.LanceFragment, part: FragmentRange | None, uri: str
    ) -> Iterator[pa.RecordBatch]:
        """The live rows of ``fragment`` (or of a row range of it) read from its data file:
        the deletion vector's rows dropped here, the filter evaluated here."""
        deleted = _deleted_rows(self.dataset, fragment, self.caches)
        fid = fragment.fragment_id
        start = 0 if part is None else part.start
        end = fragment.physical_rows if part is None or part.end is None else part.end
        wanted = [c for c in self._schema.names if c != ROWADDR]
        if self.predicate is None:
            names = wanted
        elif self.exact:
            names = list(dict.fromkeys([*wanted, *sorted(referenced_columns(self.predicate))]))
        else:  # an opaque part may address columns by position: every column, in order
            names = self.dataset.schema.names
        if names:
            reader = LanceFileReader(
                uri, storage_options=storage_options_of(self.dataset), columns=names
            )
            batches = reader.read_range(
                start, end - start, batch_size=_ROWS_BATCH, batch_readahead=_FILE_READAHEAD
            ).to_batches()
        else:  # count(*): the row addresses are all there is to read
            batches = (
                pa.RecordBatch.from_arrays(
                    [pa.nulls(min(_ADDRESSES_BATCH, end - o))], ["_"]
                ).select([])
                for o in range(start, end, _ADDRESSES_BATCH)
            )
        offset = start
        for batch in batches:
            n = batch.num_rows
            addresses = (np.uint64(fid) << np.uint64(32)) | np.arange(
                offset, offset + n, dtype=np.uint64
            )
            offset += n
            hit = deleted.hits(addresses)
            keep = np.ones(n, dtype=bool) if hit is None else ~hit
            if self.predicate is not None:
                true = pc.fill_null(evaluate(self.predicate, batch), False)
                keep &= true.to_numpy(zero_copy_only=False)
            if not keep.any():
                continue
            columns = [batch.column(c) for c in wanted] + [pa.array(addresses)]
            out = pa.RecordBatch.from_arrays(columns, schema=self._schema)
            yield out if keep.all() else out.filter(pa.array(keep))

    # Lookup

    def uses_key_index(self, keys: int | None = None) -> bool:
        """True if keys are probed in the cached key index (built now if need be), not through
        the btree: False while a big base's index is being built in the background. Decided
        once per leaf (the first call), so that a plan and its execution take the same path.
        A lookup of ``keys`` keys, fewer than :data:`FEW_KEYS`, does not ask for a big base's
        index to be built.

        Example:
            ``BaseSourceExec(ds, schema, Lookup(("id",)), caches=c).uses_key_index(1)``
        """
        if self._uses_key_index is None:
            self._uses_key_index = self._key_index_now(keys)
        return self._uses_key_index

    def _key_index_now(self, keys: int | None) -> bool:
        if not self._fits_cache():
            return False
        facts = _base_facts(self.dataset)
        if (
            self.caches.lookup.contains("base_keys", facts.cache_key)
            or facts.rows < BACKGROUND_KEY_INDEX_ROWS
            or not self._has_key_btree()  # without one, a probe reads every key anyway
        ):
            return True
        if keys is not None and keys < FEW_KEYS:
            return False  # the btree finds a few keys about as fast: no build for them
        # Built from the second query on: a process that asks once (a CLI call) builds
        # nothing, and does not wait for a build at its exit.
        asked = self.caches.lookup.get("base_keys_wanted", facts.cache_key, lambda: ([0], 64))
        asked[0] += 1
        if asked[0] >= 2:
            self._build_key_index_in_background()
        return False

    def _has_key_btree(self) -> bool:
        ds, column = self.dataset, self.primary_key[0]

        def load() -> tuple[bool, int]:
            found = any(
                d.field_names == [column] and d.index_type == "BTree" for d in ds.describe_indices()
            )
            return found, 64

        return self.caches.lookup.get("key_btree", _base_facts(ds).cache_key, load)

    def _build_key_index_in_background(self) -> None:
        """Start building the key index, unless a build of it is under way."""
        key = _base_facts(self.dataset).cache_key
        with _building_lock:
            if key in _building:
                return
            _building.add(key)

        def build() -> None:
            try:
                self.caches.lookup.get("base_keys", key, self._load_key_index)
            finally:
                with _building_lock:
                    _building.discard(key)

        _KEY_INDEX_BUILDS.submit(build)

    def _fits_cache(self) -> bool:
        return _key_index_fits(_base_facts(self.dataset), self.caches)

    def addresses_of(self, keys: pa.Table) -> np.ndarray | None:
        """The sorted row addresses of the base rows holding ``keys`` (keys it does not hold
        are left out), from the cached key index; None when the base is too big to keep one.

        Example:
            ``BaseSourceExec(ds, schema, Lookup(("id",)), caches=c).addresses_of(pa.table({"id": [3]}))``
        """
        index = self._key_index()
        if index is None:
            return None
        keyset, addrs = index
        pos = keyset.positions(keys.select(self.primary_key))
        return np.sort(addrs[pos[pos >= 0]].astype(np.uint64))

    def _key_index(self) -> tuple[KeySet, np.ndarray] | None:
        if not self.uses_key_index():
            return None
        key = _base_facts(self.dataset).cache_key
        return self.caches.lookup.get("base_keys", key, self._load_key_index)

    def _load_key_index(self) -> tuple[tuple[KeySet, np.ndarray], int]:
        pk = self.primary_key
        table = self.dataset.to_table(columns=pk, with_row_address=True)
        keyset, addrs = KeySet.indexing(table.select(pk), table.column(ROWADDR).to_numpy())
        return (keyset, addrs), keyset.nbytes + addrs.nbytes

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
        return _whole_base_fits(_base_facts(self.dataset), self.caches)

    def _fragment_rows(self, fragment_id: int, names: list[str]) -> pa.Table | None:
        return self._whole(self._fragment(fragment_id), names)

    def _whole(self, fragment: lance.LanceFragment, names: list[str]) -> pa.Table | None:
        """Every physical row of ``fragment`` (columns ``names`` in the source schema), kept
        in the lookup cache; None for a fragment too big to keep (see ``whole_fragment``)."""
        rows = self.caches.lookup.get(
            "rows",
            fragment_rows_key(self.dataset.uri, fragment),
            lambda: whole_fragment(
                fragment, names, BASE_GENERATION, self.source_schema, self.caches.max_bytes
            ),
        )
        if rows is not None and not rows.schema.equals(self.source_schema):
            # Kept before a schema change: Lance adds an all-NULL column without a data file.
            rows = conform(rows, self.source_schema, BASE_GENERATION)
        return rows

    def _fragment(self, fragment_id: int) -> lance.LanceFragment:
        fragment = self.dataset.get_fragment(fragment_id)
        # The planner's fragment ids and the key index's row addresses are of this version.
        assert fragment is not None, f"fragment {fragment_id} not in version {self.dataset.version}"
        return fragment

    def _tagged(self, rows: pa.Table, addr: pa.Array | pa.ChunkedArray) -> pa.Table:
        out = conform(rows, self.schema, BASE_GENERATION)
        return out.set_column(out.schema.get_field_index(ROWADDR), self.schema.field(ROWADDR), addr)

    # Knn

    def _nearest(self, n: int) -> pa.Table:
        options: dict[str, object] = {}
        if self.index:
            if self.nprobes:
                options["nprobes"] = self.nprobes
            if self.refine_factor:
                options["refine_factor"] = self.refine_factor
        indexed_rows = None
        if self.fragment_ids is not None:
            indexed_rows = sum(self._fragment(i).count_rows() for i in self.fragment_ids)
        return lance_nearest(self.dataset, self, n, options, BASE_GENERATION, indexed_rows)

    def rows(self, candidates: pa.Table) -> pa.Table:
        return take_addresses(
            self.dataset, candidates.column(ROWADDR).to_numpy(), self.source_schema, BASE_GENERATION
        )

    # FullText

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        index = self.text_index() if isinstance(self.access, FullText) else None
        if index is not None:  # the documents the index covers are live rows, read by Lance
            covered = [f for f in self._fragments if f.fragment_id in index.covered]
            if covered:
                rows = self.dataset.scanner(
                    columns=stored_columns(self.schema, self.dataset),
                    fragments=covered,
                    with_row_address=True,
                ).to_table()
                addr = rows.column(ROWADDR).cast(pa.uint64())
                yield from self._tagged(rows.drop_columns([ROWADDR]), addr).to_batches()
        yield from super().execute(partition)

    def text_index(self) -> BaseTextIndex | None:
        found = self._text_index()
        return found if isinstance(found, BaseTextIndex) else None

    def _text_index(self) -> BaseTextIndex | str:
        """The base's inverted index on the column as a search reads it, or why it is not
        read (then every fragment is tokenized); once per leaf, and per base version in the
        search cache."""
        with self._text_lock:
            if self._text is None:
                ds = self.dataset
                self._text = self.caches.search.get(
                    "fts_index", f"{ds.uri}@{ds.version}#{self.column}", self._open_text_index
                )
            return self._text

    def _open_text_index(self) -> tuple[BaseTextIndex | str, int]:
        ds = self.dataset
        fragments = {f.fragment_id for f in self._fragments}
        opened = open_text_index(ds, self.column, fragments, self.caches)
        if isinstance(opened, str):
            return opened, 64
        files, covered = opened
        index = BaseTextIndex(
            ds, files, covered, self.caches, lambda f: _deleted_rows(ds, f, self.caches)
        )
        return index, 1024 + 64 * len(covered)

    def key_addresses(self, keys: pa.Table) -> np.ndarray:
        """The row address of the live base row holding each of ``keys``, or -1.

        Example:
            ``leaf.key_addresses(pa.table({"id": [3, 4]}))`` -> ``array([4294967299, -1])``
        """
        keys = keys.select(self.primary_key)
        index = self._key_index()
        if index is not None:
            keyset, addrs = index
        else:  # too big to keep: the rows holding the keys are read now
            rows = self._rows_of(keys)
            keyset, addrs = KeySet(rows.select(self.primary_key)), rows.column(ROWADDR).to_numpy()
        pos = keyset.positions(keys)
        return np.where(pos >= 0, addrs[np.maximum(pos, 0)].astype(np.int64), -1)

    def _rows_of(self, keys: pa.Table) -> pa.Table:
        """The live base rows (key columns, ``_rowaddr``) whose first key column holds one of
        ``keys``': through the btree, or, for so many keys that reading the key column and
        filtering it in Arrow costs less than the btree's probes (about 250 rows' scan per
        probe: bench_scale's full-text search), by that."""
        if keys.num_rows * _KEYS_PER_SCAN <= _base_facts(self.dataset).rows:
            return self.dataset.scanner(
                columns=self.primary_key,
                filter=_key_filter(keys, self.primary_key),
                with_row_address=True,
            ).to_table()
        fragments = self.dataset.get_fragments()
        k = self.primary_key[0]
        wanted = pc.unique(keys.column(k).combine_chunks())
        member = _Member(wanted, _base_facts(self.dataset).rows)
        starts = np.concatenate([[0], np.cumsum([f.metadata.physical_rows for f in fragments])])
        # Without deleted rows every row is there, in fragment order: the addresses of the
        # rows found follow (reading every row's address would double the read). The keys
        # are read a batch at a time, only the matches kept: the column whole was fresh
        # memory (80 MB at 10M rows) on every cold search.
        deleted = any(f.metadata.deletion_file is not None for f in fragments)
        schema = pa.schema([self.dataset.schema.field(c) for c in self.primary_key])
        found, at = [], 0
        if not deleted:
            for batch in self.dataset.to_batches(
                columns=self.primary_key, scan_in_order=True, batch_size=_KEY_BATCH_ROWS
            ):
                hit = np.flatnonzero(member(batch.column(k)))
                found.append((hit + at, batch.take(pa.array(hit))))
                at += batch.num_rows
        if deleted or at != starts[-1]:
            batches = self.dataset.to_batches(
                columns=self.primary_key, with_row_address=True, batch_size=_KEY_BATCH_ROWS
            )
            return pa.Table.from_batches(
                [b.filter(pa.array(member(b.column(k)))) for b in batches],
                schema.append(pa.field(ROWADDR, pa.uint64())),
            )
        at_all = np.concatenate([np.zeros(0, np.int64), *(h for h, _ in found)])
        which = np.searchsorted(starts, at_all, side="right") - 1
        ids = np.array([f.fragment_id for f in fragments], dtype=np.uint64)
        addresses = (ids[which] << np.uint64(32)) | (at_all - starts[which]).astype(np.uint64)
        rows = pa.Table.from_batches([b for _, b in found], schema)
        return rows.append_column(ROWADDR, pa.array(addresses, pa.uint64()))

    def _text_pieces(self) -> list[Piece]:
        index = self.text_index()
        covered = set() if index is None else index.covered
        return [self._fragment_piece(f) for f in self._fragments if f.fragment_id not in covered]

    def _fragment_piece(self, fragment: lance.LanceFragment) -> Piece:
        files = ",".join(data_file_paths(fragment))
        fid = fragment.fragment_id
        columns = list(dict.fromkeys([*self.primary_key, self.column]))

        def load_terms() -> tuple[Piece, int]:
            rows = fragment.to_table(columns=columns, with_row_id=True, include_deleted_rows=True)
            assert rows.num_rows == fragment.metadata.physical_rows, "rows out of place"
            addresses = (np.int64(fid) << 32) | np.arange(rows.num_rows, dtype=np.int64)
            piece = self._piece(rows.select(columns), addresses)
            return piece, piece.tokens.nbytes + piece.keys.nbytes

        key = f"{self.dataset.uri}#{files}#{self.column}"
        piece: Piece = self.caches.search.get("fts", key, load_terms)
        deletion = fragment.metadata.deletion_file
        if deletion is None:
            return piece

        def load_live() -> tuple[Piece, int]:
            live = fragment.to_table(columns=[self.primary_key[0]], with_row_address=True)
            present = np.zeros(len(piece.present), dtype=bool)
            present[live.column(ROWADDR).to_numpy().astype(np.int64) & 0xFFFFFFFF] = True
            return Piece(piece.keys, piece.addresses, piece.tokens, present), present.nbytes * 9

        # One piece per version of the fragment's deletions, sharing the terms.
        return self.caches.search.get(
            "fts_live",
            f"{self.dataset.uri}#{files}#{deletion}",
            load_live,
        )

    def piece_rows(self, piece: int, index: np.ndarray) -> pa.Table:
        return self.rows_at(self.pieces()[piece].addresses[index])

    def rows_at(self, addresses: np.ndarray) -> pa.Table:
        """Full rows (source schema) at row ``addresses``."""
        names = stored_columns(self._schema, self.dataset)
        out = conform(
            take_rows(self.dataset, pa.array(addresses.astype(np.uint64)), names),
            self._schema,
            BASE_GENERATION,
        )
        return out.set_column(
            out.schema.get_field_index(ROWADDR),
            self._schema.field(ROWADDR),
            pa.array(addresses.astype(np.uint64)),
        )


__all__ = ["BaseSourceExec", "FragmentRange", "fragment_rows_key"]
