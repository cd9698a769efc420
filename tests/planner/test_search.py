"""The vector-search plan's indexed read (planner/search.py): generations, the gap's included,
searched through their own vector indexes until their rows are in memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import exec_nodes.generation_source as generation_source
import memwal_sql as mw
import planner.search
from tests.lsm import Model
from tests.test_vector_search import DIM, SCHEMA, brute_force, vec_batch

BASE_KEYS = 2000


@pytest.fixture
def lagging(tmp_path: Any) -> tuple[str, Model]:
    """A table whose IVF_PQ index lags two merges (each of updates, inserts and deletes of
    base rows), with a fresh flushed generation over the gap; and its model."""
    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri,
        vec_batch(list(range(BASE_KEYS)), 0),
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
    )
    tbl.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=4)
    model = Model(["k"])
    model.upsert(vec_batch(list(range(BASE_KEYS)), 0))
    for seed, (keys, gone) in enumerate(
        [(list(range(0, 900, 3)), [1, 4, 7]), ([*range(0, 900, 5), 3000, 3001], [2, 3, 8])], 1
    ):
        rows = vec_batch(keys, seed)
        tbl.upsert(rows), model.upsert(rows)
        tbl.delete(gone), model.delete(pa.table({"k": gone}))
        tbl.flush()
        tbl.merge()
    fresh = vec_batch([6, 9, 12, 3002], 9)  # updates of gap rows too
    tbl.upsert(fresh), model.upsert(fresh)
    tbl.flush()
    tbl.close()
    return uri, model


def _latest_rows(model: Model) -> dict[int, dict]:
    return {r["k"]: r for r in model.table(SCHEMA).to_pylist()}


def test_gap_generations_are_searched_through_their_own_indexes(lagging, monkeypatch) -> None:
    uri, _ = lagging
    monkeypatch.setattr(planner.search, "INDEXED_GENERATION_ROWS", 0)  # these are small
    searched: list[dict] = []
    nearest = generation_source.lance_nearest

    def spy(ds, node, n, options, generation, indexed_rows=None):
        searched.append({"generation": generation, **options})
        return nearest(ds, node, n, options, generation, indexed_rows)

    monkeypatch.setattr(generation_source, "lance_nearest", spy)
    tbl = mw.open_table(uri, cache=64 << 20)
    query = np.random.default_rng(3).normal(size=DIM).astype(np.float32)
    text = tbl.explain_search(query, k=10)
    plan = tbl._search.last_plan
    assert plan.indexed is not None, text  # the base index lags the merges
    gap = sum(len(g) for g in plan.indexed.gap.values())
    assert gap == 4  # two merges, two regions
    fresh = sum(len(r.generations) for r in plan.snapshot.regions)
    assert fresh == 2  # the unmerged flush, in both regions
    assert "indexed read: vec_idx behind the merges" in text
    # Every generation (the gap's and the fresh ones) through its own index, none exactly.
    assert text.count("via its index vec_idx") == gap + fresh, text
    assert "GenerationsKnnExec" not in text and " flat" not in text, text
    assert {s["generation"] for s in searched} == {1, 2, 3}
    assert len(searched) >= gap + fresh
    assert all("use_index" not in s and s["nprobes"] == 4 for s in searched), searched
    tbl.close()


def test_indexed_search_keeps_recall_and_returns_no_stale_row(lagging, monkeypatch) -> None:
    uri, model = lagging
    monkeypatch.setattr(planner.search, "INDEXED_GENERATION_ROWS", 0)
    latest = _latest_rows(model)
    found = 0
    queries = 20
    for seed in range(queries):
        # A fresh cache each time: every generation not in memory, searched through its index.
        tbl = mw.open_table(uri, cache=64 << 20)
        query = np.random.default_rng(100 + seed).normal(size=DIM).astype(np.float32)
        text = tbl.explain_search(query, k=10)
        assert text.count("via its index") == 6, text
        got = tbl.vector_search(query, k=10)
        for row in got.drop_columns(["_distance"]).to_pylist():
            assert row == latest[row["k"]], f"stale or deleted row returned: {row}"
        found += len(set(got.column("k").to_pylist()) & set(brute_force(model, query, 10)))
        tbl.close()
    assert found / (10 * queries) >= 0.95


def test_small_generations_are_searched_exactly_reading_their_vectors_only(lagging) -> None:
    uri, model = lagging
    tbl = mw.open_table(uri, cache=64 << 20)
    query = np.random.default_rng(5).normal(size=DIM).astype(np.float32)
    text = tbl.explain_search(query, k=10)  # from the first search, with nothing in memory
    assert " flat" not in text and "via its index" not in text, text
    assert text.count("GenerationsKnnExec") == 2, text  # one run per region
    assert tbl.vector_search(query, k=10).column("k").to_pylist() == brute_force(model, query, 10)
    # Their keys, tombstones and vectors were read, kept with the matrices: not their rows.
    assert not [u for kind, u in tbl.caches.lookup.entries() if kind == "rows"]
    search = tbl.caches.search
    read = [search.peek(kind, key)[1][0] for kind, key in search.entries() if kind == "vectors"]
    assert len(read) == 2
    assert all(t.column_names == ["k", "_tombstone", "vec", "_gen", "_rowaddr"] for t in read)
    tbl.close()


def test_the_stale_check_reads_versions_not_the_generations_rows(tmp_path) -> None:
    # The base's nearest rows to their own old vectors are stale: a flushed generation holds
    # newer versions of their keys (and deleted one). The check finds that from each key's
    # version (key, _gen, _rowaddr, _tombstone) alone: no generation is read whole for it.
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, vec_batch(list(range(200)), 0), primary_key="k")
    model = Model(["k"])
    model.upsert(vec_batch(list(range(200)), 0))
    moved = vec_batch(list(range(0, 40, 2)), 1)
    tbl.upsert(moved), model.upsert(moved)
    tbl.delete([1]), model.delete(pa.table({"k": [1]}))
    tbl.flush()
    tbl.close()
    latest = _latest_rows(model)
    old = vec_batch(list(range(40)), 0).column("vec").to_pylist()
    for key in (0, 1, 2, 4):
        tbl = mw.open_table(uri, cache=64 << 20)
        query = np.asarray(old[key], np.float32)
        got = tbl.vector_search(query, k=10)
        for row in got.drop_columns(["_distance"]).to_pylist():
            assert row == latest[row["k"]], f"stale or deleted row returned: {row}"
        assert got.column("k").to_pylist() == brute_force(model, query, 10)
        stale = tbl._search.last_plan.root.children[0]
        assert stale.dropped_stale + stale.dropped_deleted >= 1  # at least the key queried
        assert not [u for kind, u in tbl.caches.lookup.entries() if kind == "rows"]
        tbl.close()


@pytest.mark.parametrize(("sub_vectors", "refine"), [(4, 2), (2, 10)])
def test_a_fine_pq_index_is_refined_over_fewer_candidates(tmp_path, sub_vectors, refine) -> None:
    # 2 dimensions per sub-vector code rank almost exactly: 2 * k candidates re-ranked, not
    # 10 * k (each a random read); coarser codes keep 10 * k. Recall stays >= 0.95 either way.
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, vec_batch(list(range(BASE_KEYS)), 0), primary_key="k")
    tbl.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=sub_vectors)
    model = Model(["k"])
    model.upsert(vec_batch(list(range(BASE_KEYS)), 0))
    found = 0
    for seed in range(20):
        query = np.random.default_rng(300 + seed).normal(size=DIM).astype(np.float32)
        text = tbl.explain_search(query, k=10)
        assert f"refine_factor={refine}" in text, text
        got = tbl.vector_search(query, k=10).column("k").to_pylist()
        found += len(set(got) & set(brute_force(model, query, 10)))
    assert found / 200 >= 0.95
    tbl.close()


def test_a_search_verifies_the_files_it_opens_and_no_others(lagging, monkeypatch) -> None:
    """Every generation's vector index and transaction files damaged: an exact search of the
    generations opens neither, so it neither reads nor verifies them and answers right; a
    search through the generations' own indexes opens them, and refuses (typed error)."""
    from pathlib import Path

    import memwal_sql.storage.checksums as checksums
    from memwal_sql.errors import CorruptGenerationError
    from tests.test_damage import flip_bit

    uri, model = lagging
    gens = sorted(Path(uri, "_mem_wal").glob("*/*_gen_*"))
    assert len(gens) == 6
    for gen in gens:
        for damaged in [*gen.glob("_indices/*/index.idx"), *gen.glob("_transactions/*")]:
            flip_bit(damaged, 20)
    verified: list[str] = []
    check = checksums._check

    def spy(store, directory, record, names, skip):
        verified.extend(n for n in names if n not in skip)
        return check(store, directory, record, names, skip)

    monkeypatch.setattr(checksums, "_check", spy)
    query = np.random.default_rng(5).normal(size=DIM).astype(np.float32)
    tbl = mw.open_table(uri, cache=64 << 20)
    got = tbl.vector_search(query, k=10)
    latest = _latest_rows(model)
    for row in got.drop_columns(["_distance"]).to_pylist():
        assert row == latest[row["k"]], f"stale or deleted row returned: {row}"
    assert got.column("k").to_pylist() == brute_force(model, query, 10)
    assert [n for n in verified if n.startswith("data/")], verified  # what it opened
    assert not [n for n in verified if n.startswith(("_indices/", "_transactions/"))], verified
    tbl.close()

    monkeypatch.setattr(planner.search, "INDEXED_GENERATION_ROWS", 0)
    tbl = mw.open_table(uri, cache=64 << 20)
    with pytest.raises(CorruptGenerationError, match=r"_indices/.*damaged"):
        tbl.vector_search(query, k=10)
    tbl.close()


def test_the_base_vector_index_is_described_without_its_centroids(tmp_path, monkeypatch) -> None:
    # pylance's index_statistics serializes every IVF centroid as JSON (36 ms cold at 10M
    # rows): the search reads what it needs from the index files' metadata instead.
    import lance

    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, vec_batch(list(range(BASE_KEYS)), 0), primary_key="k")
    tbl.create_index("vec", "IVF_PQ", num_partitions=9, num_sub_vectors=4)
    partitions = tbl.dataset().index_statistics("vec_idx")["indices"][0]["num_partitions"]
    tbl.close()
    calls: list[str] = []
    statistics = lance.LanceDataset.index_statistics

    def spy(self, name):
        calls.append(name)
        return statistics(self, name)

    monkeypatch.setattr(lance.LanceDataset, "index_statistics", spy)
    tbl = mw.open_table(uri, cache=64 << 20)
    found = planner.search.vector_index(tbl.dataset(), "vec", tbl.caches)
    assert found == planner.search.VectorIndex("vec_idx", "IVF_PQ", "l2", partitions, DIM / 4)
    query = np.random.default_rng(8).normal(size=DIM).astype(np.float32)
    assert tbl.vector_search(query, k=10).num_rows == 10
    assert "vec_idx" not in calls, calls
    tbl.close()
