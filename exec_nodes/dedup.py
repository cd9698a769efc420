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
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator, Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import BASE_GENERATION, GEN, ROWADDR, TOMBSTONE, ExecNode, conform
from exec_nodes.keyset import KeySet, last_per_key
from exec_nodes.lookup import BaseLookupExec
from exec_nodes.scan import BaseScanExec, SourceExec
from planner.predicate import Predicate


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
    dead = (table.column(TOMBSTONE).to_numpy(zero_copy_only=False) if TOMBSTONE in
            table.column_names else np.zeros(table.num_rows, dtype=bool))
    if table.num_rows and (gen.min() < 0 or gen.max() >= 1 << 30 or addr.max() >= 1 << 32):
        return _newest_by_sort(table, primary_key, dead)
    # One hash aggregate instead of a multi-column sort: pack (gen, rowaddr, tombstone) into one
    # integer whose maximum per key is the newest version (row addresses of newer-than-base
    # sources are offsets below 2^32, generations far below 2^30).
    packed = (gen.astype(np.int64) << 33) | (addr.astype(np.int64) << 1) | dead.astype(np.int64)
    keys, p = last_per_key(table.select(list(primary_key)), packed)
    return keys.append_column(GEN, pa.array(p >> 33)) \
        .append_column(ROWADDR, pa.array(((p >> 1) & 0xFFFFFFFF).astype(np.uint64))) \
        .append_column(TOMBSTONE, pa.array((p & 1).astype(bool)))


def _newest_by_sort(table: pa.Table, primary_key: Sequence[str], dead: np.ndarray) -> pa.Table:
    t = table.select([*primary_key, GEN, ROWADDR]).append_column(TOMBSTONE, pa.array(dead))
    order = pc.sort_indices(t, sort_keys=[*[(k, "ascending") for k in primary_key],
                                          (GEN, "descending"), (ROWADDR, "descending")])
    s = t.take(order)
    first = np.ones(s.num_rows, dtype=bool)
    if s.num_rows > 1:
        differs = np.zeros(s.num_rows - 1, dtype=bool)
        for k in primary_key:
            col = s.column(k).combine_chunks()
            differs |= pc.not_equal(col[1:], col[:-1]).to_numpy(zero_copy_only=False)
        first[1:] = differs
    return s.filter(pa.array(first))


_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memwal-read")


class DeduplicateExec(ExecNode):
    """Newest version per key across the base table and newer sources; tombstones remove keys.

    Partition 0 yields the surviving newer rows; partition ``i >= 1`` yields base part ``i - 1``
    (a group of the base table's fragments). The output columns can be chosen per call, because
    DataFusion only names them when it executes a partition.
    """

    name = "DeduplicateExec"
    _locks = ("_lock",)
    _computed = ("_winners", "_keys", "_masked")

    def __init__(
        self,
        newer: Sequence[SourceExec],
        base: lance.LanceDataset | None,
        base_parts: Sequence[Sequence[int] | None],
        *,
        primary_key: Sequence[str],
        predicate: Predicate | None,
        output: pa.Schema,
    ) -> None:
        self.newer = list(newer)
        self.base_dataset = base
        self.base_parts = [None if p is None else list(p) for p in base_parts] if base else []
        self.primary_key = list(primary_key)
        self.predicate = predicate
        self.output = output
        self._lock = threading.Lock()
        self._winners: pa.Table | None = None
        self._keys: KeySet | None = None
        self._masked: np.ndarray | bool | None = None
        self._base_scans = [self._base_scan(p, output) for p in self.base_parts]

    @property
    def schema(self) -> pa.Schema:
        return self.output

    @property
    def children(self) -> list[ExecNode]:
        return [*self.newer, *self._base_scans]

    @property
    def num_partitions(self) -> int:
        return 1 + len(self.base_parts)

    def describe(self) -> str:
        return (f"{self.name}: key={self.primary_key} newer_sources={len(self.newer)} "
                f"base_parts={len(self.base_parts)} predicate={self.predicate}")

    def winners(self) -> tuple[pa.Table, KeySet]:
        """The newest version of every key in the newer sources, by key columns only
        (``_gen``, ``_rowaddr``, ``_tombstone`` say which row it is), and an index of them."""
        with self._lock:
            if self._keys is None:
                cols = [*self.primary_key, TOMBSTONE]
                # Lance releases the GIL: read the sources side by side.
                tables = [t for t in _READERS.map(lambda s: s.read_counted(cols), self.newer)
                          if t.num_rows]
                if tables:
                    self._winners = newest_per_key(pa.concat_tables(tables), self.primary_key)
                else:
                    self._winners = pa.table({k: pa.array([], f.type) for k, f in
                                              ((f.name, f) for f in self._key_fields())})
                self._keys = KeySet(self._winners.select(self.primary_key))
            assert self._winners is not None
            return self._winners, self._keys

    def _key_fields(self) -> list[pa.Field]:
        schema = self.newer[0].schema if self.newer else None
        if schema is None:
            return [pa.field(k, pa.int64()) for k in self.primary_key]
        return [schema.field(k) for k in self.primary_key]

    def execute(self) -> Iterator[pa.RecordBatch]:
        for i in range(self.num_partitions):
            yield from self.execute_partition(i)

    def execute_partition(self, i: int, output: pa.Schema | None = None) -> Iterator[pa.RecordBatch]:
        """Batches of partition ``i`` with the columns of ``output`` (default: the node's)."""
        output = output if output is not None else self.output
        if i == 0:
            yield from self._newer_rows(output)
        else:
            yield from self._base_rows(self.base_parts[i - 1], output)

    def _newer_rows(self, output: pa.Schema) -> Iterator[pa.RecordBatch]:
        winners, keys = self.winners()
        if winners.num_rows == 0:
            return
        win_gen = winners.column(GEN).to_numpy()
        win_addr = winners.column(ROWADDR).to_numpy()
        win_dead = winners.column(TOMBSTONE).to_numpy(zero_copy_only=False)
        wanted = [f.name for f in output if f.name not in (GEN, ROWADDR)]
        columns = list(dict.fromkeys([*wanted, *self.primary_key, TOMBSTONE]))
        # With a filter, only matching rows are read in full (the filter goes into Lance for
        # generations); either way a row is output only if it is its key's newest version.
        read_columns = None if self.predicate is not None else columns
        for rows in _READERS.map(lambda s: s.read_counted(read_columns, self.predicate),
                                 self.newer):
            if rows.num_rows == 0:
                continue
            pos = keys.positions(rows.select(self.primary_key))
            hit = pos >= 0
            safe = np.where(hit, pos, 0)
            keep = (hit & (win_gen[safe] == rows.column(GEN).to_numpy())
                    & (win_addr[safe] == rows.column(ROWADDR).to_numpy()) & ~win_dead[safe])
            if keep.any():
                yield from conform(rows.filter(pa.array(keep)), output).to_batches()

    def _base_scan(self, part: Sequence[int] | None, output: pa.Schema,
                   with_keys: bool = True) -> BaseScanExec:
        assert self.base_dataset is not None
        wanted = [f.name for f in output if f.name not in (GEN, ROWADDR)]
        columns = list(dict.fromkeys([*wanted, *(self.primary_key if with_keys else [])]))
        return BaseScanExec(self.base_dataset, columns, self.predicate, fragment_ids=part)

    def superseded(self) -> np.ndarray | None:
        """The base table's deletion mask for this snapshot: the sorted row addresses of base
        rows whose key has a newer version (or a tombstone) in a newer source, found through
        the base's cached key index; None when the base is too big to keep one (then each
        base batch's keys are probed instead)."""
        winners, _ = self.winners()
        with self._lock:
            if self._masked is None:
                if winners.num_rows == 0:
                    self._masked = np.zeros(0, dtype=np.uint64)
                else:
                    assert self.base_dataset is not None
                    lookup = BaseLookupExec(self.base_dataset, self.base_dataset.schema,
                                            self.primary_key)
                    masked = lookup.addresses_of(winners.select(self.primary_key))
                    self._masked = masked if masked is not None else False
            return None if self._masked is False else self._masked  # type: ignore[return-value]

    def _base_rows(self, part: Sequence[int] | None, output: pa.Schema) -> Iterator[pa.RecordBatch]:
        masked = self.superseded()
        # With the mask, a base row is kept or dropped by its row address alone: the key
        # columns are read only if the query wants them.
        keys = None if masked is not None else self.winners()[1]
        for batch in self._base_scan(part, output, with_keys=masked is None).execute():
            if masked is not None:
                if len(masked):
                    addr = batch.column(ROWADDR).to_numpy()
                    at = np.searchsorted(masked, addr)
                    hit = (at < len(masked)) & (masked[np.minimum(at, len(masked) - 1)] == addr)
                    if hit.any():
                        batch = batch.filter(pa.array(~hit))
            elif keys is not None and len(keys):
                keep = ~keys.contains(batch.select(self.primary_key))
                if not keep.all():
                    batch = batch.filter(pa.array(keep))
            if batch.num_rows:
                yield from conform(pa.Table.from_batches([batch]), output,
                                   BASE_GENERATION).to_batches()
