"""The search nodes on tiny hand-built inputs: KNN leaves, FilterStaleExec, TopKExec."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.knn import GenerationsKnnExec, KnnQuery, KnnSource, MemTableKnnExec
from exec_nodes.lookup import CoalesceFirstExec, TakeLastExec
from exec_nodes.stale import FilterStaleExec, TopKExec
from memwal_sql.formats.generation import write_generation
from memwal_sql.formats.source_rows import BASE_GENERATION, GEN, TOMBSTONE, conform, source_schema
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.vectors import (
    DISTANCE,
    distances,
    neighbours,
    rough_distances,
    smallest,
    squared_norms,
)
from tests.exec_nodes.test_nodes import CACHES, check_contract

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
    take = TakeLastExec("r1", 5, SOURCE, ["id"], batches=batches, origin="memtable", caches=CACHES)
    return lambda keys: [CoalesceFirstExec([take], ["id"], SOURCE, keys=keys)]


def test_knn_leaf_is_exact_and_skips_tombstones():
    mem = MemTableKnnExec(
        "r1",
        5,
        [rows([1, 2, 3], [3.0, 1.0, 2.0], [False, True, False]).to_batches()[0]],
        SOURCE,
        knn_query(k=5),
        caches=CACHES,
    )
    out = check_contract(mem, 2)
    assert out.column("id").to_pylist() == [3, 1]
    assert mem.rows(out).column("id").to_pylist() == [3, 1]
    assert out.column(DISTANCE).to_pylist() == [4.0, 9.0]
    assert distances(
        np.array([[1.0, 0.0]], np.float32), np.array([0.0, 1.0], np.float32), "cosine"
    ).tolist() == [1.0]


def test_generations_are_searched_as_one_matrix_without_superseded_rows(tmp_path):
    store = ObjectStore(str(tmp_path / "table"))
    generations = []
    for gen, table in (
        (1, rows([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])),
        # Key 1 moved far away, key 2 deleted, key 5 written twice in one flush.
        (2, rows([1, 2, 5, 5], [10.0, 0.0, 0.5, 6.0], [False, True, False, False])),
    ):
        written = conform(table, WAL)
        entry = write_generation(
            store,
            "r",
            gen,
            written,
            ["id"],
            data_storage_version="stable",
            in_memory_bytes=written.nbytes,
        )
        generations.append((gen, store.uri_for(f"_mem_wal/r/{entry.path}")))
    older = GenerationsKnnExec("r", generations[:1], SOURCE, knn_query(k=4), caches=CACHES)
    assert older.top(4).column("id").to_pylist() == [1, 2, 3, 4]
    node = GenerationsKnnExec("r", generations[::-1], SOURCE, knn_query(k=4), caches=CACHES)
    out = check_contract(node, 4)
    # The run's matrix was replaced when the run grew, not kept beside it.
    assert [k for k in CACHES.search.entries() if k[0] == "vectors" and "/r/" in k[1]] == [
        ("vectors", generations[0][1] + "#vec")
    ]
    # Not 1 at distance 1 (gen 2 supersedes it), not 2 (deleted), not 5 at 0.25 (its own
    # flush wrote it again): what is left, nearest first, from both generations.
    assert out.column("id").to_pylist() == [3, 4, 5, 1]
    assert out.column(GEN).to_pylist() == [1, 1, 2, 2]
    assert out.column(DISTANCE).to_pylist() == [9.0, 16.0, 36.0, 100.0]
    full = node.rows(out.take([3, 0, 2]))
    assert full.column("id").to_pylist() == [1, 3, 5]
    assert [v[0] for v in full.column("vec").to_pylist()] == [10.0, 3.0, 6.0]
    assert "2 generations" in node.explain()


def test_filter_stale_keeps_latest_versions_only_and_asks_for_more():
    # Base: keys 1..6 at distance 1..6. MemTable (newer): key 1 moved far away (distance 100),
    # key 2 deleted, key 7 written twice (the second version is the newer).
    base = FixedBase(rows([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]))
    batch = rows([1, 2, 7, 7], [10.0, 0.0, 0.5, 2.5], [False, True, False, False]).to_batches()[0]
    mem = MemTableKnnExec("r1", 5, [batch], SOURCE, knn_query(k=2), caches=CACHES)
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


def test_exact_knn_picks_by_rough_distances_and_reports_lances_exact_ones():
    # Candidates come from the norm-based form (one matrix-vector product); the rows returned
    # and their distances are those of the exact form, even where the rough one rounds two
    # near-equal rows the wrong way round.
    rng = np.random.default_rng(3)
    matrix = (rng.normal(size=(5000, 16)) * 100).astype(np.float32)
    query = matrix[17] + np.float32(1e-3)  # far from the origin: the rough form rounds
    for metric in ("l2", "cosine", "dot"):
        exact = distances(matrix, query, metric)
        rough = rough_distances(matrix, squared_norms(matrix), query, metric)
        assert np.allclose(rough, exact, rtol=1e-4, atol=1e-2 * float(np.abs(exact).mean()))
    wal = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("vec", pa.list_(pa.float32(), 16)),
            pa.field(TOMBSTONE, pa.bool_()),
        ]
    )
    vecs = pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), 16)
    ids = pa.array(np.arange(len(matrix)))
    batch = pa.record_batch([ids, vecs, pa.array([False] * len(matrix))], schema=wal)
    schema = source_schema(wal)
    for metric in ("l2", "cosine"):
        exact = distances(matrix, query, metric)
        search = KnnQuery("vec", query, metric, None, 10, ("id",))
        top = MemTableKnnExec("r", 1, [batch], schema, search, caches=CACHES).top(10)
        want = np.lexsort((np.arange(len(exact)), exact))[:10]
        assert top.column("id").to_pylist() == want.tolist()
        assert np.array_equal(top.column(DISTANCE).to_numpy(), exact[want])


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(-4, 4, width=32), st.just(float("inf"))), min_size=1, max_size=3000
    ),
    m=st.integers(1, 40),
)
def test_smallest_finds_the_m_smallest_values(values, m):
    # Long inputs take the sampled threshold (and its fallback when too few lie below it).
    v = np.array(values, np.float32)
    got = smallest(v, m)
    assert len(np.unique(got)) == len(got) == min(m, len(v))
    assert np.array_equal(np.sort(v[got]), np.sort(v)[: min(m, len(v))])
