"""The in-memory MemTable of a region writer and last-write-wins deduplication.

A MemTable is an append-only list of WAL-schema record batches of one generation. Appends are
immediately visible to readers in the same process (they copy the batch list). Deduplication is
deferred to the flush (and to readers), where it is one vectorised sort (a group-by for
readers) instead of per-row Python work on the write path.

Example:
    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1, 2, 1], "v": ["a", "b", "c"]})
    >>> latest_per_key(t, ["id"]).to_pydict()
    {'id': [2, 1], 'v': ['b', 'c']}
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.formats.key_index import SortedKeys, key_order, key_values
from memwal_sql.structures.keyset import last_per_key

_log = logging.getLogger(__name__)

_ROW = "__memwal_row"

# What readers keep of a MemTable that a flush makes obsolete (memwal_sql.writer.memtable_indexes registers
# the release of its in-memory indexes): called with the flushed MemTable's batches. A reader
# module registers once its function exists, so a flush never meets a half-imported one.
_FLUSH_LISTENERS: list[Callable[[Sequence[pa.RecordBatch]], None]] = []


def on_flushed(listener: Callable[[Sequence[pa.RecordBatch]], None]) -> None:
    """Call ``listener(batches)`` whenever a MemTable of this process has been flushed."""
    _FLUSH_LISTENERS.append(listener)


def flushed(memtable: MemTable) -> None:
    """Tell the listeners (:func:`on_flushed`) that ``memtable`` has been flushed.

    A listener only releases what a reader kept: one that fails is logged, and the flush,
    already committed, still counts as done (the writer must not fail over a cache).
    """
    batches = memtable.batches()
    for listener in list(_FLUSH_LISTENERS):
        try:
            listener(batches)
        except Exception:
            _log.exception("a flush listener failed after generation %d", memtable.generation)


def duplicate_keys(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The keys ``table`` holds more than once, with their ``count``.

    Example:
        >>> duplicate_keys(pa.table({"id": [1, 2, 1]}), ["id"]).to_pylist()
        [{'id': 1, 'count': 2}]
    """
    pk = list(primary_key)
    counts = table.select(pk).group_by(pk, use_threads=False).aggregate([([], "count_all")])
    counts = counts.select([*pk, "count_all"]).rename_columns([*pk, "count"])
    return counts.filter(pc.greater(counts.column("count"), 1))


def latest_per_key(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Keep the last row of every key, in insertion order (tombstones are kept: they are rows)."""
    n = table.num_rows
    if n <= 1:
        return table
    keys, last = last_per_key(table.select(list(primary_key)), np.arange(n, dtype=np.int64))
    if keys.num_rows == n:
        return table
    return table.take(pa.array(np.sort(last)))


def newest_per_key(table: pa.Table, primary_key: Sequence[str], sequence: str) -> pa.Table:
    """Keep the row of every key with the highest ``sequence`` (the later row on a tie), in
    insertion order.

    Example:
        >>> t = pa.table({"id": [1, 1, 2, 1], "ts": [5, 3, 1, 5], "v": ["a", "b", "c", "d"]})
        >>> newest_per_key(t, ["id"], "ts").to_pydict()
        {'id': [2, 1], 'ts': [1, 5], 'v': ['c', 'd']}
    """
    at = newest_positions(table, primary_key, sequence)
    return table if at is None else table.take(at)


def newest_positions(
    rows: pa.Table | pa.RecordBatch, primary_key: Sequence[str], sequence: str
) -> pa.Array | None:
    """The positions, ascending, of :func:`newest_per_key`'s rows; ``None`` if it keeps all.

    Example:
        >>> t = pa.table({"id": [1, 1, 2], "ts": [5, 3, 1]})
        >>> newest_positions(t, ["id"], "ts").to_pylist()
        [0, 2]
    """
    n = rows.num_rows
    if n <= 1:
        return None
    # Arrow's sort is stable: ranked by sequence, then by position, the last rank wins.
    order = pc.sort_indices(rows.column(sequence)).to_numpy()
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    keys, best = last_per_key(pa.table({k: rows.column(k) for k in primary_key}), rank)
    if keys.num_rows == n:
        return None
    return pa.array(np.sort(order[best]))


def latest_per_key_in_key_order(
    table: pa.Table, primary_key: Sequence[str]
) -> tuple[pa.Table, SortedKeys]:
    """:func:`latest_per_key`, found by one sort of the keys, and the kept rows' keys sorted,
    which a flushed generation's key index is written from: a flush sorts its keys once
    instead of grouping them, then sorting them.

    Example:
        >>> t = pa.table({"id": [1, 2, 1], "v": ["a", "b", "c"]})
        >>> rows, keys = latest_per_key_in_key_order(t, ["id"])
        >>> rows.to_pydict(), keys.order.tolist()
        ({'id': [2, 1], 'v': ['b', 'c']}, [1, 0])
    """
    values = key_values(table.select(list(primary_key)))
    order = key_order(values)
    n = len(order)
    if n <= 1:
        return table, SortedKeys(values, order)
    # In key order, each key's rows are in write order (the sort is stable): its last one wins.
    last = np.ones(n, dtype=bool)
    if pa.types.is_integer(values.type) and values.null_count == 0:
        ordered = values.to_numpy()[order]
        last[:-1] = ordered[1:] != ordered[:-1]
    else:
        ordered = values.take(pa.array(order))
        head, tail = ordered.slice(0, n - 1), ordered.slice(1)
        differs = pc.not_equal(head, tail).to_numpy(zero_copy_only=False)
        head_null = pc.is_null(head).to_numpy(zero_copy_only=False)
        tail_null = pc.is_null(tail).to_numpy(zero_copy_only=False)
        # Nulls sort first: a null then a value differ, two nulls are one key.
        last[:-1] = np.where(head_null, ~tail_null, differs)
    kept = order[last]  # one row per key, in key order
    if len(kept) == n:
        return table, SortedKeys(values, order)
    in_write_order = np.sort(kept)
    offset = np.empty(n, dtype=np.int64)
    offset[in_write_order] = np.arange(len(kept))
    positions = pa.array(in_write_order)
    return table.take(positions), SortedKeys(values.take(positions), offset[kept])


class MemTable:
    """Batches of one generation, in write order."""

    def __init__(self, schema: pa.Schema, generation: int) -> None:
        self.schema = schema
        self.generation = generation
        self._batches: list[pa.RecordBatch] = []
        self._lock = threading.Lock()
        self.num_rows = 0
        self.nbytes = 0
        self.last_seq = 0  # sequence number of the newest batch (see WalWriter)
        self.wal_position = 0  # highest WAL position holding rows of this generation
        self.frozen = False

    def append(self, batch: pa.RecordBatch, seq: int, nbytes: int | None = None) -> None:
        with self._lock:
            self._batches.append(batch)
            self.num_rows += batch.num_rows
            self.nbytes += batch.nbytes if nbytes is None else nbytes
            self.last_seq = seq

    @property
    def num_batches(self) -> int:
        return len(self._batches)

    def batches(self) -> list[pa.RecordBatch]:
        """A consistent copy of the batch list (safe to read while writers append)."""
        with self._lock:
            return list(self._batches)

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches(), schema=self.schema)

    def __len__(self) -> int:
        return self.num_rows
