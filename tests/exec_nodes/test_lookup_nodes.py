"""The lookup nodes alone: take-last leaves, bloom guard, merged generation index,
coalesce-first and the point-lookup root."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.base import ExecNode
from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.lookup import (
    BloomFilterGuardExec,
    CoalesceFirstExec,
    GenerationIndexExec,
    KeyProbe,
    PointLookupExec,
)
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Lookup
from memwal_sql.formats.generation import BLOOM_FILTER
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
    TOMBSTONE,
    conform,
    source_schema,
)
from memwal_sql.storage import ObjectStore
from memwal_sql.writer.flush import write_generation
from tests.exec_nodes.nodes import CACHES, SOURCE, WAL, check_contract, wal_rows


def test_take_last_of_a_memtable_returns_the_newest_duplicate():
    batches = [wal_rows([1, 2], "old").to_batches()[0], wal_rows([1], "new").to_batches()[0]]
    node = MemTableSourceExec(
        "r",
        3,
        batches,
        SOURCE,
        Lookup(("id",)),
        keys=pa.table({"id": pa.array([1, 9], pa.int64())}),
        caches=CACHES,
    )
    rows = check_contract(node, want_rows=1).to_pylist()
    assert rows[0]["v"] == "new" and rows[0][ROWADDR] == 2
    probe = node.probe(pa.table({"id": pa.array([9, 2, 1], pa.int64())}))
    assert probe.hit.tolist() == [False, True, True]


def test_take_last_of_a_generation_uses_its_pk_index(generation):
    _, uri, _ = generation
    node = GenerationSourceExec(
        "r",
        1,
        uri,
        SOURCE,
        Lookup(("id",)),
        keys=pa.table({"id": pa.array([3, 4, 5], pa.int64())}),
        caches=CACHES,
    )
    rows = check_contract(node, want_rows=2).sort_by("id").to_pylist()
    assert [(r["id"], r[TOMBSTONE]) for r in rows] == [(3, True), (5, False)]


def test_bloom_filter_guard_passes_only_keys_the_filter_may_hold(generation):
    store, uri, path = generation
    child = GenerationSourceExec("r", 1, uri, SOURCE, Lookup(("id",)), caches=CACHES)
    keys = pa.table({"id": pa.array([2, *range(1000, 1100)], pa.int64())})
    guard = BloomFilterGuardExec(child, store, f"{path}/{BLOOM_FILTER}", keys=keys)
    rows = check_contract(guard, want_rows=1)
    assert rows.column("id").to_pylist() == [2]
    assert guard.passed >= 1 and guard.skipped > 90 and child.probes == 1


def test_coalesce_first_stops_at_the_newest_hit_and_a_tombstone_resolves():
    newest = MemTableSourceExec(
        "r",
        2,
        wal_rows([1, 2], "n", dead=[False, True]).to_batches(),
        SOURCE,
        Lookup(("id",)),
        caches=CACHES,
    )
    older = MemTableSourceExec(
        "r", 1, wal_rows([1, 2, 3], "o").to_batches(), SOURCE, Lookup(("id",)), caches=CACHES
    )
    keys = pa.table({"id": pa.array([3, 1, 2, 4], pa.int64())})
    node = CoalesceFirstExec([newest, older], ["id"], SOURCE, keys=keys)
    rows = check_contract(node, want_rows=3).sort_by("id").to_pylist()
    assert [(r["id"], r["v"], r[TOMBSTONE]) for r in rows] == [
        (1, "n", False),
        (2, "n", True),
        (3, "o", False),
    ]
    assert node.probe(keys).hit.tolist() == [True, True, True, False]


def test_point_lookup_asks_the_base_only_for_what_no_region_resolved(base):
    region = CoalesceFirstExec(
        [
            MemTableSourceExec(
                "r",
                1,
                wal_rows([1, 2], "m", dead=[False, True]).to_batches(),
                SOURCE,
                Lookup(("id",)),
                caches=CACHES,
            )
        ],
        ["id"],
        SOURCE,
        keys=pa.table({"id": pa.array([1, 2, 3, 9], pa.int64())}),
    )
    base_node = BaseSourceExec(base, SOURCE, Lookup(("id",)), caches=CACHES)
    keys = pa.table({"id": pa.array([1, 2, 3, 9], pa.int64())})
    for parallel in (1, 1000):  # the base probed beside the regions, or after them
        node = PointLookupExec(keys, [region], base_node, parallel_keys=parallel)
        rows = check_contract(node).sort_by("id").to_pylist()
        assert [(r["id"], r["v"]) for r in rows] == [(1, "m"), (3, "b3")]
    assert base_node.probes == 2


def test_generation_index_answers_as_the_generations_one_by_one(tmp_path):
    store = ObjectStore(str(tmp_path / "table"))
    takes = []
    for gen, (ids, dead) in (
        (1, ([1, 2, 3, 4], [False] * 4)),
        (2, ([2, 3], [False, True])),
        (3, ([4, 9], [False, False])),
    ):
        rows = conform(wal_rows(ids, f"g{gen}", dead=dead), WAL)
        entry = write_generation(
            store,
            "r",
            gen,
            rows,
            ["id"],
            data_storage_version="stable",
            in_memory_bytes=rows.nbytes,
        )
        takes.append(
            GenerationSourceExec(
                "r",
                gen,
                store.uri_for(f"_mem_wal/r/{entry.path}"),
                SOURCE,
                Lookup(("id",)),
                caches=CACHES,
            )
        )
    newest_first = takes[::-1]
    keys = pa.table({"id": pa.array([9, 4, 3, 2, 1, 7], pa.int64())})
    node = GenerationIndexExec(newest_first, ["id"], SOURCE, keys=keys, caches=CACHES)
    merged = check_contract(node).sort_by("id")
    one_by_one = CoalesceFirstExec(newest_first, ["id"], SOURCE, keys=keys).to_table().sort_by("id")
    assert merged.equals(one_by_one)
    assert [(r["id"], r[GEN], r[TOMBSTONE]) for r in merged.to_pylist()] == [
        (1, 1, False),
        (2, 2, False),
        (3, 2, True),
        (4, 3, False),
        (9, 3, False),
    ]
    assert node.probe(keys).hit.tolist() == [True] * 5 + [False]


@settings(max_examples=60, deadline=None)
@given(
    writes=st.lists(
        st.lists(st.tuples(st.integers(0, 12), st.text("ab", max_size=1)), max_size=9),
        min_size=1,
        max_size=12,
    )
)
def test_keys_index_finds_the_newest_row_of_each_key_as_the_memtable_grows(writes):
    """KeysIndex against a dict model, after every write: runs merge, newest wins, composite
    keys, empty writes; each update's view answers as of its batches while the index grows
    (concurrent queries of one MemTable saw it at different moments)."""
    from memwal_sql.writer.memtable_indexes import KeysIndex

    schema = source_schema(
        pa.schema(
            [("a", pa.int64()), ("b", pa.string()), ("v", pa.int64()), (TOMBSTONE, pa.bool_())]
        )
    )
    index = KeysIndex(schema, 5, ["a", "b"])
    batches, latest, n, views = [], {}, 0, []
    probe = pa.table({"a": [a for a in range(13) for _ in "ab"], "b": ["a", "b"] * 13})
    for rows in writes:
        batches.append(
            pa.record_batch(
                {
                    "a": pa.array([a for a, _ in rows], pa.int64()),
                    "b": pa.array([b for _, b in rows], pa.string()),
                    "v": pa.array(range(n, n + len(rows)), pa.int64()),
                    TOMBSTONE: pa.array([False] * len(rows), pa.bool_()),
                }
            )
        )
        for i, key in enumerate(rows):
            latest[key] = n + i
        n += len(rows)
        view = index.update(list(batches))
        at = view.find(probe)
        want = [
            latest.get(k, -1)
            for k in zip(probe.column("a").to_pylist(), probe.column("b").to_pylist())
        ]
        assert at.tolist() == want
        assert len(index._runs) <= max(1, n).bit_length() + 1
        found = at[at >= 0]
        if len(found):
            got = view.take(found)
            assert got.column("v").to_pylist() == found.tolist()  # v is the row number
            assert got.column(ROWADDR).to_pylist() == found.tolist()
            assert set(got.column(GEN).to_pylist()) == {5}
        views.append((view, want))
        # A query whose snapshot saw fewer batches, run now: it sees the MemTable as it was.
        old = len(batches) // 2
        if old:
            assert index.update(batches[:old]).find(probe).tolist() == views[old - 1][1]
    # Every view answers as of its own update, however the index grew since.
    for view, want in views:
        assert view.find(probe).tolist() == want
    # Batches that do not extend what the index saw (another MemTable's): it starts over.
    other = [pa.record_batch({"a": [3], "b": ["a"], "v": [0], TOMBSTONE: [False]})]
    at = index.update(other).find(pa.table({"a": [3, 4], "b": ["a", "a"]}))
    assert at.tolist() == [0, -1]


def test_lookup_leaves_are_exec_nodes_that_also_probe_by_key():
    batch = wal_rows([4, 4, 6], "m", f=[1.0, 2.0, 3.0]).to_batches()[0]
    leaf = MemTableSourceExec("r", 7, [batch], SOURCE, Lookup(("id",)), caches=CACHES)
    assert isinstance(leaf, KeyProbe) and isinstance(leaf, ExecNode)
    probe = leaf.probe(pa.table({"id": pa.array([6, 4, 8], pa.int64())}))
    assert probe.hit.tolist() == [True, True, False]
    assert sorted(probe.rows.column("f").to_pylist()) == [2.0, 3.0]  # 4's newest duplicate
    with pytest.raises(ValueError, match="no keys bound"):
        list(leaf.execute(0))
    leaf.keys = pa.table({"id": pa.array([4], pa.int64())})
    assert check_contract(leaf, 1).column("f").to_pylist() == [2.0]
