"""Plan roots: every plan (scan, lookup, vector and full-text search) is an exec node that
runs by partition, planning reads nothing a search ranks, and the snapshot's sources come
from one iterator. Also the search query object."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from exec_nodes.base import ExecNode
from exec_nodes.knn import GenerationRunsKnnExec
from memwal_sql.expressions.predicate import Compare
from memwal_sql.read_snapshot import take_read_snapshot
from planner.lookup import plan_lookup
from planner.scan import plan_scan

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("text", pa.string()),
        pa.field("vec", pa.list_(pa.float32(), 2)),
    ]
)


def rows(ids, x):
    vecs = pa.FixedSizeListArray.from_arrays(
        pa.array([v for i in ids for v in (float(i) * x, 0.0)], pa.float32()), 2
    )
    return pa.table({"id": ids, "text": [f"word{i} fox" for i in ids], "vec": vecs}, SCHEMA)


@pytest.fixture
def tbl(tmp_path):
    t = mw.create_table(
        str(tmp_path),
        rows([1, 2, 3, 4], 1.0),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    t.upsert(rows([1, 2], 2.0))
    t.flush()
    t.upsert(rows([3, 5], 3.0))
    t.flush()
    t.upsert(rows([2, 6], 4.0))  # unflushed
    yield t
    t.close()


def test_sources_come_base_first_then_per_region_memtables_and_generations_newest_first(tbl):
    snap = take_read_snapshot(tbl)
    got = [(s.kind, s.region_id, s.generation) for s in snap.sources(base=True)]
    assert got[0] == ("base", "", -1)
    per_region: dict[str, list[tuple[str, int]]] = {}
    for kind, rid, gen in got[1:]:
        per_region.setdefault(rid, []).append((kind, gen))
    for region in snap.regions:
        want = [("memtable", m.generation) for m in region.unflushed]
        want += [("generation", g.generation) for g in region.generations]
        want[len(region.unflushed) :] = sorted(want[len(region.unflushed) :], key=lambda w: -w[1])
        assert per_region.get(region.region_id, []) == want
    assert sum(r.num_sources for r in snap.regions) == len(got) - 1
    one = snap.regions[0].region_id
    assert {s.region_id for s in snap.sources(regions={one})} == {one}


def test_every_plan_root_is_an_exec_node_run_by_partition(tbl):
    snap = take_read_snapshot(tbl)
    scan = plan_scan(snap, tbl.region_spec, tbl.schema, None, partitions=1)
    lookup = plan_lookup(snap, tbl.store, tbl.region_spec, pa.table({"id": [2, 3, 9]}))
    search = tbl._search.plan(mw.SearchQuery(query=[0.0, 0.0], k=2))
    text = tbl._search.plan(mw.SearchQuery(query="fox", k=2))
    for plan in (scan, lookup, search, text):
        assert isinstance(plan, ExecNode) and plan.partitions >= 1
        assert plan.explain().startswith("MemWAL ")
    assert scan.partitions == scan.root.partitions == 2  # a base part and the newer rows
    assert sorted(scan.to_table().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert sorted(lookup.to_table().column("id").to_pylist()) == [2, 3]


def test_a_lookup_plan_applies_its_residual_before_projecting(tbl):
    keys = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    residual = Compare("text", "=", pa.scalar("word2 fox"))
    plan = plan_lookup(take_read_snapshot(tbl), tbl.store, tbl.region_spec, keys, residual)
    only_ids = pa.schema([pa.field("id", pa.int64())])
    got = pa.Table.from_batches(list(plan.execute_columns(0, only_ids)), schema=only_ids)
    assert got.column("id").to_pylist() == [2]
    assert "then filtered by" in plan.explain()


def test_planning_a_search_runs_nothing_until_it_executes(tbl):
    q = mw.SearchQuery(query=np.zeros(2, np.float32), k=3)
    plan = tbl._search.plan(q)
    stale = plan.root.children[0]
    assert [c.fetched() for c in stale.children] == [0] * len(stale.children)
    runs = [c for c in stale.children if isinstance(c, GenerationRunsKnnExec)]
    assert runs and all(r.children == [] for r in runs)
    got = plan.to_table()
    assert all(c.fetched() > 0 for c in stale.children)
    assert got.equals(tbl.vector_search(np.zeros(2, np.float32), k=3))
    assert got.column("id").to_pylist()[0] == 1  # its latest vector (2, 0) is the nearest


def test_search_query_is_frozen_keyword_only_and_runs_either_search(tbl):
    with pytest.raises(TypeError):
        mw.SearchQuery([0.0, 0.0])  # type: ignore[misc]
    q = mw.SearchQuery(query=[0.0, 0.0], k=2, metric="L2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.k = 3  # type: ignore[misc]
    assert tbl.search(q).equals(tbl.vector_search([0.0, 0.0], k=2, metric="l2"))
    text = mw.SearchQuery(query="word5", column="text", k=1)
    assert text.is_text and tbl.search(text).column("id").to_pylist() == [5]
    with pytest.raises(mw.errors.InvalidInputError, match="full-text query is text"):
        tbl.fts([0.0, 0.0])  # type: ignore[arg-type]
    with pytest.raises(mw.errors.InvalidInputError, match="vector of 2 numbers"):
        tbl.vector_search("fox")
