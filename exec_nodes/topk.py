"""TopKExec: the global ranking of a search, the ``k`` best latest rows of its child."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.stale import SOURCE, FilterStaleExec
from memwal_sql.formats.source_rows import GEN, ROWADDR


class TopKExec(ExecNode):
    """The ``k`` best rows of its child by ``score`` (ascending, or descending)."""

    name = "TopKExec"

    def __init__(
        self,
        child: FilterStaleExec | Any,
        k: int,
        score: str,
        descending: bool = False,
        columns: Sequence[str] | None = None,
    ) -> None:
        # ``child`` answers ``valid()`` (its latest-version candidates) and ``primary_key``:
        # FilterStaleExec, or GlobalBM25Exec for full-text search.
        self.child = child
        self.k = k
        self.score = score
        self.descending = descending
        self.columns = None if columns is None else list(columns)

    @property
    def schema(self) -> pa.Schema:
        s = self.child.schema
        if isinstance(self.child, FilterStaleExec) and self.child.children:
            s = self.child._children[0].source_schema.append(s.field(self.score))
        names = self.columns or [n for n in s.names if n not in (GEN, ROWADDR, SOURCE)]
        return pa.schema([s.field(n) for n in names])

    @property
    def children(self) -> list[ExecNode]:
        return [self.child]

    def describe(self) -> str:
        order = "descending" if self.descending else "ascending"
        return f"{self.name}: k={self.k} by {self.score} {order}"

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        rows = self.child.valid()
        order = "descending" if self.descending else "ascending"
        # Ties broken by key, so equal scores come back in one order whatever the sources.
        keys = [(self.score, order), *[(k, "ascending") for k in self.child.primary_key]]
        best = rows.take(pc.sort_indices(rows, sort_keys=keys)[: self.k])
        if isinstance(self.child, FilterStaleExec):  # light candidates: read the winners
            best = self.child.rows_of(best)
        yield from best.select(self.schema.names).to_batches()


__all__ = ["TopKExec"]
