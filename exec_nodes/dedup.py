"""DeduplicateExec: the LSM-merging read of a scan.

Children are the newer-than-base sources of the queried regions (flushed generations, MemTables,
WAL tails) and the base-table scan, split in parts. The newer sources are small: they are read
whole, sorted by primary key then ``_gen`` and ``_rowaddr`` descending, and the first row of each
key wins (a tombstone winner removes the key). Only then is the query's filter applied, so a row
whose newest version no longer matches never comes back from an older source. The base is
streamed: each batch, already filtered and projected by Lance, loses the rows whose key has any
newer version.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import BASE_GENERATION, GEN, ROWADDR, TOMBSTONE, ExecNode
from exec_nodes.keyset import KeySet
from exec_nodes.scan import BaseScanExec, SourceExec


def newest_per_key(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The newest row of every key: highest ``_gen``, then highest ``_rowaddr``.

    Example:
        >>> t = pa.table({"id": [1, 1, 2], "_gen": [1, 2, 1], "_rowaddr": pa.array([0, 0, 1], pa.uint64())})
        >>> newest_per_key(t, ["id"])["_gen"].to_pylist()
        [2, 1]
    """
    if table.num_rows <= 1:
        return table
    order = pc.sort_indices(
        table, sort_keys=[*[(k, "ascending") for k in primary_key],
                          (GEN, "descending"), (ROWADDR, "descending")],
    )
    s = table.take(order)
    first = np.ones(s.num_rows, dtype=bool)
    differs = np.zeros(s.num_rows - 1, dtype=bool)
    for k in primary_key:
        col = s.column(k).combine_chunks()
        differs |= pc.not_equal(col[1:], col[:-1]).to_numpy(zero_copy_only=False)
    first[1:] = differs
    return s.filter(pa.array(first))


class DeduplicateExec(ExecNode):
    """Newest version per key across the base table and newer sources; tombstones remove keys.

    Partition 0 yields the surviving newer rows; partition ``i >= 1`` yields base part ``i - 1``
    (a group of the base table's fragments). The output columns can be chosen per call, because
    DataFusion only names them when it executes a partition.
    """

    name = "DeduplicateExec"

    def __init__(
        self,
        newer: Sequence[SourceExec],
        base: lance.LanceDataset | None,
        base_parts: Sequence[Sequence[int] | None],
        *,
        primary_key: Sequence[str],
        filter: pc.Expression | None,
        output: pa.Schema,
    ) -> None:
        self.newer = list(newer)
        self.base_dataset = base
        self.base_parts = [None if p is None else list(p) for p in base_parts] if base else []
        self.primary_key = list(primary_key)
        self.filter = filter
        self.output = output
        self._lock = threading.Lock()
        self._winners: pa.Table | None = None
        self._keys: KeySet | None = None

    @property
    def schema(self) -> pa.Schema:
        return self.output

    @property
    def children(self) -> list[ExecNode]:
        return [*self.newer, *[self._base_scan(p, self.output) for p in self.base_parts]]

    @property
    def num_partitions(self) -> int:
        return 1 + len(self.base_parts)

    def describe(self) -> str:
        return (f"{self.name}: key={self.primary_key} newer_sources={len(self.newer)} "
                f"base_parts={len(self.base_parts)} filter={self.filter}")

    def winners(self) -> tuple[pa.Table, KeySet]:
        """Newest row per key over the newer sources (tombstones included), and their keys."""
        with self._lock:
            if self._keys is None:
                tables = [t for t in (s.read_counted() for s in self.newer) if t.num_rows]
                if tables:
                    merged = pa.concat_tables(tables)
                    self._winners = newest_per_key(merged, self.primary_key)
                    self._keys = KeySet(self._winners.select(self.primary_key))
                else:
                    self._winners = None
                    self._keys = KeySet(pa.table({k: pa.array([], pa.int64())
                                                  for k in self.primary_key}))
            return (self._winners if self._winners is not None else pa.table({})), self._keys

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
        winners, _ = self.winners()
        if winners.num_rows == 0:
            return
        live = winners.filter(pc.invert(winners.column(TOMBSTONE)))
        if self.filter is not None and live.num_rows:
            live = live.filter(self.filter)
        if live.num_rows:
            yield from _project(live, output, None).to_batches()

    def _base_scan(self, part: Sequence[int] | None, output: pa.Schema) -> BaseScanExec:
        assert self.base_dataset is not None
        wanted = [f.name for f in output if f.name not in (GEN, ROWADDR)]
        columns = list(dict.fromkeys([*wanted, *self.primary_key]))
        return BaseScanExec(self.base_dataset, columns, self.filter, fragment_ids=part)

    def _base_rows(self, part: Sequence[int] | None, output: pa.Schema) -> Iterator[pa.RecordBatch]:
        _, keys = self.winners()
        for batch in self._base_scan(part, output).execute():
            if len(keys):
                keep = ~keys.contains(batch.select(self.primary_key))
                if not keep.all():
                    batch = batch.filter(pa.array(keep))
            if batch.num_rows:
                yield from _project(pa.Table.from_batches([batch]), output,
                                    BASE_GENERATION).to_batches()


def _project(table: pa.Table, output: pa.Schema, generation: int | None) -> pa.Table:
    """``table`` with exactly the columns of ``output`` (``_gen`` filled for base rows)."""
    if len(output) == 0:  # count(*): batches with rows but no columns
        return table.select([])
    cols = []
    for f in output:
        if f.name == GEN and generation is not None:
            cols.append(pa.array(np.full(table.num_rows, generation, dtype=np.int64)))
        else:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(cols, schema=output)
