"""DeduplicateExec alone: the newest version per key across the base and newer sources."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.dedup import DeduplicateExec, newest_per_key
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Scan
from memwal_sql.expressions.predicate import Compare
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    GEN,
    ROWADDR,
    TOMBSTONE,
)
from tests.exec_nodes.nodes import BASE, CACHES, SOURCE, check_contract, wal_rows


def test_newest_per_key_picks_the_highest_generation_then_row_address():
    t = pa.table(
        {
            "id": [1, 1, 2, 2],
            GEN: [1, 2, 3, 3],
            ROWADDR: pa.array([5, 0, 1, 2], pa.uint64()),
            TOMBSTONE: [False, True, False, False],
        }
    )
    out = newest_per_key(t, ["id"]).sort_by("id").to_pylist()
    assert [(r[GEN], r[ROWADDR], r[TOMBSTONE]) for r in out] == [(2, 0, True), (3, 2, False)]


def test_deduplicate_merges_base_and_newer_sources(base, generation):
    _, uri, _ = generation
    newer = [
        MemTableSourceExec(
            "r",
            2,
            [wal_rows([1, 5], "m2", f=[0.5, 9.0]).to_batches()[0]],
            SOURCE,
            Scan(),
            caches=CACHES,
        ),
        GenerationSourceExec("r", 1, uri, SOURCE, Scan(), caches=CACHES),
    ]
    out_schema = pa.schema([*BASE, pa.field(GEN, pa.int64(), False)])
    node = DeduplicateExec(
        newer, base, [None], primary_key=["id"], predicate=None, output=out_schema, caches=CACHES
    )
    rows = check_contract(node).sort_by("id").to_pylist()
    # 1: memtable; 2: generation; 3: deleted in the generation; 4: base; 5: memtable.
    assert [(r["id"], r["v"], r[GEN]) for r in rows] == [
        (1, "m2", 2),
        (2, "g1", 1),
        (4, None, BASE_GENERATION),
        (5, "m2", 2),
    ]
    assert len(node.children) == 3  # two newer sources and one base part, built once
    assert node.children[2] is node.children[2]

    def where_v_is(v):
        node = DeduplicateExec(
            newer,
            base,
            [None],
            primary_key=["id"],
            output=out_schema,
            predicate=Compare("v", "=", pa.scalar(v)),
            caches=CACHES,
        )
        return check_contract(node)

    # A filter sees only each key's newest version: base row 1 (v='b1') never comes back.
    assert where_v_is("b1").num_rows == 0
    # Nor does a generation's version that a MemTable replaced (key 5, v='g1').
    assert where_v_is("g1").column("id").to_pylist() == [2]


def test_memtable_versions_are_reused_until_the_memtable_grows(tmp_path):
    import memwal_sql as mw
    from memwal_sql.read_snapshot import take_read_snapshot
    from planner.scan import plan_scan

    tbl = mw.create_table(
        str(tmp_path), wal_rows([1, 2, 3], "b").select(["id", "v", "f"]), primary_key="id"
    )
    tbl.upsert(wal_rows([2, 4], "m1").select(["id", "v", "f"]))

    def plan():
        return plan_scan(take_read_snapshot(tbl), tbl.region_spec, tbl.schema, None).root

    first, again = plan(), plan()
    assert first.versions()[1] is again.versions()[1]  # same MemTable rows: reused
    assert check_contract(again).sort_by("id").column("v").to_pylist() == ["b", "m1", "b", "m1"]
    tbl.upsert(wal_rows([1], "m2").select(["id", "v", "f"]))
    tbl.delete(pa.table({"id": [4]}))
    grown = plan()
    assert grown.versions()[1] is not first.versions()[1]
    assert check_contract(grown).sort_by("id").column("v").to_pylist() == ["m2", "m1", "b"]
    assert grown.partitions == 2  # one base part, then the newer rows


@settings(max_examples=60, deadline=None)
@given(
    sources=st.lists(
        st.lists(st.tuples(st.integers(0, 12), st.booleans(), st.booleans()), max_size=25),
        min_size=1,
        max_size=4,
    ),
    replace=st.sets(st.integers(0, 12)),
)
def test_versions_by_row_address_agree_with_versions_by_key(sources, replace):
    """Sources (per row: key, tombstone, whether Lance's deletion vector hides it) sharing
    generation numbers, as regions' generations do: checking a row by its row address gives
    what checking it by its key gives."""
    from exec_nodes.dedup import Versions

    tables, physical = [], []
    for rows in sources:
        gen = 1 + len(tables) % 2  # two sources per generation number
        every = pa.table(
            {
                "id": pa.array([k for k, _, _ in rows], pa.int64()),
                GEN: pa.array([gen] * len(rows), pa.int64()),
                # The second half in a second fragment (addresses past 2**32), as in a
                # generation of more rows than Lance puts in one file.
                ROWADDR: pa.array(
                    [(j >= len(rows) // 2) << 32 | j for j in range(len(rows))], pa.uint64()
                ),
                TOMBSTONE: pa.array([t for _, t, _ in rows], pa.bool_()),
            }
        )
        physical.append(every)
        tables.append(every.filter(pa.array([not h for _, _, h in rows], pa.bool_())))
    versions = Versions.of(tables, ["id"], [pa.field("id", pa.int64())])
    for i, live in enumerate(tables):
        versions.index_source(f"s{i}", live, ["id"])
    assert versions.nbytes < 1 << 20  # per fragment, never one array up to address 2**32
    replaced = np.isin(versions.keys.column("id").to_numpy(), sorted(replace))
    for i, live in enumerate(tables):
        by_key = versions.is_version(live, ["id"], replaced)
        by_addr = versions.is_version_at(f"s{i}", live.column(ROWADDR).to_numpy(), replaced)
        assert by_addr.tolist() == by_key.tolist()
        unindexed = versions.is_version_of("not indexed", live, ["id"], replaced)
        assert unindexed.tolist() == by_key.tolist()  # falls back to the key
        # A hidden row is never a version (an older duplicate), whatever its key.
        every = versions.is_version_at(f"s{i}", physical[i].column(ROWADDR).to_numpy())
        hidden = np.array([h for _, _, h in sources[i]], dtype=bool)
        assert not every[hidden].any()
    assert versions.is_version_at("not indexed", np.zeros(1, np.int64)) is None
