"""FilterStaleExec and TopKExec alone: latest versions only, then the global ranking."""

from __future__ import annotations

import pyarrow as pa

from exec_nodes.base import ExecNode
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Knn
from exec_nodes.stale import FilterStaleExec
from exec_nodes.topk import TopKExec
from memwal_sql.structures.vectors import (
    DISTANCE,
)
from tests.exec_nodes.nodes import CACHES, check_contract
from tests.exec_nodes.search_inputs import (
    SOURCE,
    FixedBase,
    knn_query,
    memtable_lookup,
    rows,
)


def test_filter_stale_keeps_latest_versions_only_and_asks_for_more():
    # Base: keys 1..6 at distance 1..6. MemTable (newer): key 1 moved far away (distance 100),
    # key 2 deleted, key 7 written twice (the second version is the newer).
    base = FixedBase(rows([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]))
    batch = rows([1, 2, 7, 7], [10.0, 0.0, 0.5, 2.5], [False, True, False, False]).to_batches()[0]
    mem = MemTableSourceExec("r1", 5, [batch], SOURCE, Knn(knn_query(k=2)), caches=CACHES)
    stale = FilterStaleExec([base, mem], ["id"], memtable_lookup([batch]), 2, score=DISTANCE)
    top = TopKExec(stale, 2, DISTANCE, columns=["id", DISTANCE])
    out = check_contract(top, 2)
    # Not 1 (stale), not 2 (deleted), not 7 at 0.5 (superseded in the same MemTable).
    assert out.column("id").to_pylist() == [7, 3]
    assert out.column(DISTANCE).to_pylist() == [6.25, 9.0]
    # The base is asked for 2k first (its rows are the likeliest to be stale), then more.
    assert stale.rounds >= 2 and base.asked[0] == 4 and mem.fetched() > 2
    assert stale.dropped_deleted >= 1 and stale.dropped_stale >= 2
    assert "dropped" in top.explain()


def test_filter_stale_without_newer_versions_keeps_base_rows():
    base = FixedBase(rows([1, 2, 3], [3, 2, 1]))
    stale = FilterStaleExec([base], ["id"], lambda keys: [], 2, score=DISTANCE)
    out = TopKExec(stale, 2, DISTANCE).to_table()
    assert out.column("id").to_pylist() == [3, 2] and stale.rounds == 1


class Ranked(ExecNode):
    """A child TopKExec ranks: its ``valid()`` rows, keyed by ``id``."""

    name = "Ranked"
    primary_key = ("id",)

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema

    def valid(self) -> pa.Table:
        return self.table

    def execute(self, partition: int = 0):
        yield from self.table.to_batches()


def test_topk_keeps_the_k_best_breaks_ties_by_key_and_selects_its_columns():
    table = pa.table(
        {"id": [5, 3, 9, 1], "x": ["e", "c", "i", "a"], "s": pa.array([0.5, 0.9, 0.9, 0.1])}
    )
    best = TopKExec(Ranked(table), 2, "s", descending=True, columns=["id", "s"])
    out = check_contract(best, 2)
    assert out.column_names == ["id", "s"]
    assert out.column("id").to_pylist() == [3, 9]  # tied at 0.9: the smaller key first
    nearest = TopKExec(Ranked(table), 3, "s")
    assert nearest.to_table().column("id").to_pylist() == [1, 5, 3]
    assert "k=3 by s ascending" in nearest.explain()
