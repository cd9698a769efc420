"""DeduplicateExec: the LSM-merging read of a scan.

Children are the newer-than-base sources of the queried regions (flushed generations, MemTables,
WAL tails) and the base-table scan, split in parts. First the key columns of every newer row are
read and the newest version of each key is found (highest ``_gen``, then ``_rowaddr``; a
tombstone winner removes the key). Then each newer source is read again, filtered (for a
generation, inside Lance), and a row is output only if it *is* its key's newest version: a row
whose newest version no longer matches never comes back from an older source. The base is
streamed: each batch, already filtered and projected by Lance, loses the rows whose key has any
newer version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.base_source import BaseSourceExec, count_filtered_scan, scan_in_memory
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import FragmentRange, Lookup, Scan, SourceLeaf
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.visitors import evaluate
from memwal_sql.formats.source_rows import BASE_GENERATION, GEN, ROWADDR, TOMBSTONE, conform
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeyMembership, KeySet, last_per_key
from memwal_sql.structures.rowmask import RowMask, split_addresses


def newest_per_key(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The newest row of every key, as key columns plus ``_gen``, ``_rowaddr`` and
    ``_tombstone``: highest ``_gen`` wins, then highest ``_rowaddr``.

    Example:
        >>> t = pa.table({"id": [1, 1, 2], "_gen": [1, 2, 1], "_rowaddr": pa.array([0, 0, 1], pa.uint64())})
        >>> newest_per_key(t, ["id"]).sort_by("id")["_gen"].to_pylist()
        [2, 1]
    """
    gen = table.column(GEN).to_numpy()
    addr = table.column(ROWADDR).to_numpy()
    dead = _dead(table)
    if table.num_rows and (gen.min() < 0 or gen.max() >= 1 << 30 or addr.max() >= 1 << 32):
        return _newest_by_sort(table, primary_key, dead)
    # One hash aggregate instead of a multi-column sort: pack (gen, rowaddr, tombstone) into one
    # integer whose maximum per key is the newest version (row addresses of newer-than-base
    # sources are offsets below 2^32, generations far below 2^30).
    packed = (gen.astype(np.int64) << 33) | (addr.astype(np.int64) << 1) | dead.astype(np.int64)
    keys, p = last_per_key(table.select(list(primary_key)), packed)
    return (
        keys.append_column(GEN, pa.array(p >> 33))
        .append_column(ROWADDR, pa.array(((p >> 1) & 0xFFFFFFFF).astype(np.uint64)))
        .append_column(TOMBSTONE, pa.array((p & 1).astype(bool)))
    )


def _dead(table: pa.Table) -> np.ndarray:
    """Which rows of ``table`` are tombstones (none without the column)."""
    if TOMBSTONE in table.column_names:
        return table.column(TOMBSTONE).to_numpy(zero_copy_only=False)
    return np.zeros(table.num_rows, dtype=bool)


def _dense_newest(keys: pa.Table, rank: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
    """Which rows hold the highest ``rank`` of their key (the first row on a tie, as
    :meth:`KeySet.newest_rows`), for one integer key column whose values span at most twice
    its rows; None for other keys. No sort: each row writes its number into its key's slot
    of an array over the span, and a row that does not read its own number back shares its
    key with the row that does; only those rows (after one large write: a few) are ranked.

    Example:
        >>> _dense_newest(pa.table({"id": [5, 7, 5]}), lambda at: at).tolist()
        [False, True, True]
    """
    col = keys.column(0)
    n = keys.num_rows
    if keys.num_columns != 1 or not pa.types.is_integer(col.type) or col.null_count:
        return None
    values = col.to_numpy()
    low, high = int(values.min()), int(values.max())
    if n >= 1 << 31 or high - low >= 2 * n + 1024:
        return None
    # Offsets in int64 (uint64 keys as they are): a small key type's offsets may pass it.
    if values.dtype == np.uint64:
        at = values - np.uint64(low)
    else:
        at = values.astype(np.int64, copy=False) - low
    slot = np.empty(high - low + 1, dtype=np.int32)
    own = np.arange(n, dtype=np.int32)
    slot[at] = own
    keep = np.ones(n, dtype=bool)
    lost = np.flatnonzero(slot[at] != own)
    if not len(lost):
        return keep
    shared = np.union1d(lost, slot[at[lost]])  # every row of a repeated key, ascending
    order = np.lexsort((shared, -rank(shared), at[shared]))  # key, newest, first row
    key = at[shared][order]
    keep[shared] = False
    keep[shared[order[np.r_[True, key[1:] != key[:-1]]]]] = True
    return keep


def _renumbered(keep: np.ndarray) -> np.ndarray:
    """Each row's number among the rows ``keep`` keeps, -1 for the others: the kept rows
    between two dropped ones are one slice of a shifted count (a cumulative sum of the flags
    costs 3-20x this on a large write's rows, of which a few are dropped).

    Example:
        >>> _renumbered(np.array([True, False, True, True, False])).tolist()
        [0, -1, 1, 2, -1]
    """
    dropped = np.flatnonzero(~keep)
    n = len(keep)
    if len(dropped) * 64 > n:  # many dropped: the count of kept flags is as cheap
        return np.where(keep, np.cumsum(keep) - 1, -1)
    out = np.arange(n, dtype=np.int64)
    out -= np.repeat(np.arange(len(dropped) + 1), np.diff(np.r_[-1, dropped, n - 1]))
    out[dropped] = -1
    return out


def _newest_by_sort(table: pa.Table, primary_key: Sequence[str], dead: np.ndarray) -> pa.Table:
    t = table.select([*primary_key, GEN, ROWADDR]).append_column(TOMBSTONE, pa.array(dead))
    order = pc.sort_indices(
        t,
        sort_keys=[
            *[(k, "ascending") for k in primary_key],
            (GEN, "descending"),
            (ROWADDR, "descending"),
        ],
    )
    s = t.take(order)
    first = np.ones(s.num_rows, dtype=bool)
    if s.num_rows > 1:
        differs = np.zeros(s.num_rows - 1, dtype=bool)
        for k in primary_key:
            col = s.column(k).combine_chunks()
            differs |= pc.not_equal(col[1:], col[:-1]).to_numpy(zero_copy_only=False)
        first[1:] = differs
    return s.filter(pa.array(first))


def base_mask(lookup: BaseSourceExec, keys: pa.Table) -> RowMask | None:
    """The base rows holding ``keys``, as a :class:`RowMask`; None when the base is too big
    to keep a key index."""
    ds = lookup.dataset
    got = lookup.addresses_of(keys) if keys.num_rows else np.zeros(0, dtype=np.uint64)
    if got is None:
        return None
    return RowMask(got, {f.fragment_id: f.metadata.physical_rows for f in ds.get_fragments()})


_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memwal-read")


class _ByAddress:
    """An int32 value (or -1) per row address, one dense array per fragment: a generation of
    more than Lance's 1,048,576 rows per file has addresses past 2**32, so one array indexed
    by address would not fit in memory.

    Example:
        >>> ix = _ByAddress(np.array([5, (1 << 32) | 2], np.uint64), np.array([7, 8]))
        >>> ix.get(np.array([5, 6, (1 << 32) | 2], np.uint64)).tolist()
        [7, -1, 8]
    """

    def __init__(self, addresses: np.ndarray | pa.ChunkedArray, values: np.ndarray) -> None:
        # Built at the first get: a count after a large write asks none (see _newer_rows).
        self._pending: tuple[np.ndarray | pa.ChunkedArray, np.ndarray] | None = (
            addresses,
            values,
        )
        self._per_fragment: dict[int, np.ndarray] = {}

    def _built(self) -> dict[int, np.ndarray]:
        if self._pending is None:
            return self._per_fragment
        addresses, values = self._pending
        if isinstance(addresses, pa.ChunkedArray):
            addresses = addresses.to_numpy()
        fragment, offset = split_addresses(addresses)
        per_fragment: dict[int, np.ndarray] = {}
        if len(offset):
            # A MemTable's or a small generation's rows are all in one fragment: no np.unique
            # of millions of equal ids (a hash of each) for the first read after a large write.
            one = fragment.min() == fragment.max()
            for f in [int(fragment[0])] if one else np.unique(fragment).tolist():
                at = slice(None) if one else fragment == f
                index = np.full(int(offset[at].max()) + 1, -1, dtype=np.int32)
                index[offset[at]] = values[at]
                per_fragment[f] = index
        # Published whole, then marked built: a query on another thread sees the arrays
        # complete or builds them itself.
        self._per_fragment = per_fragment
        self._pending = None
        return per_fragment

    @property
    def nbytes(self) -> int:
        if self._pending is not None:  # what it holds until built: its inputs
            return self._pending[0].nbytes + self._pending[1].nbytes
        return sum(a.nbytes for a in self._per_fragment.values())

    def get(self, addresses: np.ndarray) -> np.ndarray:
        """The value of each of ``addresses``; -1 where there is none."""
        fragment, offset = split_addresses(addresses)
        out = np.full(len(offset), -1, dtype=np.int64)
        if not len(offset):
            return out
        one = fragment.min() == fragment.max()  # the common case: a source of one fragment
        for f in [int(fragment[0])] if one else np.unique(fragment).tolist():
            index = self._built().get(f)
            if index is None:
                continue
            at = slice(None) if one else fragment == f
            mine = offset[at]
            got = np.full(len(mine), -1, dtype=np.int64)
            inside = mine < len(index)
            got[inside] = index[mine[inside]]
            out[at] = got
        return out


class Versions:
    """The newest version of each key among some sources: the key columns, and per key its
    ``_gen``, ``_rowaddr`` and whether it is a tombstone (see :func:`newest_per_key`)."""

    def __init__(
        self, newest: pa.Table, primary_key: Sequence[str], keyset: KeySet | None = None
    ) -> None:
        self._set(
            newest.select(list(primary_key)),
            newest.column(GEN).to_numpy(),
            newest.column(ROWADDR).to_numpy(),
            newest.column(TOMBSTONE).to_numpy(zero_copy_only=False),
            keyset,
        )

    def _set(
        self,
        keys: pa.Table,
        gen: np.ndarray,
        addr: np.ndarray,
        dead: np.ndarray,
        keyset: KeySet | None,
    ) -> None:
        self.keys = keys
        # No copy where the types already match: a large write's rows are millions.
        self.gen = gen.astype(np.int64, copy=False)
        self.addr = addr.astype(np.int64, copy=False)
        self.dead = dead.astype(bool, copy=False)
        self._keyset = keyset  # None: built at the first probe (see _keys)
        self._base: dict[tuple[str, int], RowMask | None] = {}
        # Per source (a generation's uri), the entry each physical row is the version of, or
        # -1: a row is checked by its row address, never by hashing its key again.
        self._at: dict[str, _ByAddress] = {}

    @classmethod
    def of(
        cls,
        tables: Sequence[pa.Table],
        primary_key: Sequence[str],
        key_fields: Sequence[pa.Field],
        names: Sequence[str] = (),
    ) -> Versions:
        """The newest versions among the rows of ``tables`` (key columns, ``_gen``,
        ``_rowaddr``, ``_tombstone``), with each table indexed (:meth:`index_source`) under
        its name in ``names``, if given.

        The newest version of each key is found, for one integer key column over a dense
        range, by :func:`_dense_newest` (no sort: the key set is built at the first probe,
        which a count never makes), else in the key set's sort order (which the versions keep
        anyway), not by an aggregate and a second key set; where no key repeats (one large
        write), every row is its key's version and its entry is its place in the
        concatenation."""
        if any(t.num_rows for t in tables):
            rows = pa.concat_tables([t for t in tables if t.num_rows])
            gen = rows.column(GEN).to_numpy()
            addr = rows.column(ROWADDR).to_numpy()
            dead = _dead(rows)
            keyset: KeySet | None = None
            keep, span = None, int(addr.max()) + 1
            if gen.min() >= 0 and (int(gen.max()) + 1) * span < 1 << 62:

                def rank(at: np.ndarray) -> np.ndarray:
                    # newest_per_key's rule as one integer: _gen, then _rowaddr (a
                    # generation's reach past 2**32), then a tombstone; only for the rows of
                    # repeated keys (after one large write: a few, not millions)
                    wide = gen[at].astype(np.int64) * span + addr[at].astype(np.int64)
                    return (wide << 1) | dead[at]

                keep = _dense_newest(rows.select(list(primary_key)), rank)
                if keep is None:
                    keyset = KeySet(rows.select(list(primary_key)))
                    keep = keyset.newest_rows(rank)
            if keep is None:
                out = cls(newest_per_key(rows, primary_key), primary_key)
                for name, t in zip(names, tables):
                    out.index_source(name, t, primary_key)
                return out
            keys = rows.select(list(primary_key))
            entry = np.arange(rows.num_rows)
            if not keep.all():
                # Some keys written twice (one large write after a small one): the dropped
                # rows leave numpy arrays and the key columns only, not every column read.
                entry = _renumbered(keep)
                keys = keys.filter(pa.array(keep))
                keyset = None if keyset is None else keyset.subset(keep, entry)
                gen, addr, dead = gen[keep], addr[keep], dead[keep]
            out = cls.__new__(cls)
            out._set(keys, gen, addr, dead, keyset)
            start = 0
            for name, t in zip(names, tables):
                out._at[name] = _ByAddress(t.column(ROWADDR), entry[start : start + t.num_rows])
                start += t.num_rows
            return out
        empty = pa.table({f.name: pa.array([], f.type) for f in key_fields})
        empty = (
            empty.append_column(GEN, pa.array([], pa.int64()))
            .append_column(ROWADDR, pa.array([], pa.uint64()))
            .append_column(TOMBSTONE, pa.array([], pa.bool_()))
        )
        return cls(empty, primary_key)

    def __len__(self) -> int:
        return len(self.gen)

    @property
    def nbytes(self) -> int:
        """With the key set (and its bitset) and the base's row masks computed so far."""
        masks = sum(m.nbytes for m in list(self._base.values()) if m is not None)
        at = sum(a.nbytes for a in self._at.values())
        keyset = 0 if self._keyset is None else self._keyset.nbytes
        return self.keys.nbytes + 3 * self.gen.nbytes + keyset + at + masks

    def _keys(self) -> KeySet:
        """The key set of the entries, built at the first probe (two queries racing may both
        build it: the same set)."""
        if self._keyset is None:
            self._keyset = KeySet(self.keys)
        return self._keyset

    @property
    def rank(self) -> np.ndarray:
        """Newer versions rank higher (the scan's rule)."""
        return (self.gen << 32) | self.addr

    def positions(self, keys: pa.Table) -> np.ndarray:
        """For each of ``keys``, its entry here, or -1."""
        return self._keys().positions(keys)

    def contains(self, keys: pa.Table | pa.RecordBatch) -> np.ndarray:
        """Which of ``keys`` have a version here."""
        return self._keys().contains(keys)

    def base_mask(self, lookup: BaseSourceExec) -> RowMask | None:
        """The base rows of these keys (None: the base is too big to keep a key index), kept
        per base version: a cached MemTable part asks again."""
        version = (lookup.dataset.uri, lookup.dataset.version)
        if version not in self._base:
            self._base[version] = base_mask(lookup, self.keys)
        return self._base[version]

    def take(self, mask: np.ndarray) -> Versions:
        """The entries where ``mask`` is true (these versions themselves if it is everywhere:
        their key set is not built again)."""
        if mask.all():
            return self
        out = Versions.__new__(Versions)
        out.keys = self.keys.filter(pa.array(mask))
        out.gen, out.addr, out.dead = self.gen[mask], self.addr[mask], self.dead[mask]
        out._keyset = None
        out._base, out._at = {}, {}
        return out

    def index_source(self, uri: str, rows: pa.Table, primary_key: Sequence[str]) -> None:
        """Remember which of the rows of source ``uri`` (every live row, with ``_gen`` and
        ``_rowaddr``) are versions here, by row address (see :meth:`is_version_at`)."""
        addr = rows.column(ROWADDR).to_numpy().astype(np.int64)
        pos = self.positions(rows.select(list(primary_key)))
        at = np.where(pos >= 0, pos, 0)
        mine = (pos >= 0) & (self.gen[at] == rows.column(GEN).to_numpy()) & (self.addr[at] == addr)
        self._at[uri] = _ByAddress(addr, np.where(mine, pos, -1))

    def entries_at(self, uri: str, addr: np.ndarray) -> np.ndarray | None:
        """For rows of source ``uri`` given by row address, the entry each is the live
        version of, or -1 (a gather, no hashing); None when the source was not indexed."""
        index = self._at.get(uri)
        if index is None:
            return None
        if not len(self):
            return np.full(len(addr), -1, dtype=np.int64)
        pos = index.get(addr)
        return np.where(~self.dead[np.where(pos >= 0, pos, 0)], pos, -1)

    def is_version_at(
        self, uri: str, addr: np.ndarray, replaced: np.ndarray | None = None
    ) -> np.ndarray | None:
        """As :meth:`is_version`, for rows of source ``uri`` given by row address alone;
        None when the source was not indexed."""
        pos = self.entries_at(uri, addr)
        if pos is None:
            return None
        keep = pos >= 0
        if replaced is None or not keep.any():
            return keep
        return keep & ~replaced[np.where(keep, pos, 0)]

    def is_version_of(
        self,
        source: str,
        rows: pa.Table,
        primary_key: Sequence[str],
        replaced: np.ndarray | None = None,
    ) -> np.ndarray:
        """:meth:`is_version` for rows of one source: by row address when the source was
        indexed (:meth:`index_source`), else by key."""
        keep = self.is_version_at(source, rows.column(ROWADDR).to_numpy(), replaced)
        return keep if keep is not None else self.is_version(rows, primary_key, replaced)

    def is_version(
        self, rows: pa.Table, primary_key: Sequence[str], replaced: np.ndarray | None = None
    ) -> np.ndarray:
        """Which of ``rows`` (with ``_gen`` and ``_rowaddr``) are their key's version here,
        live, and not ``replaced`` (entries a newer source's version replaces)."""
        if not len(self):
            return np.zeros(rows.num_rows, dtype=bool)
        pos = self.positions(rows.select(list(primary_key)))
        hit = pos >= 0
        at = np.where(hit, pos, 0)
        keep = (
            hit
            & (self.gen[at] == rows.column(GEN).to_numpy())
            & (self.addr[at] == rows.column(ROWADDR).to_numpy().astype(np.int64))
            & ~self.dead[at]
        )
        return keep if replaced is None else keep & ~replaced[at]


def _memtables_key(mems: Sequence[SourceLeaf]) -> str | None:
    """A name of the rows of these MemTables (first batch and batch count of each), or None
    when one is a WAL tail (read anew per snapshot) or empty."""
    names = []
    for m in mems:
        if not isinstance(m, MemTableSourceExec) or m.origin != "memtable" or not m.batches:
            return None
        names.append(f"{id(m.batches[0])}:{len(m.batches)}")
    return ";".join(names)


def _generations_key(gens: Sequence[GenerationSourceExec]) -> str:
    """A set of generations' name in the caches: their uris, sorted."""
    return "\n".join(sorted(g.uri for g in gens))


def _first_batches(mems: Sequence[SourceLeaf]) -> list[pa.RecordBatch]:
    """The MemTables' first batches: a cache entry named by their ids holds them, so that
    the ids are never reused while it lives."""
    return [m.batches[0] for m in mems if isinstance(m, MemTableSourceExec)]


def _source_name(source: SourceLeaf) -> str:
    """A newer source's name in :class:`Versions` (a generation: its uri; a MemTable: its
    first batch, which the cached versions hold, so the name is never another's)."""
    if isinstance(source, GenerationSourceExec):
        return source.uri
    first = (
        id(source.batches[0]) if isinstance(source, MemTableSourceExec) and source.batches else 0
    )
    return f"{source.region_id}/{source.generation}/{first}"


def _sized(entry: tuple[tuple[Versions, Versions, np.ndarray], list]) -> tuple[Any, int]:
    (_, in_mems, replaced), _ = entry  # the generations' part is its own cache entry
    return entry, in_mems.nbytes + replaced.nbytes


class DeduplicateExec(ExecNode):
    """Newest version per key across the base table and newer sources; tombstones remove keys.

    Partition ``i`` yields base part ``i`` (fragments or row ranges of them) for ``i`` below
    the number of base parts; the last partition yields the surviving rows of the flushed
    generations, then of the MemTables and WAL tails. The output columns can be chosen per call,
    because DataFusion only names them when it executes a partition.
    """

    name = "DeduplicateExec"
    _locks = ("_lock",)
    _computed = ("_split", "_masked", "_newer_keys")

    def __init__(
        self,
        newer: Sequence[SourceLeaf],
        base: lance.LanceDataset | None,
        base_parts: Sequence[Sequence[FragmentRange] | None],
        *,
        primary_key: Sequence[str],
        predicate: Predicate | None,
        output: pa.Schema,
        caches: Caches,
        source_schema: pa.Schema | None = None,
    ) -> None:
        self.caches = caches
        self.newer = list(newer)
        self.base_dataset = base
        # Given the snapshot's source schema (the lookup cache keeps whole fragments in it),
        # a filtered scan of a small base may read them (see scan_in_memory); decided once
        # per plan, so that the plan explains what runs, and counted when it runs.
        self.source_schema = source_schema
        self._counted = False
        self.base_in_memory = (
            base is not None
            and source_schema is not None
            and predicate is not None
            and scan_in_memory(base, caches)
        )
        self.base_parts = [None if p is None else list(p) for p in base_parts] if base else []
        self.primary_key = list(primary_key)
        self.predicate = predicate
        self.output = output
        self._lock = threading.Lock()
        self._split: tuple[Versions, Versions, np.ndarray] | None = None
        self._masked: list[RowMask] | Literal[False] | None = None
        self._newer_keys: KeyMembership | None = None
        # Set by a reader whose processes may read base parts only (a Spark task: see
        # memwal_sql.spark.source): there a base part without a row mask probes the newer
        # sources' keys, one key set, instead of waiting for their newest versions, which
        # only the newer-rows partition needs.
        self.base_probes_keys = False
        self._base_scans = [self._base_scan(p, output) for p in self.base_parts]

    @property
    def schema(self) -> pa.Schema:
        return self.output

    @property
    def children(self) -> list[ExecNode]:
        return [*self.newer, *self._base_scans]

    @property
    def partitions(self) -> int:
        return len(self.base_parts) + 1

    def describe(self) -> str:
        return (
            f"{self.name}: key={self.primary_key} newer_sources={len(self.newer)} "
            f"base_parts={len(self.base_parts)} predicate={self.predicate}"
        )

    def versions(self) -> tuple[Versions, Versions, np.ndarray]:
        """The newest version of every key among the newer sources, in two parts: among the
        flushed generations and among the MemTables and WAL tails; and which generation
        winners a MemTable version replaces (the scan's rule: highest ``_gen``, then
        ``_rowaddr``). Kept per set of sources: generations never change, and a MemTable only
        ever gains batches, so its first batch and batch count name its rows (a WAL tail is
        read anew by every snapshot: a query with one computes its part itself)."""
        with self._lock:
            if self._split is None:
                gens, mems, key = self._sources()
                gens_key = _generations_key(gens)
                if key is None:
                    self._split = self._split_versions(gens, gens_key, mems)
                else:
                    firsts = _first_batches(mems)
                    split, _ = self.caches.scan.get(
                        "split_versions",
                        key,
                        lambda: _sized((self._split_versions(gens, gens_key, mems), firsts)),
                        # the ids in the key are of batches the entry holds: never reused
                        lambda entry: all(a is b for a, b in zip(entry[1], firsts)),
                    )
                    self._split = split
            return self._split

    def _sources(self) -> tuple[list[GenerationSourceExec], list[SourceLeaf], str | None]:
        """The flushed generations, the other newer sources, and a name of all their rows
        under which what is computed of them is cached (None with a WAL tail: see
        :meth:`versions`)."""
        gens = [s for s in self.newer if isinstance(s, GenerationSourceExec)]
        mems = [s for s in self.newer if not isinstance(s, GenerationSourceExec)]
        mems_key = _memtables_key(mems)
        if mems_key is None:
            return gens, mems, None
        return gens, mems, f"{_generations_key(gens)}\n{mems_key}"

    def _split_versions(
        self,
        gens: list[GenerationSourceExec],
        gens_key: str,
        mems: list[SourceLeaf],
    ) -> tuple[Versions, Versions, np.ndarray]:
        cols = [*self.primary_key, TOMBSTONE]

        def load() -> tuple[Versions, int]:
            # Lance releases the GIL: read the generations side by side.
            tables = list(_READERS.map(lambda g: g.read_counted(cols), gens))
            names = [_source_name(g) for g in gens]
            got = Versions.of(tables, self.primary_key, self._key_fields(), names)
            return got, got.nbytes

        in_gens: Versions = self.caches.scan.get("newest_versions", gens_key, load)
        # The versions keep the base row masks and bitsets they compute: count them as of now.
        self.caches.scan.resize("newest_versions", gens_key, in_gens.nbytes)
        mem_rows = [m.read_counted(cols) for m in mems]
        names = [_source_name(m) for m in mems]
        in_mems = Versions.of(mem_rows, self.primary_key, self._key_fields(), names)
        # No generation yet (the first read after a large write): nothing to look up.
        pos = in_gens.positions(in_mems.keys) if len(in_gens) else np.full(len(in_mems), -1)
        hit = pos >= 0
        mem_wins = ~hit
        if hit.any():
            mem_wins |= in_mems.rank > in_gens.rank[np.where(hit, pos, 0)]
        replaced = np.zeros(len(in_gens), dtype=bool)
        replaced[pos[hit & mem_wins]] = True
        won = in_mems.take(mem_wins)
        if won is not in_mems:  # entries dropped: index the sources again
            for name, rows in zip(names, mem_rows):
                won.index_source(name, rows, self.primary_key)
        return in_gens, won, replaced

    def _key_fields(self) -> list[pa.Field]:
        schema = self.newer[0].schema if self.newer else None
        if schema is None:
            return [pa.field(k, pa.int64()) for k in self.primary_key]
        return [schema.field(k) for k in self.primary_key]

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        return self.execute_columns(partition, self.output)

    def execute_columns(self, partition: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """Batches of ``partition`` with the columns of ``schema``: only those are read."""
        self._check_partition(partition)
        i, output = partition, schema
        # The base parts come first and the newer rows are one partition: DataFusion runs a
        # partition per core, and the base (Lance's scan, the longest) must start at once.
        # With the newer rows split in two, the base often waited for one of them (the
        # filtered scans of benchmarks/bench_read.py, docs/performance.md).
        if i < len(self.base_parts):
            yield from self._base_rows(self.base_parts[i], output)
        else:
            yield from self._newer_rows(output)

    def _newer_rows(self, output: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The surviving rows of the flushed generations, the MemTables and the WAL tails."""
        if not self.newer:
            return
        in_gens, in_mems, replaced = self.versions()
        if not len(output) and self.predicate is None:
            # count(*): each key's newest version is one entry of the generations' versions
            # (none of the MemTables' replaced it) or of the MemTables', so the newer rows are
            # counted from the versions: no source is read again, no row checked by address.
            for source in self.newer:
                source.count_open()
            live = np.count_nonzero(~in_gens.dead & ~replaced) + np.count_nonzero(~in_mems.dead)
            if live:
                yield from pa.table({"n": pa.nulls(int(live))}).select([]).to_batches()
            return
        wanted = [f.name for f in output if f.name not in (GEN, ROWADDR)]
        columns = list(dict.fromkeys([*wanted, *self.primary_key, TOMBSTONE]))
        # With a filter, only matching rows are read in full (the filter goes into Lance for
        # generations); either way a row is output only if it is its key's newest version.
        read_columns = None if self.predicate is not None else columns
        pk = self.primary_key
        sources = self.newer
        kept = self._generation_entries(in_gens)
        if kept is not None:
            sources = [s for s in self.newer if not isinstance(s, GenerationSourceExec)]
            # _rowaddr always: a count(*) still takes a column's worth of rows.
            names = [f.name for f in output] or [ROWADDR]
            taken = []
            for g, whole, entry in kept:
                g.count_open()
                rows = self._versions_in(whole, names, entry, replaced)
                if rows.num_rows:  # no empty batches (PySpark's createDataFrame stops at one)
                    taken.append(rows)
            if taken:
                yield from conform(pa.concat_tables(taken), output).to_batches()
        for source in sources:
            rows = source.read_counted(read_columns, self.predicate)
            if not rows.num_rows:
                continue
            if isinstance(source, GenerationSourceExec):
                keep = in_gens.is_version_of(_source_name(source), rows, pk, replaced)
            else:
                keep = in_mems.is_version_of(_source_name(source), rows, pk)
            if keep.any():
                yield from conform(rows.filter(pa.array(keep)), output).to_batches()

    def _generation_entries(
        self, in_gens: Versions
    ) -> list[tuple[GenerationSourceExec, pa.Table, np.ndarray]] | None:
        """Per flushed generation: its rows (every physical row, kept whole in the lookup
        cache and shared with lookups) and the entry in ``in_gens`` each is the live version
        of, or -1; None when a generation is too big to keep whole. The entries are kept per
        ``in_gens`` (generations never change), 4 bytes a row: a query then selects a
        generation's rows with one filter evaluation and one ``take``."""
        gens = [s for s in self.newer if isinstance(s, GenerationSourceExec)]
        wholes = [g.whole_rows() for g in gens]
        if not gens or any(w is None for w in wholes):
            return None

        def load() -> tuple[tuple[Versions, list[np.ndarray]], int]:
            entries = []
            for g, whole in zip(gens, wholes):
                assert whole is not None
                pos = in_gens.entries_at(_source_name(g), whole.column(ROWADDR).to_numpy())
                assert pos is not None  # in_gens indexed every generation it was built from
                entries.append(pos.astype(np.int32))
            return (in_gens, entries), sum(e.nbytes for e in entries)

        _, entries = self.caches.scan.get(
            "generation_entries",
            _generations_key(gens),
            load,
            lambda entry: entry[0] is in_gens,  # they index this in_gens
        )
        return [(g, w, e) for g, w, e in zip(gens, wholes, entries)]

    def _versions_in(
        self, whole: pa.Table, names: list[str], entry: np.ndarray, replaced: np.ndarray
    ) -> pa.Table:
        """Columns ``names`` of the rows of one generation that are live versions no MemTable
        replaces and that match the predicate."""
        if self.predicate is not None and whole.num_rows:
            hit = pc.fill_null(evaluate(self.predicate, whole), False)
            at = pc.indices_nonzero(hit).to_numpy()
            at = at[entry[at] >= 0]
        else:
            at = np.flatnonzero(entry >= 0)
        if len(at) and replaced.any():  # a MemTable holds a newer version of some of them
            at = at[~replaced[entry[at]]]
        return whole.select(names).take(pa.array(at))

    def _base_scan(
        self, part: Sequence[FragmentRange] | None, output: pa.Schema, with_keys: bool = True
    ) -> BaseSourceExec:
        assert self.base_dataset is not None
        wanted = [f.name for f in output if f.name not in (GEN, ROWADDR)]
        columns = list(dict.fromkeys([*wanted, *(self.primary_key if with_keys else [])]))
        ds = self.base_dataset
        ranges = None if part is None else tuple(part)
        scan = Scan(tuple(columns), self.predicate, ranges, in_memory=self.base_in_memory)
        schema = ds.schema if self.source_schema is None else self.source_schema
        return BaseSourceExec(ds, schema, scan, caches=self.caches)

    def superseded(self) -> list[RowMask] | None:
        """The base table's deletion mask for this snapshot: base rows whose key has a version
        (or a tombstone) in a newer source. The generations' part is kept per (set of
        generations, base version); the MemTables' part is this query's. Found through the
        base's cached key index; None when the base is too big to keep one (then each base
        batch's keys are probed instead)."""
        assert self.base_dataset is not None
        ds = self.base_dataset

        def key_lookup() -> BaseSourceExec:
            return BaseSourceExec(
                ds, ds.schema, Lookup(tuple(self.primary_key)), caches=self.caches
            )

        with self._lock:
            # No key index yet (a big base builds it in the background): probe each base
            # batch's keys instead, and cache no mask that says so. Decided before the
            # versions are computed: a probe may not need them (see base_probes_keys).
            if self._masked is None and not key_lookup().uses_key_index():
                self._masked = False
            if self._masked is not None:
                return None if self._masked is False else self._masked
        in_gens, in_mems, _ = self.versions()
        with self._lock:
            if self._masked is None:
                lookup = key_lookup()

                def load() -> tuple[RowMask | None, int]:
                    mask = base_mask(lookup, in_gens.keys)
                    return mask, 64 if mask is None else mask.nbytes

                gens = _generations_key(
                    [s for s in self.newer if isinstance(s, GenerationSourceExec)]
                )
                from_gens = self.caches.scan.get(
                    "base_mask", f"{ds.uri}@{ds.version}\n{gens}", load
                )
                from_mems = in_mems.base_mask(lookup)
                if from_gens is None or from_mems is None:
                    self._masked = False
                else:
                    self._masked = [m for m in (from_gens, from_mems) if len(m)]
            return None if self._masked is False else self._masked

    def _newer_probe(self) -> list[KeyMembership] | list[Versions]:
        """What a base batch's keys are probed against when there is no row mask: the newest
        versions, or with ``base_probes_keys`` (unless this process has the versions only)
        one set of every newer row's key, tombstones too, kept per set of sources as the
        versions are. It reads the same cached key columns the versions do, and skips
        finding the newest of each key and sorting the keys."""
        _, mems, key = self._sources()
        cached = self.caches.scan.contains
        has_versions = self._split is not None or (
            key is not None and cached("split_versions", key)
        )
        has_keys = self._newer_keys is not None or (key is not None and cached("newer_keys", key))
        if not self.base_probes_keys or not self.newer or (has_versions and not has_keys):
            in_gens, in_mems, _ = self.versions()
            return [in_gens, in_mems]

        def load() -> tuple[tuple[KeyMembership, list[pa.RecordBatch]], int]:
            cols = [*self.primary_key, TOMBSTONE]  # the versions' columns: one cache entry
            tables = list(_READERS.map(lambda s: s.read_counted(cols), self.newer))
            keys = KeyMembership(pa.concat_tables(tables).select(self.primary_key))
            return (keys, _first_batches(mems)), keys.nbytes

        with self._lock:
            if self._newer_keys is None:
                if key is None:  # a WAL tail: read anew by every snapshot, kept by none
                    self._newer_keys = load()[0][0]
                else:
                    firsts = _first_batches(mems)
                    self._newer_keys, _ = self.caches.scan.get(
                        "newer_keys",
                        key,
                        load,
                        lambda entry: all(a is b for a, b in zip(entry[1], firsts)),
                    )
            return [self._newer_keys]

    def _base_rows(
        self, part: Sequence[FragmentRange] | None, output: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        if self.predicate is not None and self.base_dataset is not None:
            with self._lock:
                counted, self._counted = self._counted, True
            if not counted:
                count_filtered_scan(self.base_dataset, self.caches)
        masks = self.superseded()
        # With the mask, a base row is kept or dropped by its row address alone: the key
        # columns are read only if the query wants them.
        newer = self._newer_probe() if masks is None else None
        for batch in self._base_scan(part, output, with_keys=masks is None).execute():
            if masks is not None:
                addr = batch.column(ROWADDR).to_numpy()
                hits = [h for h in (m.hits(addr) for m in masks) if h is not None]
                if hits:
                    hit = np.logical_or.reduce(hits) if len(hits) > 1 else hits[0]
                    if hit.any():
                        batch = batch.filter(pa.array(~hit))
            else:
                assert newer is not None
                keys = batch.select(self.primary_key)
                hit = np.logical_or.reduce([s.contains(keys) for s in newer])
                if hit.any():
                    batch = batch.filter(pa.array(~hit))
            if batch.num_rows:
                yield from conform(
                    pa.Table.from_batches([batch]), output, BASE_GENERATION
                ).to_batches()
