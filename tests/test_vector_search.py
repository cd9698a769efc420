"""Vector search over live data, checked against a brute-force model of the latest rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import InvalidFilterError, InvalidInputError, SchemaMismatchError
from memwal_sql.structures.vectors import distances, vectors_of
from tests.lsm import Model, apply_op, op_sequences

DIM = 8
SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), False),
        pa.field("tag", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)


def vec_batch(keys: list[int], seed: int) -> pa.Table:
    """Rows whose vectors depend on (key, seed): an update moves a key's vector."""
    vecs = (
        np.stack([np.random.default_rng(k * 1000 + seed).normal(size=DIM) for k in keys]).astype(
            np.float32
        )
        if keys
        else np.zeros((0, DIM), np.float32)
    )
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "tag": [f"t{(k + seed) % 3}" for k in keys],
            "n": pa.array([k * 10 + seed for k in keys], pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM),
        },
        schema=SCHEMA,
    )


def brute_force(
    model: Model, query: np.ndarray, k: int, metric: str = "l2", keep: object = None
) -> list[int]:
    latest = model.table(SCHEMA)
    if keep is not None:
        latest = latest.filter(pa.array([keep(r) for r in latest.to_pylist()], pa.bool_()))
    if latest.num_rows == 0:
        return []
    m, _ = vectors_of(latest.column("vec"))
    d = distances(m, query, metric)
    order = np.lexsort((latest.column("k").to_numpy(), d))[:k]
    return latest.column("k").to_numpy()[order].tolist()


def check(tbl: mw.MemWalTable, model: Model, query: np.ndarray, k: int, **kw: object) -> None:
    got = tbl.vector_search(query, k=k, **kw)
    latest = {r["k"]: r for r in model.table(SCHEMA).to_pylist()}
    for row in got.drop_columns(["_distance"]).to_pylist():  # every row is a latest version
        assert row == latest[row["k"]], f"stale or deleted row returned: {row}"
    d = got.column("_distance").to_numpy()
    assert (np.diff(d) >= 0).all()
    keep = None
    if kw.get("filter") == "tag = 't1'":

        def keep(r: dict) -> bool:
            return r["tag"] == "t1"

    assert got.column("k").to_pylist() == brute_force(model, query, k, keep=keep)


@pytest.fixture
def base_rows() -> pa.Table:
    return vec_batch(list(range(300)), 0)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=op_sequences(400, 60, ["flush", "merge", "catchup", "compact"]),
    qseed=st.integers(0, 50),
    k=st.sampled_from([1, 5, 20]),
    cached=st.booleans(),
)
def test_search_equals_brute_force_after_every_step(
    tmp_path_factory: pytest.TempPathFactory,
    base_rows: pa.Table,
    ops: list,
    qseed: int,
    k: int,
    cached: bool,
) -> None:
    """Exact search (an IVF_FLAT index probed everywhere, or flat): after every step the top k
    are the brute-force top k of the latest rows; no stale or deleted row ever comes back.
    With the lookup cache on, each region's generations are searched as one matrix; with it
    off, each generation through Lance."""
    # Off: caches of 0 bytes for this table (and its reopened handles), the default's else.
    _search_after_every_step(tmp_path_factory, base_rows, ops, qseed, k, None if cached else 0)


def _search_after_every_step(tmp_path_factory, base_rows, ops, qseed, k, cache) -> None:
    uri = str(tmp_path_factory.mktemp("vs"))
    tbl = mw.create_table(
        uri,
        base_rows,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        writer_config=mw.WriterConfig(durable_write=False, max_memtable_rows=40),
        cache=cache,
    )
    tbl.create_index("vec", "IVF_FLAT", num_partitions=2)
    model = Model(["k"])
    model.upsert(base_rows)
    query = np.random.default_rng(qseed).normal(size=DIM).astype(np.float32)
    for op, keys, seed in ops:
        tbl = apply_op(tbl, model, op, keys, seed, uri, vec_batch)
        check(tbl, model, query, k, nprobes=2)
        check(tbl, model, query, k, nprobes=2, filter="tag = 't1'")
    tbl.close()


def test_generations_beyond_a_runs_share_of_the_cache_are_searched_in_runs(tmp_path) -> None:
    # A 64 KiB cache: each generation is kept (its file is under 1/16 of it), but a run of
    # generations searched as one matrix holds at most 1/8 of it: 12 generations of 30 rows
    # make several runs, and keys updated across them are still found at their latest.
    tbl = mw.create_table(  # the table's own 64 KiB caches
        str(tmp_path), vec_batch(list(range(50)), 0), primary_key="k", cache=64 << 10
    )
    model = Model(["k"])
    model.upsert(vec_batch(list(range(50)), 0))
    for seed in range(1, 13):
        rows = vec_batch([(seed * 7 + i) % 60 for i in range(30)], seed)
        tbl.upsert(rows)
        model.upsert(rows)
        tbl.flush()
    query = np.random.default_rng(5).normal(size=DIM).astype(np.float32)
    runs = tbl.explain_search(query, k=10).count("GenerationsKnnExec")
    assert 2 <= runs < 12
    for k in (1, 10, 40):
        check(tbl, model, query, k)
    tbl.close()


def test_fresh_write_found_at_once_and_deleted_never(tmp_path, base_rows) -> None:
    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=2)
    query = np.full(DIM, 7.0, np.float32)
    fresh = vec_batch([5000], 1).set_column(
        3, "vec", pa.FixedSizeListArray.from_arrays(pa.array(query), DIM)
    )
    tbl.upsert(fresh)  # durable: acknowledged means searchable
    assert tbl.vector_search(query, k=1).column("k").to_pylist() == [5000]
    tbl.flush()
    assert tbl.vector_search(query, k=1).column("k").to_pylist() == [5000]
    tbl.delete([5000])
    assert 5000 not in tbl.vector_search(query, k=50).column("k").to_pylist()
    # A base row moved far away by an update is not found where it used to be.
    near = tbl.vector_search(np.zeros(DIM, np.float32), k=1).column("k")[0].as_py()
    moved = vec_batch([near], 2).set_column(
        3, "vec", pa.FixedSizeListArray.from_arrays(pa.array(np.full(DIM, -50.0, np.float32)), DIM)
    )
    tbl.upsert(moved)
    got = tbl.vector_search(np.zeros(DIM, np.float32), k=10)
    assert near not in got.column("k").to_pylist()
    assert len(got) == 10  # the stale candidate's place was filled from further down
    tbl.close()


def test_filter_applies_to_latest_version(tmp_path, base_rows) -> None:
    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    query = np.random.default_rng(3).normal(size=DIM).astype(np.float32)
    best = tbl.vector_search(query, k=1, filter="tag = 't0'").to_pylist()[0]
    # Its newer version no longer matches: the older, matching base row must not come back.
    newer = vec_batch([best["k"]], 1)  # tag t{(k+1)%3} differs
    tbl.upsert(newer)
    got = tbl.vector_search(query, k=5, filter="tag = 't0'")
    assert best["k"] not in got.column("k").to_pylist()
    assert set(got.column("tag").to_pylist()) == {"t0"}
    # A part of the filter DataFusion keeps to itself (lower()) is applied too.
    got2 = tbl.vector_search(query, k=5, filter="tag = 't0' AND lower(tag) = 't0'")
    assert got2.column("k").to_pylist() == got.column("k").to_pylist()
    tbl.close()


def test_region_pruned_sources_still_make_base_rows_stale(tmp_path) -> None:
    """A filter on the region column prunes regions from the search, but a base row whose
    key has a newer version in a pruned region must still be dropped."""
    rows = vec_batch(list(range(40)), 0)
    tbl = mw.create_table(
        str(tmp_path),
        rows,
        primary_key="k",
        region_spec=mw.RegionSpec.identity("tag"),
        allow_non_key_region_spec=True,
    )
    query = np.random.default_rng(1).normal(size=DIM).astype(np.float32)
    best = tbl.vector_search(query, k=1, filter="tag = 't0'").to_pylist()[0]
    tbl.upsert(vec_batch([best["k"]], 1))  # now t1: lives in another region
    plan_rows = tbl.vector_search(query, k=3, filter="tag = 't0'")
    assert best["k"] not in plan_rows.column("k").to_pylist()
    text = tbl.explain_search(query, k=3, filter="tag = 't0'")
    assert "pruned" in text and "FilterStaleExec" in text
    tbl.close()


def test_metrics_match_lance(tmp_path, base_rows) -> None:
    tbl = mw.create_table(str(tmp_path), base_rows, primary_key="k")
    tbl.upsert(vec_batch(list(range(290, 320)), 4))
    model = Model(["k"])
    model.upsert(base_rows)
    model.upsert(vec_batch(list(range(290, 320)), 4))
    query = np.random.default_rng(9).normal(size=DIM).astype(np.float32)
    for metric in ("l2", "cosine", "dot"):
        got = tbl.vector_search(query, k=7, metric=metric)
        assert got.column("k").to_pylist() == brute_force(model, query, 7, metric)
    tbl.close()


def test_bad_input_is_typed(tmp_path, base_rows) -> None:
    tbl = mw.create_table(str(tmp_path), base_rows, primary_key="k")
    q = np.zeros(DIM, np.float32)
    with pytest.raises(InvalidInputError, match="values"):
        tbl.vector_search([1.0, 2.0])
    with pytest.raises(InvalidInputError, match="k must"):
        tbl.vector_search(q, k=0)
    with pytest.raises(InvalidInputError, match="metric"):
        tbl.vector_search(q, metric="manhattan")
    with pytest.raises(SchemaMismatchError):
        tbl.vector_search(q, column="tag")
    with pytest.raises(InvalidFilterError):
        tbl.vector_search(q, filter="n > 0 UNION ALL SELECT 1")
    with pytest.raises(SchemaMismatchError):
        tbl.create_index("nope", "IVF_PQ")
    with pytest.raises(InvalidInputError, match="index type"):
        tbl.create_index("vec", "KD_TREE")
    tbl.close()


def test_create_index_is_maintained_and_listed(table_root, base_rows) -> None:
    import lance

    uri, opts = table_root
    tbl = mw.create_table(
        uri,
        base_rows,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        storage_options=opts,
    )
    info = tbl.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=2)
    assert (info.name, info.index_type, info.maintained) == ("vec_idx", "IVF_PQ", True)
    # Lance reads the record as its own.
    details = lance.dataset(uri, storage_options=opts).mem_wal_index_details()
    assert "vec_idx" in details["maintained_indexes"]
    tbl.upsert(vec_batch([1, 2, 500], 3))
    tbl.flush()
    tbl.merge()
    listed = {i.name: i for i in tbl.list_indexes()}
    assert not listed["vec_idx"].caught_up
    assert sum((listed["vec_idx"].lag_generations or {}).values()) >= 1
    tbl.catch_up_indexes()
    assert {i.name: i for i in tbl.list_indexes()}["vec_idx"].caught_up
    tbl.close()


def test_bloom_false_positives_never_drop_valid_rows(tmp_path, base_rows, monkeypatch) -> None:
    """Every bloom filter answering "maybe" for every key: each hit is confirmed in the
    generation's key index, so the answer does not change."""
    from memwal_sql.formats.bloom import BloomFilter

    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    model = Model(["k"])
    model.upsert(base_rows)
    for i in range(3):
        batch = vec_batch(list(range(i * 50, i * 50 + 40)), i + 1)
        tbl.upsert(batch)
        model.upsert(batch)
        tbl.flush()
    query = np.random.default_rng(5).normal(size=DIM).astype(np.float32)
    want = tbl.vector_search(query, k=10).column("k").to_pylist()
    monkeypatch.setattr(
        BloomFilter, "might_contain", lambda self, hashes: np.ones(len(hashes), dtype=bool)
    )
    assert (
        tbl.vector_search(query, k=10).column("k").to_pylist()
        == want
        == brute_force(model, query, 10)
    )
    tbl.close()


def test_sql_table_function_joins_with_the_table(tmp_path, base_rows) -> None:
    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.upsert(vec_batch([1, 2, 3], 5))
    query = np.random.default_rng(2).normal(size=DIM).astype(np.float32)
    ctx = mw.connect()
    ctx.register("items", tbl)
    listed = ", ".join(str(float(x)) for x in query)
    want = tbl.vector_search(query, k=5, filter="tag = 't2'")
    got = ctx.sql(
        f"SELECT s.k, s._distance, i.n FROM vector_search('items', 'vec', [{listed}], 5) s "
        "JOIN items i ON i.k = s.k WHERE s.tag = 't2' ORDER BY s._distance"
    ).to_arrow_table()
    assert got.column("k").to_pylist() == want.column("k").to_pylist()
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    near = ctx.sql(
        f"SELECT k FROM vector_search('items', NULL, [{listed}], 5) "
        f"WHERE _distance <= {float(want.column('_distance')[1].as_py())} "
        "ORDER BY _distance"
    ).to_arrow_table()
    assert (
        near.column("k").to_pylist()
        == tbl.vector_search(query, k=5).column("k").to_pylist()[: near.num_rows]
        and near.num_rows >= 1
    )
    with pytest.raises(Exception, match="no MemWAL table"):
        ctx.sql(f"SELECT * FROM vector_search('nope', 'vec', [{listed}], 5)").to_arrow_table()
    tbl.close()


def test_generations_carry_the_maintained_indexes_and_lance_reads_them(tmp_path) -> None:
    """A flushed generation builds each maintained index under its base name: the vector
    index with the base index's centroids and PQ codebook, the inverted index with its
    tokenizer. Lance 14's own LSM readers read the generations, and agree with us."""
    import lance
    from lance.mem_wal import LsmScanner, LsmVectorSearchPlanner

    from memwal_sql.compat.lance import ivf_pq_model
    from memwal_sql.interop import lance_shard_snapshots

    rows = vec_batch(list(range(600)), 0)
    tbl = mw.create_table(
        str(tmp_path), rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=4)
    tbl.create_index("tag", "INVERTED", with_position=False)
    tbl.upsert(vec_batch(list(range(500, 700)), 1))
    tbl.delete([1, 2, 3])
    tbl.flush()
    base = tbl.dataset().index_statistics("vec_idx")["indices"][0]
    gens = [g for r in take_regions(tbl) for g in r.generations]
    assert gens
    for g in gens:
        ds = lance.dataset(g.uri)
        names = {d.name for d in ds.describe_indices()}
        assert {"vec_idx", "tag_idx"} <= names, names
        gen_index = ds.index_statistics("vec_idx")["indices"][0]
        assert gen_index["centroids"] == base["centroids"]
        assert np.array_equal(ivf_pq_model(gen_index["uri"])[0], ivf_pq_model(base["uri"])[0])
    snapshots = lance_shard_snapshots(tbl)
    theirs = LsmScanner.from_snapshots(tbl.dataset(), snapshots).to_table()
    ours = tbl.to_arrow()
    assert sorted(theirs.column("k").to_pylist()) == sorted(ours.column("k").to_pylist())
    query = np.random.default_rng(4).normal(size=DIM).astype(np.float32)
    planner = LsmVectorSearchPlanner(tbl.dataset(), snapshots, "vec", pk_columns=["k"])
    lance_top = planner.plan_search(
        pa.array(query), k=5, nprobes=4, refine_base_table=True
    ).to_table()
    assert set(lance_top.column("k").to_pylist()) <= set(ours.column("k").to_pylist())
    tbl.close()


def take_regions(tbl: mw.MemWalTable):
    from memwal_sql.read_snapshot import take_read_snapshot

    return take_read_snapshot(tbl).regions


@pytest.mark.parametrize(
    "index_type,params",
    [
        ("IVF_FLAT", {"num_partitions": 2}),
        ("IVF_HNSW_SQ", {"num_partitions": 2}),
        ("IVF_PQ", {"num_partitions": 2, "num_sub_vectors": 2, "metric": "cosine"}),
    ],
)
def test_every_vector_index_type_is_built_on_generations(tmp_path, index_type, params) -> None:
    import lance

    tbl = mw.create_table(str(tmp_path), vec_batch(list(range(400)), 0), primary_key="k")
    tbl.create_index("vec", index_type, **params)
    tbl.upsert(vec_batch(list(range(350, 450)), 1))
    tbl.flush()
    for region in take_regions(tbl):
        for g in region.generations:
            got = lance.dataset(g.uri).describe_indices()
            assert [d.name for d in got if "Vector" in d.type_url] == ["vec_idx"], index_type
    query = np.random.default_rng(8).normal(size=DIM).astype(np.float32)
    model = Model(["k"])
    model.upsert(vec_batch(list(range(400)), 0))
    model.upsert(vec_batch(list(range(350, 450)), 1))
    metric = params.get("metric", "l2")
    got = tbl.vector_search(query, k=5, nprobes=2, refine_factor=50).column("k").to_pylist()
    assert got == brute_force(model, query, 5, metric)
    tbl.close()


def test_unusable_vectors_are_refused_at_write_and_null_ones_never_match(tmp_path, base_rows):
    overflowing = pa.array([3e38, -3e38] + [0.0] * 6, pa.float32())
    bad = vec_batch([900], 0).set_column(
        3, SCHEMA.field("vec"), pa.FixedSizeListArray.from_arrays(overflowing, DIM)
    )
    with pytest.raises(InvalidInputError, match="squared norm"):
        mw.create_table(str(tmp_path / "a"), pa.concat_tables([base_rows, bad]), primary_key="k")
    tbl = mw.create_table(str(tmp_path / "b"), base_rows, primary_key="k")
    before = tbl.to_arrow()
    with pytest.raises(InvalidInputError, match="'k': 900"):
        tbl.upsert(pa.concat_tables([vec_batch([1, 2], 5), bad]))  # nothing of it is written
    assert tbl.to_arrow().equals(before)
    null = vec_batch([901], 0).set_column(
        3, SCHEMA.field("vec"), pa.nulls(1, SCHEMA.field("vec").type)
    )
    tbl.upsert(null)
    assert 901 not in tbl.vector_search(np.zeros(DIM, np.float32), k=1000).column("k").to_pylist()
    assert tbl.lookup([901]).column("vec").to_pylist() == [None]
    tbl.close()


def test_while_the_index_lags_two_merges_the_gap_generations_are_searched_not_the_base_flat(
    tmp_path, base_rows, monkeypatch
) -> None:
    # The spec's indexed read plan: the base is searched through its index alone, and the
    # merged generations the index does not cover yet are searched with the newer ones.
    import exec_nodes.source as source

    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.create_index("vec", "IVF_FLAT", num_partitions=2)
    model = Model(["k"])
    model.upsert(base_rows)
    for seed, (keys, gone) in enumerate(
        [(list(range(0, 300, 3)), [1, 4]), ([*range(0, 300, 5), 400, 401], [2, 3])], 1
    ):  # two merges: updates (some keys twice), inserts and deletes of base rows
        rows = vec_batch(keys, seed)
        tbl.upsert(rows), model.upsert(rows)
        tbl.delete(gone), model.delete(pa.table({"k": gone}))
        tbl.flush()
        tbl.merge()
    fresh = vec_batch([6, 7, 500], 9)  # an unmerged generation over the gap
    tbl.upsert(fresh), model.upsert(fresh)
    tbl.flush()
    lance_calls: list[bool] = []
    nearest = source.lance_nearest

    def spy(ds, node, n, options, generation, indexed_rows=None):
        lance_calls.append(indexed_rows is not None)
        return nearest(ds, node, n, options, generation, indexed_rows)

    monkeypatch.setattr(source, "lance_nearest", spy)
    monkeypatch.setattr("exec_nodes.base_source.lance_nearest", spy)
    for qseed in range(6):
        query = np.random.default_rng(qseed).normal(size=DIM).astype(np.float32)
        check(tbl, model, query, 10, nprobes=2)
    assert lance_calls and all(lance_calls)  # the base: its indexed rows only
    text = tbl.explain_search(query, k=10, nprobes=2)
    assert "indexed read: vec_idx behind the merges" in text, text
    assert "indexed rows only" in text
    gap = sum(len(g) for g in tbl._search.last_plan.indexed.gap.values())
    assert gap >= 4  # both merges' generations, in both regions
    tbl.catch_up_indexes()
    assert "indexed read" not in tbl.explain_search(query, k=10, nprobes=2)
    check(tbl, model, query, 10, nprobes=2)
    tbl.close()
