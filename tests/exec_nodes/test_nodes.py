"""Every exec node on tiny hand-built inputs: the one operator contract (schema, children,
``execute()`` yielding batches of ``schema``, ``explain()``), and what each node does."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.base import EmptyExec, ExecNode
from exec_nodes.dedup import DeduplicateExec, newest_per_key
from exec_nodes.lookup import (
    BaseLookupExec,
    BloomFilterGuardExec,
    CoalesceFirstExec,
    GenerationIndexExec,
    PointLookupExec,
    TakeLastExec,
)
from exec_nodes.scan import BaseScanExec, FragmentRange, GenerationScanExec, MemTableScanExec
from memwal_sql.expressions.predicate import Compare, InList, Not
from memwal_sql.formats.generation import BLOOM_FILTER, write_generation
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    GEN,
    ROWADDR,
    TOMBSTONE,
    conform,
    source_schema,
)
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet, last_per_key

#: What the nodes under test cache in, as a table's caches would be.
CACHES = Caches()

BASE = pa.schema(
    [pa.field("id", pa.int64(), False), pa.field("v", pa.string()), pa.field("f", pa.float64())]
)
WAL = pa.schema([*BASE, pa.field(TOMBSTONE, pa.bool_())])
SOURCE = source_schema(WAL)


def wal_rows(ids, v, dead=None, f=None):
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": [v] * n,
            "f": f if f is not None else [float(i) for i in ids],
            TOMBSTONE: dead if dead is not None else [False] * n,
        },
        schema=WAL,
    )


def check_contract(node: ExecNode, want_rows: int | None = None) -> pa.Table:
    """What every node promises: batches of exactly its schema, and a tree it can explain."""
    batches = list(node.execute())
    assert all(b.schema.equals(node.schema) for b in batches), node.name
    lines = node.explain().splitlines()
    assert lines[0].lstrip().startswith(node.name)
    assert len(lines) >= 1 + len(node.children)
    table = pa.Table.from_batches(batches, schema=node.schema)
    if want_rows is not None:
        assert table.num_rows == want_rows
    return table


@pytest.fixture
def base(tmp_path):
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "v": ["b1", "b2", "b3", None],
            "f": [1.0, -0.0, float("nan"), None],
        },
        schema=BASE,
    )
    return lance.write_dataset(table, str(tmp_path / "base"))


@pytest.fixture
def generation(tmp_path):
    store = ObjectStore(str(tmp_path / "table"))
    rows = conform(wal_rows([2, 3, 5], "g1", dead=[False, True, False]), WAL)
    entry = write_generation(
        store, "r", 1, rows, ["id"], data_storage_version="stable", in_memory_bytes=rows.nbytes
    )
    return store, store.uri_for(f"_mem_wal/r/{entry.path}"), f"_mem_wal/r/{entry.path}"


def test_conform_casts_fills_and_keeps_the_row_count():
    t = pa.table({"id": pa.array([1, 2], pa.int32()), GEN: pa.array([9, 9], pa.int64())})
    out = conform(t, SOURCE, generation=4)
    assert out.schema.equals(SOURCE)
    assert out.column(GEN).to_pylist() == [4, 4] and out.column(ROWADDR).to_pylist() == [0, 1]
    assert out.column(TOMBSTONE).to_pylist() == [False, False]
    assert out.column("v").null_count == 2
    assert conform(t, SOURCE).column(GEN).to_pylist() == [9, 9]  # kept when not given
    assert conform(t, pa.schema([])).num_rows == 2


def test_empty_exec():
    check_contract(EmptyExec(BASE), want_rows=0)


def test_keyset_and_last_per_key():
    s = KeySet(pa.table({"a": ["x", "y"], "b": [1, 2]}))
    assert s.positions(pa.table({"a": ["y", "x", "x"], "b": [2, 2, 1]})).tolist() == [1, -1, 0]
    keys, best = last_per_key(pa.table({"id": [5, 7, 5]}), np.array([10, 3, 20]))
    assert dict(zip(keys.column("id").to_pylist(), best.tolist())) == {5: 20, 7: 3}


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(-50, 50), unique=True),
    probes=st.lists(st.integers(-80, 80), max_size=200),
    kind=st.sampled_from(["int", "composite", "string"]),
)
def test_keyset_positions_match_a_dict(keys, probes, kind):
    """Integer, packed composite and hashed string keys, probes below, inside and above the
    set's range (the search is confined to the probes' window of the set); a set built by
    ``indexing`` finds each probe's value."""

    def table(values):
        if kind == "string":
            return pa.table({"k": pa.array([f"k{v}" for v in values], pa.string())})
        cols = {"k": pa.array(values, pa.int64())}
        if kind == "composite":
            cols["j"] = pa.array([v % 3 for v in values], pa.int32())
        return pa.table(cols)

    where = {k: i for i, k in enumerate(keys)}
    got = KeySet(table(keys)).positions(table(probes)).tolist()
    assert got == [where.get(p, -1) for p in probes]
    s, values = KeySet.indexing(table(keys), np.array(keys, dtype=np.int64) * 10)
    pos = s.positions(table(probes))
    assert [int(values[i]) if i >= 0 else None for i in pos] == [
        p * 10 if p in where else None for p in probes
    ]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    spread=st.sampled_from([10_000, 1 << 20, 1 << 40]),  # dense, sparse, too wide for bits
    composite=st.booleans(),
    probe_dtype=st.sampled_from([pa.int64(), pa.int32()]),
)
def test_keyset_contains_of_big_sets_matches_numpy(seed, spread, composite, probe_dtype):
    """Sets and probe batches big enough for the membership bitset, keys of the set at its
    edges, probes outside its range and outside a composite key's packed range."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-spread, spread, 6000))
    keys = np.concatenate([keys, keys[::7]])  # a key set may hold a key twice
    probes = np.concatenate([rng.choice(keys, 3000), rng.integers(-2 * spread, 2 * spread, 3000)])
    if probe_dtype == pa.int32():
        keys, probes = keys // (1 << 12), probes // (1 << 12)

    def table(values):
        cols = {"k": pa.array(values, probe_dtype)}
        if composite:
            cols["j"] = pa.array(np.abs(values) % 5, pa.int32())
        return pa.table(cols)

    got = KeySet(table(keys)).contains(table(probes))
    assert got.tolist() == np.isin(probes, keys).tolist()


def test_memtable_scan_reads_tagged_rows_and_applies_sql_semantics():
    rows = wal_rows([1, 2, 3, 4], "m", f=[1.0, 2.0, None, -0.0])
    node = MemTableScanExec("r", 7, rows.to_batches(), SOURCE, caches=CACHES)
    out = check_contract(node, want_rows=4)
    assert out.column(GEN).to_pylist() == [7] * 4 and out.column(ROWADDR).to_pylist() == [
        0,
        1,
        2,
        3,
    ]
    # NOT IN is NULL for a NULL value; -0.0 and 0.0 are apart in an IN list.
    got = node.read_counted(None, Not(InList("f", pa.array([2.0, 0.0, 8.0, 7.0]))))
    assert got.column("id").to_pylist() == [1, 4] and node.opened == 2


def test_generation_scan_reads_its_lance_dataset(generation):
    _, uri, _ = generation
    node = GenerationScanExec("r", 1, uri, SOURCE, caches=CACHES)
    out = check_contract(node, want_rows=3)
    assert out.column(GEN).to_pylist() == [1, 1, 1]
    assert out.column(TOMBSTONE).to_pylist() == [False, True, False]
    hit = node.read_counted(["id"], Compare("id", ">", pa.scalar(2)))
    assert hit.column("id").to_pylist() == [3, 5]


def test_base_scan_pushes_exact_filters_and_checks_the_rest_itself(base):
    exact = BaseScanExec(base, ["id"], Compare("v", "=", pa.scalar("b2")), caches=CACHES)
    assert exact.exact and check_contract(exact).column("id").to_pylist() == [2]
    # Lance would match -0.0 to 0.0 in an IN list; DataFusion's SQL does not.
    checked = BaseScanExec(base, ["id"], InList("f", pa.array([0.0, 5.0, 6.0, 7.0])), caches=CACHES)
    assert not checked.exact and check_contract(checked, want_rows=0).num_rows == 0
    assert "then InList" in checked.describe()


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
        MemTableScanExec(
            "r", 2, [wal_rows([1, 5], "m2", f=[0.5, 9.0]).to_batches()[0]], SOURCE, caches=CACHES
        ),
        GenerationScanExec("r", 1, uri, SOURCE, caches=CACHES),
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


def test_take_last_of_a_memtable_returns_the_newest_duplicate():
    batches = [wal_rows([1, 2], "old").to_batches()[0], wal_rows([1], "new").to_batches()[0]]
    node = TakeLastExec(
        "r",
        3,
        SOURCE,
        ["id"],
        batches=batches,
        keys=pa.table({"id": pa.array([1, 9], pa.int64())}),
        caches=CACHES,
    )
    rows = check_contract(node, want_rows=1).to_pylist()
    assert rows[0]["v"] == "new" and rows[0][ROWADDR] == 2
    probe = node.probe(pa.table({"id": pa.array([9, 2, 1], pa.int64())}))
    assert probe.hit.tolist() == [False, True, True]


def test_take_last_of_a_generation_uses_its_pk_index(generation):
    _, uri, _ = generation
    node = TakeLastExec(
        "r",
        1,
        SOURCE,
        ["id"],
        uri=uri,
        keys=pa.table({"id": pa.array([3, 4, 5], pa.int64())}),
        caches=CACHES,
    )
    rows = check_contract(node, want_rows=2).sort_by("id").to_pylist()
    assert [(r["id"], r[TOMBSTONE]) for r in rows] == [(3, True), (5, False)]


def test_bloom_filter_guard_passes_only_keys_the_filter_may_hold(generation):
    store, uri, path = generation
    child = TakeLastExec("r", 1, SOURCE, ["id"], uri=uri, caches=CACHES)
    keys = pa.table({"id": pa.array([2, *range(1000, 1100)], pa.int64())})
    guard = BloomFilterGuardExec(child, store, f"{path}/{BLOOM_FILTER}", keys=keys)
    rows = check_contract(guard, want_rows=1)
    assert rows.column("id").to_pylist() == [2]
    assert guard.passed >= 1 and guard.skipped > 90 and child.probes == 1


def test_coalesce_first_stops_at_the_newest_hit_and_a_tombstone_resolves():
    newest = TakeLastExec(
        "r",
        2,
        SOURCE,
        ["id"],
        batches=wal_rows([1, 2], "n", dead=[False, True]).to_batches(),
        caches=CACHES,
    )
    older = TakeLastExec(
        "r", 1, SOURCE, ["id"], batches=wal_rows([1, 2, 3], "o").to_batches(), caches=CACHES
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
            TakeLastExec(
                "r",
                1,
                SOURCE,
                ["id"],
                batches=wal_rows([1, 2], "m", dead=[False, True]).to_batches(),
                caches=CACHES,
            )
        ],
        ["id"],
        SOURCE,
        keys=pa.table({"id": pa.array([1, 2, 3, 9], pa.int64())}),
    )
    base_node = BaseLookupExec(base, SOURCE, ["id"], caches=CACHES)
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
            TakeLastExec(
                "r",
                gen,
                SOURCE,
                ["id"],
                uri=store.uri_for(f"_mem_wal/r/{entry.path}"),
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


def test_memtable_versions_are_reused_until_the_memtable_grows(tmp_path):
    import memwal_sql as mw
    from memwal_sql.read_snapshot import take_snapshot
    from planner.scan import plan_scan

    tbl = mw.create_table(
        str(tmp_path), wal_rows([1, 2, 3], "b").select(["id", "v", "f"]), primary_key="id"
    )
    tbl.upsert(wal_rows([2, 4], "m1").select(["id", "v", "f"]))

    def plan():
        return plan_scan(take_snapshot(tbl), tbl.region_spec, tbl.schema, None).root

    first, again = plan(), plan()
    assert first.versions()[1] is again.versions()[1]  # same MemTable rows: reused
    assert check_contract(again).sort_by("id").column("v").to_pylist() == ["b", "m1", "b", "m1"]
    tbl.upsert(wal_rows([1], "m2").select(["id", "v", "f"]))
    tbl.delete(pa.table({"id": [4]}))
    grown = plan()
    assert grown.versions()[1] is not first.versions()[1]
    assert check_contract(grown).sort_by("id").column("v").to_pylist() == ["m2", "m1", "b"]
    assert grown.num_partitions == 2  # one base part, then the newer rows


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
    keys, empty writes."""
    from memwal_sql.writer.memtable_indexes import KeysIndex

    schema = source_schema(
        pa.schema(
            [("a", pa.int64()), ("b", pa.string()), ("v", pa.int64()), (TOMBSTONE, pa.bool_())]
        )
    )
    index = KeysIndex(schema, 5, ["a", "b"])
    batches, latest, n = [], {}, 0
    probe = pa.table({"a": [a for a in range(13) for _ in "ab"], "b": ["a", "b"] * 13})
    for rows in writes:
        batches.append(
            pa.record_batch(
                {
                    "a": pa.array([a for a, _ in rows], pa.int64()),
                    "b": pa.array([b for _, b in rows], pa.string()),
                    "v": pa.array(range(n, n + len(rows)), pa.int64()),
                    TOMBSTONE: pa.array([False] * len(rows)),
                }
            )
        )
        for i, key in enumerate(rows):
            latest[key] = n + i
        n += len(rows)
        at = index.update(list(batches)).find(probe)
        want = [
            latest.get(k, -1)
            for k in zip(probe.column("a").to_pylist(), probe.column("b").to_pylist())
        ]
        assert at.tolist() == want
        assert len(index._runs) <= max(1, n).bit_length() + 1
        found = at[at >= 0]
        if len(found):
            got = index.take(found)
            assert got.column("v").to_pylist() == found.tolist()  # v is the row number
            assert got.column(ROWADDR).to_pylist() == found.tolist()
            assert set(got.column(GEN).to_pylist()) == {5}
    # Batches that do not extend what the index saw (another MemTable's): it starts over.
    other = [pa.record_batch({"a": [3], "b": ["a"], "v": [0], TOMBSTONE: [False]})]
    at = index.update(other).find(pa.table({"a": [3, 4], "b": ["a", "a"]}))
    assert at.tolist() == [0, -1]


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


@settings(max_examples=25, deadline=None)
@given(
    deleted=st.sets(st.integers(0, 199), max_size=60),
    start=st.integers(0, 99),
    length=st.one_of(st.none(), st.integers(0, 120)),
    threshold=st.integers(-1, 200),
)
def test_base_scan_reads_fragments_with_deletion_vectors_from_their_files(
    tmp_path_factory, deleted, start, length, threshold
):
    # Two fragments of 100 rows; deleted rows get a deletion vector, which Lance's scanner
    # reads slowly, so BaseScanExec reads such a fragment's data file and drops them itself.
    ids = np.arange(200, dtype=np.int64)
    rows = pa.table({"id": ids, "v": [f"s{i}" for i in ids], "f": ids / 2.0})
    ds = lance.write_dataset(rows, str(tmp_path_factory.mktemp("dv") / "t"), max_rows_per_file=100)
    if deleted:
        ds.delete(f"id IN ({', '.join(map(str, sorted(deleted)))})")

    def lance_rows(columns, flt=None):
        t = ds.to_table(columns=columns, filter=flt, with_row_address=True)
        return t.sort_by(ROWADDR).column(ROWADDR).to_pylist(), t.select(columns).to_pylist()

    def ours(node):
        t = check_contract(node).sort_by(ROWADDR)
        return t.column(ROWADDR).to_pylist(), t.select(node.columns).to_pylist()

    whole = BaseScanExec(ds, ["v", "id"], None, caches=CACHES)
    assert [whole._direct_file(f) is not None for f in ds.get_fragments()] == [
        any(d // 100 == i for d in deleted) for i in range(2)
    ]
    assert ours(whole) == lance_rows(["v", "id"])
    exact = BaseScanExec(ds, ["v"], Compare("id", "<", pa.scalar(threshold)), caches=CACHES)
    assert exact.exact and ours(exact) == lance_rows(["v"], f"id < {threshold}")
    # Lance would match -0.0 to 0.0 in an IN list: the scan evaluates it on every column.
    checked = BaseScanExec(
        ds, ["id"], InList("f", pa.array([0.0, 1.5, threshold / 2.0])), caches=CACHES
    )
    assert not checked.exact
    want = [i for i in (0, 3, threshold) if 0 <= i < 200 and i not in deleted]
    assert sorted(check_contract(checked).column("id").to_pylist()) == sorted(set(want))
    counted = BaseScanExec(ds, [], Compare("id", ">=", pa.scalar(threshold)), caches=CACHES)
    assert ours(counted)[0] == lance_rows(["id"], f"id >= {threshold}")[0]
    # A row range of the first fragment (what a Spark partition reads) and the whole second.
    end = None if length is None else min(100, start + 1 + length)
    part = BaseScanExec(
        ds, ["id"], None, ranges=[FragmentRange(0, start, end), FragmentRange(1)], caches=CACHES
    )
    stop = 100 if end is None else end
    want_ids = [i for i in range(start, stop) if i not in deleted]
    want_ids += [i for i in range(100, 200) if i not in deleted]
    assert sorted(check_contract(part).column("id").to_pylist()) == want_ids


def test_base_scan_reads_through_lance_a_changed_schema_or_an_indexed_filter(tmp_path):
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    ds = lance.write_dataset(rows, str(tmp_path / "t"))
    ds.delete("id = 2")
    ds.add_columns({"w": "id * 10"})  # a second data file
    node = BaseScanExec(ds, ["id", "w"], None, caches=CACHES)
    assert node._direct_file(ds.get_fragments()[0]) is None
    assert check_contract(node).select(["id", "w"]).to_pylist() == [
        {"id": 1, "w": 10},
        {"id": 3, "w": 30},
    ]
    indexed = lance.write_dataset(rows, str(tmp_path / "i"))
    indexed.delete("id = 2")
    indexed.create_scalar_index("id", "BTREE")
    by_index = BaseScanExec(indexed, ["v"], Compare("id", ">", pa.scalar(1)), caches=CACHES)
    assert by_index._direct_file(indexed.get_fragments()[0]) is None  # Lance uses the index
    assert check_contract(by_index).column("v").to_pylist() == ["c"]
    by_file = BaseScanExec(indexed, ["id"], Compare("v", ">", pa.scalar("a")), caches=CACHES)
    assert by_file._direct_file(indexed.get_fragments()[0]) is not None
    assert check_contract(by_file).column("id").to_pylist() == [3]
    renamed = lance.write_dataset(rows, str(tmp_path / "r"))
    renamed.delete("id = 2")
    renamed.alter_columns({"path": "v", "name": "x"})
    node = BaseScanExec(renamed, ["x"], None, caches=CACHES)
    assert node._direct_file(renamed.get_fragments()[0]) is None
    assert check_contract(node).column("x").to_pylist() == ["a", "c"]
