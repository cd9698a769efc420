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

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_ROW = "__memwal_row"


def latest_per_key(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Keep the last row of every key, in insertion order (tombstones are kept: they are rows)."""
    n = table.num_rows
    if n <= 1:
        return table
    keys = table.select(list(primary_key)).append_column(_ROW, pa.array(np.arange(n, dtype=np.int64)))
    last = keys.group_by(list(primary_key), use_threads=False).aggregate([(_ROW, "max")])
    if last.num_rows == n:
        return table
    keep = np.sort(last.column(f"{_ROW}_max").to_numpy())
    return table.take(pa.array(keep))


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

    def batches(self) -> list[pa.RecordBatch]:
        """A consistent copy of the batch list (safe to read while writers append)."""
        with self._lock:
            return list(self._batches)

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches(), schema=self.schema)

    def __len__(self) -> int:
        return self.num_rows
