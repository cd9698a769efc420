"""In-memory indexes of a MemTable (spec, "MemTable indexing"), extended as it grows.

A MemTable only ever gains batches, so its search structures are extended with the new batches
rather than rebuilt: a vector index (the rows' vectors as one matrix, searched exactly, which
at MemTable size is as fast as an approximate index and never wrong) and an inverted index (the
terms of the new documents, tokenized as the base index says, joining one vocabulary). Searches
bring them up to the batches their snapshot captured; a writer with ``indexed_writes`` brings
them up to date before it acknowledges a write, so the write is searchable through its
indexes at once (the spec's indexed write).

They live in the table's caches (``caches.memtable``, see
:class:`~memwal_sql.structures.cache.Caches`), keyed by the MemTable (its first batch) and column.

Example:
    ``text_index(batches, 3, "memtable", "body", schema, tok, caches=tbl.caches).update(batches, pk)``
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from memwal_sql.formats.source_rows import ROWADDR, TOMBSTONE, conform, empty_rows
from memwal_sql.formats.tokenizer import DocumentTerms, GrowingTokens, Tokenizer
from memwal_sql.structures.cache import CachePart, Caches
from memwal_sql.structures.keyset import KeySet
from memwal_sql.writer.memtable import on_flushed

if TYPE_CHECKING:  # knn imports this module
    from memwal_sql.structures.vectors import SourceVectors


@dataclass
class Piece:
    """Rows of one source (or one base fragment) as a full-text search sees them: their keys,
    row addresses, terms, and which rows may count (not deleted, not tombstones)."""

    keys: pa.Table
    addresses: np.ndarray  # _rowaddr of each row
    tokens: DocumentTerms
    present: np.ndarray  # rows that exist at the snapshot (base deletions and tombstones out)
    _keys: tuple[KeySet, np.ndarray] | None = None

    def row_of(self, keys: pa.Table) -> np.ndarray:
        """For each of ``keys``, the present row holding it, or -1 (the KeySet of the present
        rows is built once per piece: a piece's rows never change)."""
        if self._keys is None:
            rows = np.nonzero(self.present)[0]
            self._keys = (KeySet(self.keys.take(pa.array(rows))), rows)
        keyset, rows = self._keys
        pos = keyset.positions(keys)
        return np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)


_SMALL_CHUNK_ROWS = 65_536


def _fewer_chunks(table: pa.Table) -> pa.Table:
    """``table`` in one chunk if its chunks are small on average: a take from thousands of
    chunks (a WAL tail of single-row entries, read at once) costs per chunk, on every lookup.
    Large chunks (a large write's) stay as they are: joining them would copy the MemTable.

    Example:
        >>> t = pa.Table.from_batches([pa.record_batch({"a": [1]})] * 3)
        >>> _fewer_chunks(t).column("a").num_chunks
        1
    """
    chunks = table.column(0).num_chunks if table.num_columns else 0
    if chunks > 1 and table.num_rows < _SMALL_CHUNK_ROWS * chunks:
        return table.combine_chunks()
    return table


class _Growing:
    """Rows of a MemTable in the source schema, extended batch by batch."""

    def __init__(self, schema: pa.Schema, generation: int) -> None:
        self.schema = schema
        self.generation = generation
        self.lock = threading.Lock()
        self._batches: list[pa.RecordBatch] = []
        self._parts: list[pa.Table] = []
        self._rows: pa.Table | None = None
        self.num_rows = 0
        self.grown = False

    def _new_rows(self, batches: Sequence[pa.RecordBatch]) -> pa.Table | None:
        """The rows of the batches not seen yet (None when nothing is new); starts over
        when ``batches`` is not an extension of what was seen."""
        n = len(self._batches)
        if n > len(batches) or (n and batches[n - 1] is not self._batches[n - 1]):
            self._reset()
            n = 0
        new = list(batches[n:])
        if not new:
            return None
        table = _fewer_chunks(pa.Table.from_batches(new, schema=new[0].schema))
        offsets = np.arange(self.num_rows, self.num_rows + table.num_rows, dtype=np.uint64)
        # The row numbers go in before conform, which then makes no second column of them.
        table = conform(
            table.drop_columns([c for c in (ROWADDR,) if c in table.column_names]).append_column(
                self.schema.field(ROWADDR), pa.array(offsets)
            ),
            self.schema,
            self.generation,
        )
        self._batches.extend(new)
        self._parts.append(table)
        self._rows = None
        self.num_rows += table.num_rows
        self.grown = True  # its size is counted again at the next access (_cached)
        return table

    @property
    def nbytes(self) -> int:
        """The memory the index holds beyond the MemTable's own batches: the ``_gen`` and
        ``_rowaddr`` columns it adds and its rows joined into one table (what a cache counts)."""
        return 16 * self.num_rows + (0 if self._rows is None else self._rows.nbytes)

    def holds(self, batches: Sequence[pa.RecordBatch]) -> bool:
        """Whether these are (a prefix or an extension of) the batches seen so far."""
        n = min(len(self._batches), len(batches))
        return n == 0 or batches[0] is self._batches[0]

    def rows(self) -> pa.Table:
        if self._rows is None:
            self._rows = (
                _fewer_chunks(pa.concat_tables(self._parts))
                if self._parts
                else empty_rows(self.schema)
            )
        return self._rows

    def _reset(self) -> None:
        self._batches, self._parts, self._rows, self.num_rows = [], [], None, 0


class RowsIndex(_Growing):
    """A MemTable's rows in the source schema (what a scan reads of it), extended as it
    grows."""

    def update(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        with self.lock:
            self._new_rows(batches)
            return self.rows()


class VectorIndex(_Growing):
    """A MemTable's vectors as one matrix, and which rows may be neighbours. The matrix grows
    by doubling its capacity, so extending it by a batch costs that batch, not a copy of the
    whole MemTable (an indexed write extends it on every write)."""

    def __init__(self, schema: pa.Schema, generation: int, column: str) -> None:
        super().__init__(schema, generation)
        self.column = column
        self._reset_vectors()

    def _reset(self) -> None:
        super()._reset()
        self._reset_vectors()

    def _reset_vectors(self) -> None:
        self._matrix: np.ndarray | None = None
        self._live = np.zeros(0, dtype=bool)
        self._sq_norms = np.zeros(0, dtype=np.float32)
        self._count = 0

    @property
    def nbytes(self) -> int:
        """See :attr:`_Growing.nbytes`; with the matrix, norms and live flags (capacity)."""
        held = [self._matrix, self._live, self._sq_norms]
        return super().nbytes + sum(a.nbytes for a in held if a is not None)

    def update(self, batches: Sequence[pa.RecordBatch]) -> SourceVectors:
        """(rows, vectors, live, squared norms) of ``batches``, extended with what is new."""
        from memwal_sql.structures.vectors import neighbours

        with self.lock:
            new = self._new_rows(batches)
            if new is not None:
                self._append(*neighbours(new, self.column))
            n = self._count
            if self._matrix is None:
                empty = np.zeros(0, dtype=np.float32)
                return self.rows(), np.zeros((0, 0), np.float32), np.zeros(0, dtype=bool), empty
            return self.rows(), self._matrix[:n], self._live[:n], self._sq_norms[:n]

    def _append(self, matrix: np.ndarray, live: np.ndarray, sq_norms: np.ndarray) -> None:
        n, m = self._count, len(matrix)
        if self._matrix is None or n + m > len(self._matrix):
            capacity = max(2 * (n + m), 1024)
            grown = np.empty((capacity, matrix.shape[1]), dtype=np.float32)
            grown_live = np.zeros(capacity, dtype=bool)
            grown_norms = np.zeros(capacity, dtype=np.float32)
            if self._matrix is not None:
                grown[:n], grown_live[:n] = self._matrix[:n], self._live[:n]
                grown_norms[:n] = self._sq_norms[:n]
            self._matrix, self._live, self._sq_norms = grown, grown_live, grown_norms
        self._matrix[n : n + m] = matrix
        self._live[n : n + m] = live
        self._sq_norms[n : n + m] = sq_norms
        self._count = n + m


class TextIndex(_Growing):
    """A MemTable's documents and their terms (see :class:`GrowingTokens`)."""

    def __init__(
        self, schema: pa.Schema, generation: int, column: str, tokenizer: Tokenizer
    ) -> None:
        super().__init__(schema, generation)
        self.column = column
        self.tokenizer = tokenizer
        self._terms = GrowingTokens(tokenizer)
        self._piece: Piece | None = None

    def _reset(self) -> None:
        super()._reset()
        self._terms = GrowingTokens(self.tokenizer)

    @property
    def nbytes(self) -> int:
        """See :attr:`_Growing.nbytes`; with the terms and the piece's keys and flags."""
        piece = self._piece
        held = 0 if piece is None else piece.keys.nbytes + 9 * len(piece.present)
        return super().nbytes + self._terms.nbytes + held

    def current(self, batches: Sequence[pa.RecordBatch]) -> Piece | None:
        """The piece of exactly ``batches`` if :meth:`update` made it already (nothing to
        tokenize), else None."""
        with self.lock:
            n = len(self._batches)
            if (
                self._piece is None
                or n != len(batches)
                or (n and batches[-1] is not self._batches[-1])
            ):
                return None
            return self._piece

    def update(
        self, batches: Sequence[pa.RecordBatch], primary_key: Sequence[str]
    ) -> tuple[pa.Table, Piece]:
        """(rows, :class:`Piece`) of ``batches``, extended with what is new; the same piece
        object while nothing is (a search keeps what it derived from it)."""
        with self.lock:
            new = self._new_rows(batches)
            if new is not None:
                self._terms.extend(new.column(self.column))
                self._piece = None
            rows = self.rows()
            if self._piece is None:
                present = (
                    ~rows.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
                    if TOMBSTONE in rows.column_names
                    else np.ones(rows.num_rows, dtype=bool)
                )
                self._piece = Piece(
                    rows.select(list(primary_key)),
                    rows.column(ROWADDR).to_numpy().astype(np.int64),
                    self._terms.tokens(),
                    present,
                )
            return rows, self._piece


class KeysIndex(_Growing):
    """A MemTable's newest row per key, extended as it grows (what a point lookup probes).

    Each update indexes only the new rows, as a run; a run as big as the one before it is
    merged with it (a binary counter: at most log2(rows) runs), so a lookup after a write
    costs an index of that write's rows, not of the whole MemTable. Runs are probed newest
    first. :meth:`update` returns a :class:`KeysView` of exactly the batches it was given:
    a query probes the MemTable as its snapshot saw it while other queries extend the index.

    Example:
        >>> s = pa.schema([("id", pa.int64()), ("v", pa.string()), (TOMBSTONE, pa.bool_()),
        ...                ("_gen", pa.int64()), (ROWADDR, pa.uint64())])
        >>> b = [pa.record_batch({"id": [1, 2], "v": ["a", "b"], TOMBSTONE: [False] * 2})]
        >>> ix = KeysIndex(s, 3, ["id"]).update(b)
        >>> ix.find(pa.table({"id": [2, 5]})).tolist()
        [1, -1]
    """

    def __init__(self, schema: pa.Schema, generation: int, primary_key: Sequence[str]) -> None:
        super().__init__(schema, generation)
        self.primary_key = list(primary_key)
        self._starts: list[int] = []  # first row of each part
        self._runs: list[tuple[int, int, KeySet, np.ndarray]] = []  # first part, rows, index
        self._view: KeysView | None = None  # as of the last update that brought rows

    def update(self, batches: Sequence[pa.RecordBatch]) -> KeysView:
        with self.lock:
            seen = len(self._batches)
            if 0 < len(batches) < seen and batches[-1] is self._batches[len(batches) - 1]:
                # An older snapshot of the MemTable than the index has seen (a query that
                # started before a write, run after a newer one): indexed apart, so the newer
                # queries keep the shared index as they need it.
                return KeysIndex(self.schema, self.generation, self.primary_key).update(batches)
            new = self._new_rows(batches)
            if new is not None:
                self._starts.append(self.num_rows - new.num_rows)
                self._view = None
            if new is not None and new.num_rows:
                self._runs.append(self._run(len(self._parts) - 1))
                while len(self._runs) > 1 and self._runs[-1][1] >= self._runs[-2][1]:
                    self._runs[-2:] = [self._run(self._runs[-2][0])]
            if self._view is None:  # one view per state: a lookup per key must not copy
                self._view = KeysView(tuple(self._runs), tuple(self._parts), tuple(self._starts))
            return self._view

    @property
    def nbytes(self) -> int:
        """See :attr:`_Growing.nbytes`; with each run's key set and row numbers."""
        return super().nbytes + sum(ks.nbytes + rows.nbytes for _, _, ks, rows in self._runs)

    def _run(self, first_part: int) -> tuple[int, int, KeySet, np.ndarray]:
        """The run of the rows from part ``first_part`` on."""
        rows = pa.concat_tables(self._parts[first_part:])
        first = self._starts[first_part]
        # Newest row first: a KeySet finds the first occurrence of a repeated key.
        order = np.arange(rows.num_rows - 1, -1, -1)
        keys = rows.select(self.primary_key).take(pa.array(order))
        return first_part, rows.num_rows, KeySet(keys), first + order

    def _reset(self) -> None:
        super()._reset()
        self._starts, self._runs, self._view = [], [], None


@dataclass(frozen=True)
class KeysView:
    """A :class:`KeysIndex` as of one update: its runs, and the parts holding the rows."""

    runs: tuple[tuple[int, int, KeySet, np.ndarray], ...]
    parts: tuple[pa.Table, ...]
    starts: tuple[int, ...]

    def find(self, keys: pa.Table) -> np.ndarray:
        """For each row of ``keys``, the MemTable row of its newest version, or -1."""
        out = np.full(keys.num_rows, -1, dtype=np.int64)
        todo = np.arange(keys.num_rows)
        for _, _, keyset, newest in reversed(self.runs):
            asked = keys if len(todo) == keys.num_rows else keys.take(pa.array(todo))
            pos = keyset.positions(asked)
            hit = pos >= 0
            out[todo[hit]] = newest[pos[hit]]
            todo = todo[~hit]
            if len(todo) == 0:
                break
        return out

    def take(self, rows: np.ndarray) -> pa.Table:
        """The MemTable's rows at ``rows`` (as :meth:`find` gives them), in that order, never
        a copy of the whole MemTable: the parts as the chunks of one table (no copy), and one
        take over them (Arrow resolves chunks itself, 5x faster than a take per part over
        200 parts)."""
        part = np.searchsorted(self.starts, rows, side="right") - 1
        if (part == part[0]).all():
            return self.parts[part[0]].take(pa.array(rows - self.starts[part[0]]))
        return pa.concat_tables(self.parts).take(pa.array(rows))


# The caches that hold some MemTable's indexes, weakly (they go with their tables): a flush
# tells this module's listener (memwal_sql.writer.memtable.on_flushed) the batches only.
_HOLDERS: weakref.WeakSet[CachePart] = weakref.WeakSet()
_HOLDERS_LOCK = threading.Lock()  # a flush thread lists them while a query adds one


def _cached(
    kind: str,
    batches: Sequence[pa.RecordBatch],
    origin: str,
    key: str,
    make: Callable[[], _Growing],
    caches: Caches,
) -> Any:
    """The index ``make`` builds for one MemTable, kept in ``caches.memtable`` while the
    MemTable lives: keyed by its first batch (and ``key``), which it holds, so the key is never
    another MemTable's. A WAL tail (``origin="wal"``) keeps its batches from one snapshot to the
    next (:class:`~memwal_sql.formats.wal_tail.WalTail`), so its index is kept the same way."""
    if not batches:
        return make()
    part = caches.memtable

    def load() -> tuple[_Growing, int]:
        with _HOLDERS_LOCK:
            _HOLDERS.add(part)
        index = make()
        return index, index.nbytes

    uri = f"{id(batches[0])}#{key}"
    index = part.get(kind, uri, load, lambda index: index.holds(batches))
    # It grows in place as the MemTable does: count what it holds now (as of its last update;
    # this access's update is counted at the next), when that changed.
    if index.grown:
        index.grown = False
        part.resize(kind, uri, index.nbytes)
    return index


def forget(batches: Sequence[pa.RecordBatch]) -> None:
    """Drop a MemTable's in-memory indexes (it was flushed: its generation serves reads now),
    so they do not hold its rows until the cache evicts them."""
    if batches:
        with _HOLDERS_LOCK:
            parts = list(_HOLDERS)
        for part in parts:
            part.discard(f"{id(batches[0])}#")


on_flushed(forget)


def keys_index(
    batches: Sequence[pa.RecordBatch],
    generation: int,
    origin: str,
    schema: pa.Schema,
    primary_key: Sequence[str],
    *,
    caches: Caches,
) -> KeysView:
    """The MemTable's newest row per key, as of ``batches``."""
    index = _cached(
        "memtable_keys",
        batches,
        origin,
        "",
        lambda: KeysIndex(schema, generation, primary_key),
        caches,
    )
    return index.update(batches)


def rows_index(
    batches: Sequence[pa.RecordBatch],
    generation: int,
    origin: str,
    schema: pa.Schema,
    *,
    caches: Caches,
) -> RowsIndex:
    """The MemTable's rows, kept in the source schema."""
    return _cached(
        "memtable_rows", batches, origin, "", lambda: RowsIndex(schema, generation), caches
    )


def vector_index(
    batches: Sequence[pa.RecordBatch],
    generation: int,
    origin: str,
    column: str,
    schema: pa.Schema,
    *,
    caches: Caches,
) -> VectorIndex:
    """The MemTable's in-memory vector index on ``column``."""
    return _cached(
        "memtable_vectors",
        batches,
        origin,
        column,
        lambda: VectorIndex(schema, generation, column),
        caches,
    )


def text_index(
    batches: Sequence[pa.RecordBatch],
    generation: int,
    origin: str,
    column: str,
    schema: pa.Schema,
    tokenizer: Tokenizer,
    *,
    caches: Caches,
) -> TextIndex:
    """The MemTable's in-memory inverted index on ``column`` for ``tokenizer``."""
    return _cached(
        "memtable_text",
        batches,
        origin,
        f"{column}#{tokenizer.signature}",
        lambda: TextIndex(schema, generation, column, tokenizer),
        caches,
    )


__all__ = [
    "KeysIndex",
    "KeysView",
    "Piece",
    "RowsIndex",
    "TextIndex",
    "VectorIndex",
    "forget",
    "keys_index",
    "rows_index",
    "text_index",
    "vector_index",
]


def tokenizer_for(params: dict, caches: Caches) -> Tokenizer:
    """One tokenizer per parameter set in ``caches.search``: it keeps what it learnt (each
    distinct token's final term, recent queries' terms)."""
    key = json.dumps(params, sort_keys=True, default=str)
    tokenizer = caches.search.get("tokenizer", key, lambda: (Tokenizer(params), 1 << 16))
    caches.search.resize("tokenizer", key, tokenizer.nbytes)  # what it learnt so far
    return tokenizer
