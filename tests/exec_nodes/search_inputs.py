"""Hand-built inputs of the search-node tests: two-dimensional vectors keyed by ``id``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from exec_nodes.knn import KnnQuery, KnnSource
from exec_nodes.lookup import CoalesceFirstExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Lookup
from memwal_sql.formats.source_rows import BASE_GENERATION, TOMBSTONE, conform, source_schema
from memwal_sql.structures.vectors import (
    neighbours,
)
from tests.exec_nodes.nodes import CACHES

WAL = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("vec", pa.list_(pa.float32(), 2)),
        pa.field(TOMBSTONE, pa.bool_()),
    ]
)


SOURCE = source_schema(WAL)


Q = np.zeros(2, np.float32)


def rows(ids, xs, dead=None):
    vecs = pa.FixedSizeListArray.from_arrays(
        pa.array([v for x in xs for v in (x, 0.0)], pa.float32()), 2
    )
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "vec": vecs, TOMBSTONE: dead or [False] * len(ids)},
        schema=WAL,
    )


def knn_query(k: int) -> KnnQuery:
    return KnnQuery("vec", Q, "l2", None, k, ("id",))


class FixedBase(KnnSource):
    """A base table as a list of rows (a stand-in for Lance's ANN): exact, counted."""

    name = "FixedBase"

    def __init__(self, table: pa.Table) -> None:
        super().__init__(None, BASE_GENERATION, SOURCE, knn_query(k=2))
        self.table = table
        self.asked: list[int] = []

    def _nearest(self, n: int) -> pa.Table:
        self.asked.append(n)
        table = self._rows()
        return self._exact(table, *neighbours(table, "vec"), n)

    def _rows(self) -> pa.Table:
        return conform(self.table, SOURCE, BASE_GENERATION)

    def rows(self, candidates):
        return self._rows().take(candidates.column("_rowaddr"))


def memtable_lookup(batches):
    take = MemTableSourceExec("r1", 5, batches, SOURCE, Lookup(("id",)), caches=CACHES)
    return lambda keys: [CoalesceFirstExec([take], ["id"], SOURCE, keys=keys)]
