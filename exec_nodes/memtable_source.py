"""The MemTable leaf: a live MemTable's (or a WAL tail's) rows, as the snapshot captured them,
read by any access method through the MemTable's in-memory indexes.

The indexes (rows in the source schema, key index, vector matrix, terms) are kept in the
table's caches per MemTable and extended as it grows, never rebuilt per query; row ``i`` of
the MemTable has ``_rowaddr`` ``i``, as its key index has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from exec_nodes.source import Access, FullText, Knn, Lookup, PieceKeys, Probe, SourceLeaf
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.visitors import matches
from memwal_sql.formats.source_rows import ROWADDR, TOMBSTONE, conform, empty_rows
from memwal_sql.structures.cache import Caches
from memwal_sql.writer.memtable_indexes import (
    Piece,
    TextIndex,
    VectorIndex,
    keys_index,
    rows_index,
    text_index,
    vector_index,
)


class MemTableSourceExec(SourceLeaf):
    """Batches of a live MemTable (or of a WAL tail: ``origin``) read by ``access``.

    Example:
        >>> from exec_nodes.source import Scan
        >>> from memwal_sql.formats.source_rows import TOMBSTONE, source_schema
        >>> wal = pa.schema([("id", pa.int64()), (TOMBSTONE, pa.bool_())])
        >>> rows = pa.table({"id": [1, 2], TOMBSTONE: [False, False]}, schema=wal)
        >>> node = MemTableSourceExec("r", 3, rows.to_batches(), source_schema(wal), Scan(),
        ...                           caches=Caches())
        >>> node.to_table()["_gen"].to_pylist()
        [3, 3]
    """

    name = "MemTableSourceExec"
    _computed = ("_top", "_pieces", "_text_rows")

    def __init__(
        self,
        region_id: str,
        generation: int,
        batches: Sequence[pa.RecordBatch],
        schema: pa.Schema,
        access: Access,
        origin: str = "memtable",
        *,
        caches: Caches,
        keys: pa.Table | None = None,
    ) -> None:
        super().__init__(region_id, generation, schema, access, caches=caches, keys=keys)
        self.batches = list(batches)
        self.origin = origin
        self._text_rows: pa.Table | None = None

    def _where(self) -> str:
        rows = sum(b.num_rows for b in self.batches)
        return (
            f"region={(self.region_id or '')[:8]} gen={self.generation} {self.origin} rows={rows}"
        )

    def _how(self) -> str:
        if isinstance(self.access, Lookup):
            return f"{self.access} via key index"
        return f"{self.access} exact" if isinstance(self.access, Knn) else str(self.access)

    def read(self, schema: pa.Schema, predicate: Predicate | None) -> pa.Table:
        if not self.batches:
            return empty_rows(schema)
        rows = rows_index(
            self.batches, self.generation, self.origin, self.source_schema, caches=self.caches
        ).update(self.batches)
        return matches(predicate, rows).select(schema.names)

    def _probe(self, keys: pa.Table) -> Probe:
        if not self.batches:
            return Probe(empty_rows(self.schema), np.zeros(keys.num_rows, dtype=bool))
        index = keys_index(
            self.batches,
            self.generation,
            self.origin,
            self.source_schema,
            self.primary_key,
            caches=self.caches,
        )
        at = index.find(keys.select(self.primary_key))
        hit = at >= 0
        if not hit.any():
            return Probe(empty_rows(self.schema), hit)
        return Probe(index.take(at[hit]), hit)

    def _nearest(self, n: int) -> pa.Table:
        if not self.batches:
            return empty_rows(self.schema)
        return self._exact(*self._vectors().update(self.batches), n)

    def _vectors(self) -> VectorIndex:
        return vector_index(
            self.batches,
            self.generation,
            self.origin,
            self.column,
            self.source_schema,
            caches=self.caches,
        )

    def rows(self, candidates: pa.Table) -> pa.Table:
        return self._vectors().update(self.batches)[0].take(candidates.column(ROWADDR))

    def _text_pieces(self) -> list[Piece]:
        if not self.batches:
            return []
        self._text_rows, piece = self._text_index().update(self.batches, self.primary_key)
        return [piece]

    def _text_index(self) -> TextIndex:
        access = self._needs(FullText)
        return text_index(
            self.batches,
            self.generation,
            self.origin,
            access.column,
            self.source_schema,
            access.tokenizer,
            caches=self.caches,
        )

    def text_keys(self) -> list[PieceKeys]:
        """The MemTable's keys: its piece's when it is made already (the same objects: what a
        search derived from them is found again), else read from its batches, row ``i`` at
        address ``i`` as its piece has them."""
        if not self.batches:
            return []
        held = self._text_index().current(self.batches)
        if held is not None:
            return [PieceKeys.of(held)]
        rows = pa.Table.from_batches(self.batches, schema=self.batches[0].schema)
        fields = pa.schema([self.source_schema.field(n) for n in self.primary_key])
        present = np.ones(rows.num_rows, dtype=bool)
        if TOMBSTONE in rows.column_names:
            present &= ~rows.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
        keys = conform(rows.select(self.primary_key), fields)
        return [PieceKeys(keys, np.arange(rows.num_rows, dtype=np.int64), present)]

    def piece_rows(self, piece: int, index: np.ndarray) -> pa.Table:
        self.pieces()
        assert self._text_rows is not None
        return self._text_rows.take(pa.array(index))


__all__ = ["MemTableSourceExec"]
