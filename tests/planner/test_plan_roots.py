"""Plan roots: every plan (scan, lookup, vector and full-text search) is an exec node that
runs by partition, planning reads nothing a search ranks, and a region's leaves come newest
first from one builder. Also the search query object."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from exec_nodes.base import ExecNode
from exec_nodes.knn import GenerationRunsKnnExec
from exec_nodes.source import Lookup, Scan
from memwal_sql.expressions.predicate import Compare
from memwal_sql.read_snapshot import GenerationRef, take_read_snapshot
from planner.leaves import generation_leaves, region_leaves
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


def test_region_leaves_read_memtables_then_generations_newest_first(tbl):
    snap = take_read_snapshot(tbl)
    assert sum(r.num_sources for r in snap.regions) >= 4
    for region in snap.regions:
        leaves = region_leaves(snap, region, Scan())
        got = [(type(leaf).__name__, leaf.region_id, leaf.generation) for leaf in leaves]
        want = [("MemTableSourceExec", region.region_id, m.generation) for m in region.unflushed]
        gens = sorted((g.generation for g in region.generations), reverse=True)
        want += [("GenerationSourceExec", region.region_id, g) for g in gens]
        assert got == want
        assert all(leaf.access == Scan() for leaf in leaves)
    # An indexed read's gap generations are read in generation order with the others.
    region = next(r for r in snap.regions if r.generations)
    gap = [GenerationRef(g.generation - 1000, g.uri) for g in region.generations]
    order = [leaf.generation for leaf in generation_leaves(snap, region, Lookup(("id",)), gap)]
    assert order == sorted(order, reverse=True) and len(order) == 2 * len(region.generations)


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
