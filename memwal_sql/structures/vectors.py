"""Vectors as numpy matrices: brute-force distances and the nearest rows, batch at a time.

The MemTable's in-memory vector index and the KNN operators share these, so a MemTable row and
a generation row are ranked by the same arithmetic.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_sql.formats.wal import TOMBSTONE

DISTANCE = "_distance"
METRICS = ("l2", "cosine", "dot")

#: A source's rows with their vectors as a matrix, which rows may be neighbours, and each
#: vector's squared norm: what :func:`neighbours` makes and the caches keep.
SourceVectors = tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]


def with_distance(schema: pa.Schema) -> pa.Schema:
    """``schema`` plus ``_distance`` (float32, as Lance returns it)."""
    return schema.append(pa.field(DISTANCE, pa.float32()))


def vectors_of(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-size-list column as an ``(n, dim)`` float32 matrix and a mask of its non-null
    rows (a null vector, e.g. a tombstone's, is never a neighbour)."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n, dim = len(col), col.type.list_size
    valid = (
        np.ones(n, dtype=bool)
        if col.null_count == 0
        else col.is_valid().to_numpy(zero_copy_only=False)
    )
    flat = col.flatten() if col.offset or col.null_count else col.values
    values = flat.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if col.null_count:  # flatten() skips null slots: put the rows back in place
        matrix = np.zeros((n, dim), dtype=np.float32)
        matrix[valid] = values.reshape(-1, dim)
        return matrix, valid
    return values.reshape(n, dim), valid


def neighbours(rows: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vectors of ``rows`` as a matrix, which rows may be neighbours (a vector that is not
    null, on a row that is not a tombstone), and each vector's squared norm (see
    :func:`rough_distances`)."""
    matrix, live = vectors_of(rows.column(column))
    if TOMBSTONE in rows.column_names and rows.num_rows:
        live &= ~rows.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
    return matrix, live, squared_norms(matrix)


def squared_norms(matrix: np.ndarray) -> np.ndarray:
    """Each row's squared L2 norm (float32)."""
    return np.einsum("ij,ij->i", matrix, matrix).astype(np.float32, copy=False)


def rough_distances(
    matrix: np.ndarray, sq_norms: np.ndarray, query: np.ndarray, metric: str
) -> np.ndarray:
    """:func:`distances` up to float32 rounding, from the rows' squared norms: one
    matrix-vector product instead of a difference per row and dimension. Good for choosing
    candidates, which :func:`distances` then ranks (``benchmarks/bench_search.py`` measures
    the searches built on it, docs/performance.md).

    Example:
        >>> m = np.array([[3.0, 4.0]], np.float32)
        >>> rough_distances(m, squared_norms(m), np.zeros(2, np.float32), "l2").tolist()
        [25.0]
    """
    if metric == "l2":
        return sq_norms - 2 * (matrix @ query) + np.float32(query @ query)
    if metric == "cosine":
        norms = np.sqrt(sq_norms) * np.linalg.norm(query)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (1.0 - (matrix @ query) / norms).astype(np.float32)
    return distances(matrix, query, metric)


def smallest(values: np.ndarray, m: int) -> np.ndarray:
    """Positions of the ``m`` smallest ``values``, in no order (a tie at the cut broken
    either way). On many values, only those at or below a strided sample's minimum are
    partitioned, a small fraction of a generation set, instead of moving every value.

    Example:
        >>> sorted(smallest(np.array([5.0, 1.0, 4.0, 2.0]), 2).tolist())
        [1, 3]
    """
    n = len(values)
    if m >= n:
        return np.arange(n)
    if n >= 64 * m:
        # Each of the ~16m sampled values stands for n / 16m values, so about that many
        # (at least 4) lie at or below the sample's minimum; if fewer than m do, partition all.
        below = np.flatnonzero(values <= values[:: n // (16 * m)].min())
        if len(below) >= m:
            return below[np.argpartition(values[below], m - 1)[:m]]
    return np.argpartition(values, m - 1)[:m]


def distances(matrix: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distance of every row of ``matrix`` to ``query`` (float32).

    Example:
        >>> distances(np.array([[3.0, 4.0]], np.float32), np.zeros(2, np.float32), "l2").tolist()
        [25.0]
    """
    if metric == "l2":
        diff = matrix - query
        return np.einsum("ij,ij->i", diff, diff).astype(np.float32)
    if metric == "dot":
        return (1.0 - matrix @ query).astype(np.float32)
    if metric == "cosine":
        norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(query)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (1.0 - (matrix @ query) / norms).astype(np.float32)
    raise ValueError(f"unknown metric {metric!r}")


class OneBlasThread:
    """A context in which numpy's BLAS runs one thread, process-wide, while any search runs.

    OpenBLAS spreads a matrix-vector product of a generation-sized matrix over every core,
    and its threads spin while they wait. Beside Lance's own threads (the base table's ANN
    runs concurrently) that oversubscribed the cores and slowed a search over many generations
    on 2 cores (``benchmarks/bench_search.py --upserts 320000 --memtable-rows 4000``,
    docs/performance.md). Entries are counted, so concurrent searches set it once and the last
    one out restores it.

    Example:
        >>> with ONE_BLAS_THREAD:
        ...     _ = np.ones((4, 2), np.float32) @ np.ones(2, np.float32)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._controller: Any = None
        self._restore: Any = None

    def __enter__(self) -> None:
        with self._lock:
            self._active += 1
            if self._active == 1:
                if self._controller is None:
                    from threadpoolctl import ThreadpoolController

                    self._controller = ThreadpoolController()
                self._restore = self._controller.limit(limits=1, user_api="blas")

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._restore is not None:
                self._restore.restore_original_limits()
                self._restore = None


ONE_BLAS_THREAD = OneBlasThread()
