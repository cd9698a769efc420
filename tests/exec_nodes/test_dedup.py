"""DeduplicateExec alone: the newest version per key across the base and newer sources."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
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


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 40), max_size=30),  # keys of one source
            st.booleans(),  # addresses past 2**32 (a generation's second file)
            st.lists(st.booleans(), min_size=30, max_size=30),  # tombstones
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["strings", "dense", "sparse"]),
)
def test_versions_from_the_key_sets_order_agree_with_newest_per_key(sources, kind):
    # Versions.of finds each key's newest row without a sort (integer keys over a dense
    # range) or in its key set's sort order (no aggregate), and indexes each source by row
    # address; both must say what newest_per_key says.
    from exec_nodes.dedup import Versions

    tables = []
    for gen, (keys, far, dead) in enumerate(sources):
        n = len(keys)
        ids = (
            pa.array([f"k{k}" for k in keys], pa.string())
            if kind == "strings"
            else pa.array([k * (10**9 if kind == "sparse" else 1) - 7 for k in keys], pa.int64())
        )
        addr = (np.arange(n)[::-1] + (1 << 32 if far else 0)).astype(np.uint64)
        tables.append(
            pa.table(
                {
                    "id": ids,
                    GEN: np.full(n, gen + 1),
                    ROWADDR: addr,
                    TOMBSTONE: pa.array(dead[:n], pa.bool_()),
                }
            )
        )
    names = [f"s{i}" for i in range(len(tables))]
    got = Versions.of(tables, ["id"], [tables[0].schema.field("id")], names)
    rows = pa.concat_tables(tables)
    want = newest_per_key(rows, ["id"]) if rows.num_rows else rows.select(["id"])
    newest = {
        k: (g, a, d)
        for k, g, a, d in zip(
            want["id"].to_pylist(),
            *(want[c].to_pylist() for c in (GEN, ROWADDR, TOMBSTONE) if c in want.column_names),
        )
    }
    assert len(got) == len(newest)
    keys = got.keys["id"].to_pylist()
    assert dict(zip(keys, zip(got.gen.tolist(), got.addr.tolist(), got.dead.tolist()))) == newest
    for name, t in zip(names, tables):
        entry = got.entries_at(name, t[ROWADDR].to_numpy())
        if entry is None:
            continue
        for k, g, a, d, e in zip(
            t["id"].to_pylist(),
            t[GEN].to_pylist(),
            t[ROWADDR].to_pylist(),
            t[TOMBSTONE].to_pylist(),
            entry.tolist(),
        ):
            is_newest = newest[k] == (g, a, d) and not d
            assert (e >= 0) == is_newest and (e < 0 or keys[e] == k)


def test_the_first_count_after_a_large_write_sorts_no_keys_and_runs_no_aggregate(
    tmp_path, monkeypatch
):
    # A large write, unflushed, read at once: each key's newest row is found without a sort
    # (its integer keys span a dense range), the count reads the versions alone, so no key
    # set is built over the write's rows; a scan then builds one, once, and no hash
    # aggregate runs (counted: KeySets built over the write's rows, aggregates run).
    import memwal_sql as mw
    from memwal_sql.structures import keyset as keyset_module

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    tbl = mw.create_table(str(tmp_path), schema, primary_key="id")
    n = 40_000
    tbl.upsert(pa.table({"id": [1, 2, 3], "v": ["x", "y", "z"]}, schema=schema))
    tbl.upsert(pa.table({"id": np.arange(n), "v": ["a"] * n}, schema=schema))
    tbl.delete([5])
    built, aggregates = [], []
    real_init = keyset_module.KeySet.__init__

    def init(self, keys):
        built.append(keys.num_rows)
        real_init(self, keys)

    monkeypatch.setattr(keyset_module.KeySet, "__init__", init)
    monkeypatch.setattr(
        keyset_module,
        "last_per_key",
        lambda *a: aggregates.append(1) or (_ for _ in ()).throw(AssertionError("aggregate")),
    )
    import exec_nodes.dedup as dedup_module

    monkeypatch.setattr(dedup_module, "last_per_key", keyset_module.last_per_key)
    assert tbl.count_rows() == n - 1
    assert aggregates == []
    assert [b for b in built if b >= n - 1] == []
    got = tbl.to_arrow(filter="id < 10").sort_by("id")
    assert got.column("id").to_pylist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert set(got.column("v").to_pylist()) == {"a"}  # the newer write's rows won
    assert aggregates == []
    assert len([b for b in built if b >= n - 1]) <= 1
    tbl.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=300), st.integers(0, 2))
def test_renumbering_the_kept_rows_is_their_running_count(keep, dense):
    from exec_nodes.dedup import _renumbered

    mask = np.array(keep, dtype=bool)
    if dense:  # the few-dropped branch: at most one row in 64 dropped
        mask[:] = True
        mask[:: 64 * dense + 1][1:] = False
    want = np.where(mask, np.cumsum(mask) - 1, -1)
    assert _renumbered(mask).tolist() == want.tolist()


def test_a_count_reads_each_newer_source_once_and_checks_no_row_by_address(tmp_path, monkeypatch):
    # count(*) counts the live versions: the key columns each source gave them are all it
    # reads (counted: source reads, address indexes built), and it agrees with the rows a
    # scan returns across the base, a generation and a MemTable with updates and deletes.
    import memwal_sql as mw
    from exec_nodes import dedup as dedup_module
    from exec_nodes.source import SourceLeaf

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    tbl = mw.create_table(
        str(tmp_path),
        pa.table({"id": np.arange(100), "v": ["b"] * 100}, schema=schema),
        primary_key="id",
    )
    tbl.upsert(pa.table({"id": np.arange(50, 150), "v": ["g"] * 100}, schema=schema))
    tbl.flush()
    tbl.upsert(pa.table({"id": np.arange(140, 160), "v": ["m"] * 20}, schema=schema))
    tbl.delete([3, 60, 145, 155, 999])
    reads, built = [], []
    real_read, real_built = SourceLeaf.read_counted, dedup_module._ByAddress._built

    def read_counted(self, *a, **kw):
        reads.append(type(self).__name__)
        return real_read(self, *a, **kw)

    def address_index(self):
        built.append(1)
        return real_built(self)

    monkeypatch.setattr(SourceLeaf, "read_counted", read_counted)
    monkeypatch.setattr(dedup_module._ByAddress, "_built", address_index)
    assert tbl.count_rows() == 160 - 4
    assert sorted(reads) == ["GenerationSourceExec", "MemTableSourceExec"]
    assert built == []
    rows = tbl.to_arrow()
    assert rows.num_rows == 156 and built  # a scan does check rows by address
    tbl.close()


@pytest.mark.parametrize("type_", [pa.int8(), pa.uint8(), pa.int64(), pa.uint64()])
def test_newest_rows_of_a_dense_key_of_any_integer_type(type_):
    from exec_nodes.dedup import _dense_newest

    # Keys of every integer width and sign, offsets from the smallest past the key's own
    # type (int8: 60 is offset 160 from -100): each key's newest row, one per key.
    signed = type_.id in (pa.int8().id, pa.int64().id)
    values = [-100, 60, -100, -35, 60] if signed else [0, 200, 0, 45, 200]
    keep = _dense_newest(pa.table({"id": pa.array(values, type_)}), lambda at: at)
    assert keep.tolist() == [False, False, True, True, True]
    # A key spread too far for an array over its range: the caller sorts instead.
    assert _dense_newest(pa.table({"id": pa.array([0, 10**6], pa.int64())}), lambda at: at) is None
