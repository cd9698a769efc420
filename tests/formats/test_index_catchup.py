"""Index catch-up derived from what each index covers, and the indexed read plan over the gap."""

from __future__ import annotations

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_sql as mw
from memwal_sql.formats import index_catchup as catchup
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.maintenance.indexes import recorded_catchup
from memwal_sql.read_snapshot import take_read_snapshot
from planner.indexed import plan_indexed_read
from tests.lsm import layered_table

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])


def batch(ks, tag):
    return pa.table({"k": ks, "v": [f"{tag}{k}" for k in ks]}, schema=SCHEMA)


@pytest.fixture
def lagging(tmp_path):
    """Two regions, three generations each merged, the key btree not caught up; plus the model."""
    tbl, model = layered_table(
        str(tmp_path), batch, base=list(range(0, 40, 4)), width=10, step=6, deletes=[8, 9]
    )
    tbl.merge()
    return tbl, model


def test_catch_up_is_where_the_index_last_covered_every_fragment(lagging):
    tbl, _ = lagging
    [cov] = index_coverage(tbl.store, tbl.dataset())
    assert cov.name == "k_pk_btree" and not cov.complete
    assert cov.fragment_ids == {0}  # the seed rows; every merge wrote a new fragment
    assert dict(cov.caught_up) == {}  # nothing merged when the index last covered everything
    result = tbl.catch_up_indexes()
    assert result.optimized == ["k_pk_btree"]
    merged = tbl.merged_generations()
    assert result.caught_up == {"k_pk_btree": merged} and min(merged.values()) >= 3
    [cov] = index_coverage(tbl.store, tbl.dataset())
    assert cov.complete
    # Lance records the same progress in the MemWAL index, in the index's own commit.
    assert recorded_catchup(tbl.mem_wal_details()) == result.caught_up
    assert tbl.catch_up_indexes().optimized == []  # nothing lags: no commit


def test_a_fragment_not_written_by_a_merge_makes_catch_up_unknown(lagging):
    tbl, _ = lagging
    tbl.catch_up_indexes()
    lance.write_dataset(batch([1000], "x"), tbl.uri, mode="append")  # bypasses the MemWAL
    [cov] = index_coverage(tbl.store, tbl.dataset())
    assert cov.caught_up is None
    assert plan_indexed_read(take_read_snapshot(tbl), {"k"}) is None  # the whole base is read
    assert tbl.lookup([1000]).to_pylist() == [{"k": 1000, "v": "x1000"}]


def test_catch_up_is_found_across_a_later_compaction(lagging):
    """A compaction newer than the lagging merge (pylance cannot decode its transaction: the
    walk compares its fragments with the previous version's instead) is not where the
    uncovered fragments came from: catch-up stays known."""
    tbl, model = lagging
    tbl.catch_up_indexes()
    covered = tbl.merged_generations()
    tbl.upsert(batch([0, 4, 100], "late"))
    model.upsert(batch([0, 4, 100], "late"))
    tbl.flush()
    tbl.merge()  # the btree lags again
    # Rewrites the old fragments only (the merge's small fragment is left out), remapping
    # the btree over them.
    tbl.dataset().optimize.compact_files(
        target_rows_per_fragment=2, materialize_deletions_threshold=0.0
    )
    [cov] = index_coverage(tbl.store, tbl.dataset())
    assert not cov.complete
    assert cov.caught_up is not None and dict(cov.caught_up) == covered
    assert covered != tbl.merged_generations()
    assert plan_indexed_read(take_read_snapshot(tbl), {"k"}) is not None
    assert tbl.lookup(list(range(120))).sort_by("k") == model.table(SCHEMA)


@pytest.mark.parametrize("cached", [False, True])
def test_lookups_stay_on_the_index_through_the_gap_and_match_the_model(lagging, cached):
    tbl, model = lagging
    snap = take_read_snapshot(tbl)
    plan = plan_indexed_read(snap, {"k"})
    assert plan is not None and plan.fragment_ids == (0,)
    assert sorted(len(g) for g in plan.gap.values()) == [3, 4]  # every merged generation
    want = model.table(SCHEMA)
    # Scans read the whole base table: no generation index serves a scan filter.
    assert "indexed read" not in tbl.explain("k >= 5")
    assert tbl.to_arrow(filter="k >= 5").sort_by("k") == want.filter(pc.field("k") >= 5)
    saved = tbl.caches.max_bytes
    tbl.caches.max_bytes = saved if cached else 0  # btree path takes the indexed plan
    try:
        text = tbl.explain_lookup([1, 2])
        assert ("indexed read: k_pk_btree" in text) != cached  # the btree path takes it
        assert ("fragments=[0]" in text) != cached
        probe = list(range(45))
        assert tbl.lookup(probe).sort_by("k") == want
    finally:
        tbl.caches.max_bytes = saved
    assert tbl.to_arrow().sort_by("k") == want  # no filter: the whole base, no gap


def test_gap_generations_are_kept_until_the_index_covers_them(lagging):
    from datetime import timedelta

    tbl, model = lagging
    want = model.table(SCHEMA).filter(pc.field("k") >= 5)
    assert tbl.gc().generations == {}
    assert plan_indexed_read(take_read_snapshot(tbl), {"k"}) is not None
    # Dropping the history the catch-up is derived from: the generations stay. A process that
    # had not derived it before (an empty cache) finds it unknown and reads the whole base
    # table, still exact.
    assert tbl.gc(base_versions_older_than=timedelta(0)).generations == {}
    catchup._cache.clear()
    assert index_coverage(tbl.store, tbl.dataset())[0].caught_up is None
    assert plan_indexed_read(take_read_snapshot(tbl), {"k"}) is None
    assert tbl.to_arrow(filter="k >= 5").sort_by("k") == want
    tbl.catch_up_indexes()
    collected = tbl.gc(base_versions_older_than=timedelta(0)).generations
    assert sorted(len(g) for g in collected.values()) == [3, 4]
    assert plan_indexed_read(take_read_snapshot(tbl), {"k"}) is None  # caught up: nothing to bridge
    assert tbl.to_arrow(filter="k >= 5").sort_by("k") == want


def test_full_text_and_vector_indexes_catch_up_and_gc_waits_for_the_slowest(tmp_path):
    from datetime import timedelta

    schema = pa.schema(
        [
            pa.field("k", pa.int64(), False),
            pa.field("v", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), 4)),
        ]
    )

    def rows(ks, tag):
        return pa.table(
            {
                "k": ks,
                "v": [f"{tag} word{k}" for k in ks],
                "vec": [[float(k), 1, 2, 3] for k in ks],
            },
            schema=schema,
        )

    tbl = mw.create_table(str(tmp_path), rows(list(range(300)), "base"), primary_key="k")
    tbl.dataset().create_scalar_index("v", "INVERTED", name="v_fts")
    tbl.dataset().create_index("vec", "IVF_FLAT", num_partitions=1, name="vec_ivf")
    tbl.upsert(rows(list(range(20)), "fresh"))
    tbl.flush()
    tbl.merge()
    assert {c.name for c in index_coverage(tbl.store, tbl.dataset()) if not c.complete} == {
        "k_pk_btree",
        "v_fts",
        "vec_ivf",
    }
    # Only the key btree is optimized: the generation stays for the two that lag.
    tbl.dataset().optimize.optimize_indices(index_names=["k_pk_btree"])
    assert tbl.gc(base_versions_older_than=timedelta(0)).generations == {}
    assert sorted(tbl.catch_up_indexes().optimized) == ["v_fts", "vec_ivf"]
    assert all(c.complete for c in index_coverage(tbl.store, tbl.dataset()))
    assert (
        sum(len(g) for g in tbl.gc(base_versions_older_than=timedelta(0)).generations.values()) == 1
    )
    assert tbl.dataset().to_table(full_text_query="fresh").num_rows == 20
    assert tbl.lookup([5]).column("v").to_pylist() == ["fresh word5"]
