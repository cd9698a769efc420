"""The in-memory MemTable of a region writer and last-write-wins deduplication.

A MemTable is an append-only list of WAL-schema record batches of one generation. Appends are
immediately visible to readers in the same process (they copy the batch list). Deduplication is
deferred to the flush (and to readers), where it is one vectorised group-by instead of per-row
Python work on the write path.

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

_log = logging.getLogger(__name__)

_ROW = "__memwal_row"

# What readers keep of a MemTable that a flush makes obsolete (exec_nodes.memindex registers
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


def last_per_key(keys: pa.Table, rank: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Last write wins: the distinct keys of ``keys`` and, for each, the highest ``rank`` of
    its rows (one hash aggregate, no sort).

    Example:
        >>> k, r = last_per_key(pa.table({"id": [5, 7, 5]}), np.array([1, 2, 3]))
        >>> k.column("id").to_pylist(), r.tolist()
        ([5, 7], [3, 2])
    """
    names = keys.column_names
    t = keys.append_column(_ROW, pa.array(np.asarray(rank, dtype=np.int64)))
    best = t.group_by(names, use_threads=False).aggregate([(_ROW, "max")])
    return best.select(names), best.column(f"{_ROW}_max").to_numpy()


def latest_per_key(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Keep the last row of every key, in insertion order (tombstones are kept: they are rows)."""
    n = table.num_rows
    if n <= 1:
        return table
    keys, last = last_per_key(table.select(list(primary_key)), np.arange(n, dtype=np.int64))
    if keys.num_rows == n:
        return table
    return table.take(pa.array(np.sort(last)))


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
