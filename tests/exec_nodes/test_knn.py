"""The KNN leaves alone: exact MemTable and generation searches, runs of generations."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.knn import GenerationRunsKnnExec, GenerationsKnnExec, KnnQuery
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Knn
from memwal_sql.formats.source_rows import GEN, TOMBSTONE, conform, source_schema
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.vectors import (
    DISTANCE,
    distances,
    rough_distances,
    smallest,
    squared_norms,
)
from memwal_sql.writer.flush import write_generation
from tests.exec_nodes.nodes import CACHES, check_contract
from tests.exec_nodes.search_inputs import (
    SOURCE,
    WAL,
    knn_query,
    rows,
)


def test_knn_leaf_is_exact_and_skips_tombstones():
    mem = MemTableSourceExec(
        "r1",
        5,
        [rows([1, 2, 3], [3.0, 1.0, 2.0], [False, True, False]).to_batches()[0]],
        SOURCE,
        Knn(knn_query(k=5)),
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
        top = MemTableSourceExec("r", 1, [batch], schema, Knn(search), caches=CACHES).top(10)
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


def write_generations(tmp_path, count: int, per: int) -> list[tuple[int, str]]:
    """``count`` generations of ``per`` distinct keys each; generation g's row i lies at
    ``x = 3 i + g``, so the nearest rows to the origin alternate between generations."""
    store = ObjectStore(str(tmp_path / "table"))
    out = []
    for g in range(1, count + 1):
        table = conform(
            rows([1000 * g + i for i in range(per)], [3.0 * i + g for i in range(per)]), WAL
        )
        entry = write_generation(
            store, "r", g, table, ["id"], data_storage_version="stable", in_memory_bytes=1
        )
        out.append((g, store.uri_for(f"_mem_wal/r/{entry.path}")))
    return out


def test_generation_runs_decide_at_execution_and_merge_their_runs(tmp_path):
    generations = write_generations(tmp_path, 3, 200)
    want_ids = [1000, 2000, 3000, 1001, 2001]  # x = 1, 2, 3, 4, 5
    saved = CACHES.max_bytes
    try:
        for max_bytes, runs in ((saved, 1), (96 << 10, 3)):
            # 96 KiB: each generation (a 3.4 KB file) is kept, but a run holds 1/8 of the
            # cache, less than two generations' rows and vectors: one run per generation.
            CACHES.max_bytes = max_bytes
            CACHES.clear()
            node = GenerationRunsKnnExec(
                "r", generations[::-1], SOURCE, knn_query(k=5), caches=CACHES
            )
            assert node.children == []  # planning read nothing
            out = check_contract(node, 5)
            assert len(node.children) == runs
            assert out.column("id").to_pylist() == want_ids
            assert out.column(GEN).to_pylist() == [1, 2, 3, 1, 2]
            assert out.column(DISTANCE).to_pylist() == [1.0, 4.0, 9.0, 16.0, 25.0]
            full = node.rows(out.take([4, 2, 0]))
            assert full.column("id").to_pylist() == [2001, 3000, 1000]
            assert [v[0] for v in full.column("vec").to_pylist()] == [5.0, 3.0, 1.0]
    finally:
        CACHES.max_bytes = saved
        CACHES.clear()
