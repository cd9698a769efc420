"""Point lookups against the model, what they touch, and SQL taking the lookup plan."""

from __future__ import annotations

import tempfile
import threading

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from exec_nodes.base_source import BaseSourceExec, fragment_rows_key
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.lookup import BloomFilterGuardExec
from exec_nodes.memtable_source import MemTableSourceExec
from memwal_sql.structures.cache import LookupCache, default_caches
from planner.lookup import LookupPlan
from tests.lsm import apply_op, cache_budget, op_sequences, seeded_table

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
COMPOSITE = pa.schema(
    [pa.field("a", pa.string(), False), pa.field("b", pa.int32(), False), pa.field("v", pa.int64())]
)

ops = op_sequences(
    25, 8, ["flush", "close", "crash", "reopen", "merge", "gc", "reindex", "catchup", "compact"]
)


def batch(ks, seed):
    return pa.table({"k": ks, "v": [f"v{k}-{seed}" for k in ks]}, schema=SCHEMA)


def check(tbl, model, probe):
    got = tbl.lookup(probe)
    want = [model.rows[(k,)] for k in probe if (k,) in model.rows]
    assert got.to_pylist() == want
    ctx = mw.connect()
    ctx.register("t", tbl)
    # pyarrow prints (and so hands over) at most 20 IN values; longer lists are scanned.
    for part in (probe[:20], probe[20:]):
        sql = ctx.sql(f"SELECT * FROM t WHERE k IN ({', '.join(map(str, part))}) ORDER BY k")
        assert sql.to_pylist() == sorted([r for r in want if r["k"] in part], key=lambda r: r["k"])
        assert isinstance(ctx.last_plan("t"), LookupPlan)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, bucketed=st.booleans(), cache=st.sampled_from(["default", "tight", "off"]))
def test_lookups_match_the_model(ops, bucketed, cache):
    """With the lookup cache (small generations and base fragments whole, the base key index,
    reused across base versions and growing MemTables), with one so tight that only some
    fragments fit whole (the rest taken at random), and without it (btree, ``_take_rows``)."""
    budget = {"default": default_caches().max_bytes, "tight": 12 << 10, "off": 0}[cache]
    with tempfile.TemporaryDirectory() as d, cache_budget(budget):
        tbl, model = seeded_table(
            d,
            batch(list(range(0, 26, 2)), 0),
            "k",
            buckets=3 if bucketed else None,
            max_memtable_rows=5,
        )
        for op, ks, seed in ops:
            tbl = apply_op(tbl, model, op, ks, seed, d, batch)
            got = {r["k"]: r for r in tbl.lookup(ks).to_pylist()}
            assert got == {k: model.rows[(k,)] for k in ks if (k,) in model.rows}
        probe = list(range(27))  # present, absent, deleted and re-inserted keys
        check(tbl, model, probe)
        check(mw.open_table(d), model, probe)  # another handle: WAL tails
        tbl.close()


def test_lookup_cache_stays_within_its_budget_and_evicts_oldest():
    c = LookupCache(100)
    assert c.get("k", "a", lambda: ("A", 40)) == "A"
    assert c.get("k", "b", lambda: ("B", 40)) == "B"
    assert c.get("k", "a", lambda: ("stale", 40)) == "A"  # a hit: "a" is now the newest
    assert c.get("k", "c", lambda: ("C", 40)) == "C"  # evicts "b", the least recently used
    assert c.nbytes == 80
    assert c.get("k", "b", lambda: ("B2", 40)) == "B2"
    assert c.get("k", "x", lambda: ("huge", 101)) == "huge" and c.nbytes <= 100  # not kept
    assert c.get("k", "c", lambda: ("C2", 40), current=lambda v: False) == "C2"  # refreshed


def test_composite_keys(tmp_path):
    rows = pa.table({"a": ["x", "x", "y"], "b": [1, 2, 1], "v": [1, 2, 3]}, schema=COMPOSITE)
    tbl = mw.create_table(
        str(tmp_path), rows, primary_key=["a", "b"], region_spec=mw.RegionSpec.bucket("a", 2)
    )
    tbl.upsert(pa.table({"a": ["x"], "b": [2], "v": [20]}, schema=COMPOSITE))
    tbl.flush()
    tbl.delete(pa.table({"a": ["y"], "b": [1]}))
    tbl.upsert(pa.table({"a": ["z"], "b": [9], "v": [90]}, schema=COMPOSITE))
    probe = pa.table({"a": ["z", "y", "x", "x", "q"], "b": [9, 1, 2, 1, 1]})
    assert tbl.lookup(probe).to_pylist() == [
        {"a": "z", "b": 9, "v": 90},
        {"a": "x", "b": 2, "v": 20},
        {"a": "x", "b": 1, "v": 1},
    ]
    ctx = mw.connect()
    ctx.register("t", tbl)
    assert ctx.sql("SELECT v FROM t WHERE a = 'x' AND b = 2").to_pydict() == {"v": [20]}
    assert isinstance(ctx.last_plan("t"), LookupPlan)
    tbl.close()


def test_lookup_returns_the_keys_and_aligns_with_the_input_on_request(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch([1, 2, 3], 0), primary_key="k")
    tbl.upsert(batch([4], 1))
    tbl.delete([2])
    # Default: the key columns always, one row per distinct key found, first-occurrence order.
    got = tbl.lookup([4, 2, 1, 4, 99], columns=["v"])
    assert got.column_names == ["k", "v"]
    assert got.to_pylist() == [{"k": 4, "v": "v4-1"}, {"k": 1, "v": "v1-0"}]
    # align=True: one row per input key, in place; a missing (or deleted) key has nulls and
    # _found false, so it differs from a row whose values are null.
    tbl.upsert(pa.table({"k": [5], "v": [None]}, schema=SCHEMA))
    aligned = tbl.lookup([4, 2, 1, 4, 99, 5], columns=["v"], align=True)
    assert aligned.schema == pa.schema(
        [SCHEMA.field("k"), SCHEMA.field("v"), pa.field("_found", pa.bool_(), False)]
    )
    assert aligned.to_pylist() == [
        {"k": 4, "v": "v4-1", "_found": True},
        {"k": 2, "v": None, "_found": False},
        {"k": 1, "v": "v1-0", "_found": True},
        {"k": 4, "v": "v4-1", "_found": True},
        {"k": 99, "v": None, "_found": False},
        {"k": 5, "v": None, "_found": True},
    ]
    assert tbl.lookup(pa.array([], pa.int64()), align=True).num_rows == 0
    # Composite keys, keys named ahead of the columns asked for.
    rows = pa.table({"a": ["x", "y"], "b": [1, 1], "v": [1, 2]}, schema=COMPOSITE)
    comp = mw.create_table(str(tmp_path / "c"), rows, primary_key=["a", "b"])
    probe = pa.table({"a": ["y", "q", "x"], "b": [1, 1, 1]})
    assert comp.lookup(probe, columns=["v", "a"], align=True).to_pylist() == [
        {"a": "y", "b": 1, "v": 2, "_found": True},
        {"a": "q", "b": 1, "v": None, "_found": False},
        {"a": "x", "b": 1, "v": 1, "_found": True},
    ]
    tbl.close()


def _nodes(plan):
    out = []
    for coalesce in plan.root.regions:
        out.extend(coalesce.children)
    return out


def test_a_hit_in_the_newest_memtable_opens_nothing_older(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch([1, 2, 3], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1, 2], 1))
        w.flush()
        w.upsert(batch([1], 2))
        assert tbl.lookup([1]).to_pylist() == [{"k": 1, "v": "v1-2"}]
        plan = tbl._reads.last_lookup_plan
        memtable, guarded = _nodes(plan)
        assert isinstance(memtable, MemTableSourceExec) and memtable.probes == 1
        assert isinstance(guarded, BloomFilterGuardExec)
        assert guarded.passed == 0 and guarded.skipped == 0 and guarded.child.probes == 0
        assert plan.base.probes == 0


def _four_generations(tmp_path, *late):
    """Key 1000 in the base; keys 0-199 in four generations of 50 (then ``late`` batches)."""
    tbl = mw.create_table(
        str(tmp_path),
        batch([1000], 0),
        primary_key="k",
        writer_config=mw.WriterConfig(max_memtable_rows=50),
    )
    with tbl.writer() as w:
        for i in range(4):
            w.upsert(batch(list(range(i * 50, i * 50 + 50)), i))
        for b in late:
            w.upsert(b)
    return tbl


def test_a_key_every_bloom_filter_rules_out_touches_only_the_base_index(tmp_path):
    tbl = _four_generations(tmp_path)
    assert tbl.lookup([1000]).to_pylist() == [{"k": 1000, "v": "v1000-0"}]
    plan = tbl._reads.last_lookup_plan
    guards = [n for n in _nodes(plan) if isinstance(n, BloomFilterGuardExec)]
    assert len(guards) == 4
    assert all(g.skipped == 1 and g.child.probes == 0 for g in guards)
    assert isinstance(plan.base, BaseSourceExec) and plan.base.probes == 1
    assert "btree=yes" in plan.base.describe()


def test_batched_lookup_probes_each_source_once(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        batch(list(range(5000)), 0),
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
    )
    tbl.upsert(batch(list(range(0, 5000, 3)), 1))
    tbl.flush()
    tbl.upsert(batch(list(range(0, 5000, 7)), 2))
    got = tbl.lookup(list(range(4000, -1, -1)))
    assert got.num_rows == 4001
    assert got.column("k").to_pylist() == list(range(4000, -1, -1))
    plan = tbl._reads.last_lookup_plan
    assert all(
        n.probes <= 1
        for n in _nodes(plan)
        if isinstance(n, (GenerationSourceExec, MemTableSourceExec))
    )
    assert all(g.child.probes <= 1 for g in _nodes(plan) if isinstance(g, BloomFilterGuardExec))
    assert plan.base.probes == 1
    tbl.close()


def test_lookups_while_a_writer_writes(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="k", writer_config=mw.WriterConfig(max_memtable_rows=200)
    )
    acked: dict[int, int] = {}
    lock = threading.Lock()

    def write():
        for v in range(1, 150):
            ks = [(v * 11 + j) % 300 for j in range(10)]
            tbl.upsert(batch(ks, v))
            with lock:
                acked.update(dict.fromkeys(ks, v))

    t = threading.Thread(target=write)
    t.start()
    while t.is_alive():
        with lock:
            before = dict(acked)
        got = {r["k"]: int(r["v"].split("-")[1]) for r in tbl.lookup(list(range(300))).to_pylist()}
        for k, v in before.items():
            assert got.get(k, -1) >= v
    t.join()
    tbl.close()


def test_base_rows_come_back_in_key_order_across_cached_and_taken_fragments(tmp_path):
    """Keys spread over several base fragments, some kept whole in the cache and some too big
    (taken at random): every row must come back with its own key."""
    import random

    rnd = random.Random(7)
    noise = [rnd.randbytes(48).hex() for _ in range(4000)]  # incompressible: big fragments
    big = pa.table(
        {"k": list(range(4000)), "v": [f"big{k}-{noise[k]}" for k in range(4000)]}, schema=SCHEMA
    )
    mw.create_table(str(tmp_path), big.slice(0, 2000), primary_key="k")
    import lance

    lance.write_dataset(big.slice(2000), str(tmp_path), mode="append")  # a second big fragment
    lance.write_dataset(batch([9000, 9001], 1), str(tmp_path), mode="append")  # a small one
    probe = [3999, 5, 9001, 2000, 1999, 9000, 0, 2500]
    want = [{"k": k, "v": f"big{k}-{noise[k]}" if k < 4000 else f"v{k}-1"} for k in probe]
    only_big = [k for k in probe if k < 4000]
    ds = lance.dataset(str(tmp_path))
    sizes = _stored_sizes(ds)
    # Too small for a big fragment (a 16th of it each), big enough for all of them (3x their
    # stored size and the key index in half of it): only the small fragment is read whole.
    small_only = 16 * min(sizes[:2]) - 16
    assert 3 * sum(sizes) + 16 * ds.count_rows() <= small_only // 2
    budgets = {
        "all whole": (default_caches().max_bytes, [True, True, True]),
        "the small one whole": (small_only, [False, False, True]),
        "btree": (0, [False, False, False]),
    }
    for budget, whole in budgets.values():
        # Caches of its own, of this budget, for each handle.
        reopened = mw.open_table(str(tmp_path), cache=budget)
        assert reopened.lookup(probe).to_pylist() == want
        assert _kept_whole(ds, reopened.caches) == whole
        assert reopened.lookup(only_big).to_pylist() == [r for r in want if r["k"] < 4000]
        for keys in (probe, only_big):  # row addresses name each row's own place
            rows = reopened.lookup(keys, with_system_columns=True)
            assert rows.column("_rowaddr").to_pylist() == [
                (k // 2000 << 32) + k % 2000 if k < 4000 else (2 << 32) + k - 9000 for k in keys
            ]


def _stored_sizes(ds) -> list[int]:
    """Bytes of each fragment's data files."""
    return [sum(f.file_size_bytes for f in fr.data_files()) for fr in ds.get_fragments()]


def _kept_whole(ds, caches) -> list[bool]:
    """Which fragments of ``ds`` the lookup cache of ``caches`` holds whole."""
    return [
        caches.lookup.peek("rows", fragment_rows_key(ds.uri, fr)) is not None
        for fr in ds.get_fragments()
    ]


def test_a_base_too_big_for_the_cache_as_a_whole_is_taken_at_random(tmp_path):
    """Each fragment alone is small enough to keep whole, all of them are not: a lookup of
    keys in every fragment would evict what the next needs, so none is kept and the rows are
    taken at random (and come back right)."""
    import random

    import lance

    rnd = random.Random(3)
    rows = pa.table(
        {"k": list(range(4000)), "v": [rnd.randbytes(32).hex() for _ in range(4000)]},
        schema=SCHEMA,
    )
    mw.create_table(str(tmp_path), rows.slice(0, 500), primary_key="k")
    for start in range(500, 4000, 500):  # eight fragments
        lance.write_dataset(rows.slice(start, 500), str(tmp_path), mode="append")
    ds = lance.dataset(str(tmp_path))
    sizes = _stored_sizes(ds)
    each_fits = 16 * max(sizes) + 16
    in_memory = 3 * sum(sizes) + 16 * ds.count_rows()
    assert in_memory > each_fits // 2  # but not all of them
    keys = list(range(7, 4000, 250))  # two keys in every fragment
    want = rows.take(keys).to_pylist()
    for budget, whole in ((each_fits, False), (2 * in_memory + 16, True)):
        # Caches of its own, of this budget, for each handle.
        table = mw.open_table(str(tmp_path), cache=budget)
        for _ in range(2):
            assert table.lookup(keys).to_pylist() == want
        assert _kept_whole(ds, table.caches) == [whole] * len(sizes)


def test_keys_a_region_resolved_never_come_from_the_base_when_not_routable(tmp_path):
    """A spec on a non-key column cannot route keys, so every region is asked; a key one
    region updated or deleted must not also be answered by the (older) base table."""
    tbl = mw.create_table(
        str(tmp_path),
        pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "tenant": pa.array([0, 1, 2], pa.int32()),
                "v": ["a", "b", "c"],
            }
        ),
        primary_key="id",
        region_spec=mw.RegionSpec.identity("tenant"),
        allow_non_key_region_spec=True,
    )
    tbl.upsert(
        pa.table({"id": pa.array([1], pa.int64()), "tenant": pa.array([0], pa.int32()), "v": ["A"]})
    )
    tbl.delete(pa.table({"id": pa.array([2], pa.int64()), "tenant": pa.array([1], pa.int32())}))
    want = {"id": [1, 3], "tenant": [0, 2], "v": ["A", "c"]}
    assert tbl.lookup([1, 2, 3]).to_pydict() == want
    tbl.flush()
    assert tbl.lookup([1, 2, 3]).to_pydict() == want
    ctx = mw.connect()
    ctx.register("t", tbl)
    assert ctx.sql("SELECT * FROM t WHERE id IN (1, 2, 3) ORDER BY id").to_pydict() == want
    assert isinstance(ctx.last_plan("t"), LookupPlan)
    tbl.close()


def test_a_region_looked_up_again_and_again_switches_to_its_merged_key_index(tmp_path):
    from planner.lookup import HOT_REGION_LOOKUPS

    tbl = _four_generations(tmp_path, batch([7], 9))  # newer than generation 1's key 7
    kinds = []
    for k in [1000, 60, 7, 199, 1000, 60, 7, 199]:
        want = {1000: "v1000-0", 60: "v60-1", 7: "v7-9", 199: "v199-3"}[k]
        assert tbl.lookup([k]).to_pylist() == [{"k": k, "v": want}]
        kinds.append({type(n).__name__ for n in _nodes(tbl._reads.last_lookup_plan)})
    # The first lookups test a bloom filter per generation; later ones probe the merged index.
    assert all(k == {"BloomFilterGuardExec"} for k in kinds[:HOT_REGION_LOOKUPS])
    assert all(k == {"GenerationIndexExec"} for k in kinds[HOT_REGION_LOOKUPS:])
    tbl.close()


def test_a_big_base_is_probed_through_its_btree_while_its_key_index_builds_in_the_background(
    tmp_path, monkeypatch
):
    # The first lookup or scan after an open must not read every base key first: it goes
    # through the btree, and the key index is built beside it for the queries after.
    import exec_nodes.base_source as base_source

    monkeypatch.setattr(base_source, "BACKGROUND_KEY_INDEX_ROWS", 1000)
    monkeypatch.setattr(base_source, "FEW_KEYS", 0)  # every lookup asks for the index here
    uri = str(tmp_path)
    with mw.create_table(uri, batch(list(range(3000)), 0), primary_key="k") as t:
        t.upsert(batch(list(range(0, 3000, 5)), 1))
        t.flush()
        t.delete(list(range(1, 3000, 7)))
        t.flush()
    latest = {k: f"v{k}-{1 if k % 5 == 0 else 0}" for k in range(3000) if k % 7 != 1}
    keys = [0, 1, 5, 8, 2999, 4000]
    want = [{"k": k, "v": latest[k]} for k in keys if k in latest]
    gate = threading.Event()
    monkeypatch.setattr(
        BaseSourceExec, "_load_key_index", _held(BaseSourceExec._load_key_index, gate)
    )
    tbl = mw.open_table(uri, cache=64 << 20)
    assert tbl.lookup(keys).to_pylist() == want
    plan = tbl._reads.last_lookup_plan
    assert not plan.base.uses_key_index() and "via btree" in plan.base.describe()
    assert "base_keys" not in {kind for kind, _ in tbl.caches.lookup.entries()}
    assert not base_source._building  # one query builds nothing: a CLI call never waits for it
    scanned = tbl.to_arrow().sort_by("k").to_pylist()  # superseded rows dropped batch by batch
    assert base_source._building  # the second query started the build
    assert scanned == [{"k": k, "v": v} for k, v in sorted(latest.items())]
    gate.set()
    base_source._KEY_INDEX_BUILDS.submit(lambda: None).result()  # after the build it queued
    assert "base_keys" in {kind for kind, _ in tbl.caches.lookup.entries()}
    assert tbl.lookup(keys).to_pylist() == want
    plan = tbl._reads.last_lookup_plan
    assert plan.base.uses_key_index() and "cached key index" in plan.base.describe()
    assert tbl.to_arrow().sort_by("k").to_pylist() == scanned
    tbl.close()


def test_lookups_of_a_few_keys_never_build_a_big_bases_key_index(tmp_path, monkeypatch):
    # Through the btree a few keys cost about what the key index costs them: they do not ask
    # for a build (a read of every key). A batch of FEW_KEYS keys, asked twice, does.
    import exec_nodes.base_source as base_source

    monkeypatch.setattr(base_source, "BACKGROUND_KEY_INDEX_ROWS", 1000)
    uri = str(tmp_path)
    with mw.create_table(uri, batch(list(range(3000)), 0), primary_key="k") as t:
        t.upsert(batch(list(range(0, 3000, 5)), 1))
        t.flush()
    builds: list[int] = []
    load = BaseSourceExec._load_key_index
    monkeypatch.setattr(
        BaseSourceExec, "_load_key_index", lambda self: builds.append(1) or load(self)
    )
    tbl = mw.open_table(uri, cache=64 << 20)
    for k in range(10):
        assert tbl.lookup([k * 7]).to_pylist() == [
            {"k": k * 7, "v": f"v{k * 7}-{1 if k * 7 % 5 == 0 else 0}"}
        ]
        assert "via btree" in tbl._reads.last_lookup_plan.base.describe()
    base_source._KEY_INDEX_BUILDS.submit(lambda: None).result()
    assert builds == [] and not base_source._building
    many = list(range(100, 100 + base_source.FEW_KEYS))
    for _ in range(2):
        assert len(tbl.lookup(many)) == len(many)
    base_source._KEY_INDEX_BUILDS.submit(lambda: None).result()  # after the build it queued
    assert builds == [1]
    assert tbl.lookup([7]).num_rows == 1
    assert "cached key index" in tbl._reads.last_lookup_plan.base.describe()
    tbl.close()


def _held(load, gate):
    """``load``, waiting for ``gate`` first: the background build is held while it is open."""

    def held(self):
        assert gate.wait(30)
        return load(self)

    return held
