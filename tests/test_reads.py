"""LSM-merging reads against a model of "latest row per key", through every read path."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lance.mem_wal import LsmScanner

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError, SchemaMismatchError, StorageError
from memwal_sql.structures.cache import default_caches
from tests.lsm import Model, apply_op, cache_budget, lance_snapshots

SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), False),
        pa.field("grp", pa.string(), False),
        pa.field("n", pa.int32()),
        pa.field("s", pa.string()),
    ]
)

keys = st.lists(st.integers(0, 30), min_size=1, max_size=10, unique=True)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), keys, st.integers(0, 100)),
        st.tuples(st.just("delete"), keys, st.just(0)),
        st.tuples(
            st.sampled_from(["flush", "close", "crash", "reopen", "read", "merge", "compact"]),
            st.just([]),
            st.just(0),
        ),
    ),
    min_size=1,
    max_size=20,
)
FILTERS = [
    None,
    "k < 12",
    "k IN (3, 4, 17)",
    "n >= 50",
    "s = 's7'",
    "n IS NULL",
    "k > 5 AND n < 60",
    "grp = 'g1' OR n = 3",
]


def batch(ks, seed):
    return pa.table(
        {
            "k": ks,
            "grp": [f"g{k % 3}" for k in ks],
            "n": [None if (k + seed) % 5 == 0 else (k * 7 + seed) % 100 for k in ks],
            "s": [f"s{(k + seed) % 10}" for k in ks],
        },
        schema=SCHEMA,
    )


def expected(model: Model, filter: str | None, columns=None) -> pa.Table:
    table = model.table(SCHEMA)
    if filter and table.num_rows:
        ctx = mw.connect()  # the model's rows filtered by the same SQL, on a plain table
        ctx.register_record_batches("m", [table.to_batches()])
        got = ctx.sql(f"SELECT * FROM m WHERE {filter}").to_arrow_table()
        table = (
            pa.Table.from_batches(got.to_batches(), schema=SCHEMA)
            if got.num_rows
            else SCHEMA.empty_table()
        )
    if columns:
        table = table.select(columns)
    return table.sort_by([(c, "ascending") for c in table.column_names])


def check_reads(tbl: mw.MemWalTable, model: Model) -> None:
    for f in FILTERS:
        got = tbl.to_arrow(filter=f)
        assert got.sort_by([(c, "ascending") for c in got.column_names]) == expected(model, f), f
    got = tbl.to_arrow(["s", "k"], filter="k >= 10")
    assert got.sort_by([("s", "ascending"), ("k", "ascending")]) == expected(
        model, "k >= 10", ["s", "k"]
    )
    assert tbl.count_rows() == len(model.rows)
    assert tbl.count_rows("n > 40") == expected(model, "n > 40").num_rows
    assert tbl.lookup(list(range(31))).sort_by("k").to_pylist() == expected(model, None).to_pylist()
    sys_cols = tbl.to_arrow(["k"], with_system_columns=True)
    assert len(set(sys_cols.column("k").to_pylist())) == sys_cols.num_rows  # no duplicates


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops,
    spec=st.sampled_from(["bucket", "identity", "none"]),
    cached=st.booleans(),
    initial=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 100)), max_size=12),
)
def test_reads_match_the_model(ops, spec, cached, initial):
    """With the lookup cache (generations kept whole: their latest rows filtered as one
    table; the base masked by its key index) and without it (each generation read from
    Lance with the filter pushed; the base's keys probed per batch). The table is created
    with ``initial`` rows, whose keys repeat: as in one upsert, the last row of a key wins."""
    region_spec = {
        "bucket": mw.RegionSpec.bucket("k", 3),
        "identity": mw.RegionSpec.identity("grp"),
        "none": None,
    }[spec]
    with (
        tempfile.TemporaryDirectory() as d,
        cache_budget(default_caches().max_bytes if cached else 0),
    ):
        first = pa.concat_tables(
            [batch([0, 1, 2, 3], 1), *(batch([k], seed) for k, seed in initial)]
        )
        tbl = mw.create_table(
            d,
            first,
            primary_key="k",
            region_spec=region_spec,
            writer_config=mw.WriterConfig(max_memtable_rows=6),
            allow_non_key_region_spec=True,
        )
        model = Model(["k"])
        model.upsert(first)
        for op, ks, seed in ops:
            if op == "read":
                check_reads(tbl, model)
            else:
                tbl = apply_op(tbl, model, op, ks, seed, d, batch, delete_columns=["k", "grp"])
        check_reads(tbl, model)
        # Another handle on the table (as another process would) reads the WAL tails.
        check_reads(mw.open_table(d), model)
        tbl.close()


def test_system_columns_tag_sources(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch([1, 2, 3], 0), primary_key="k")
    tbl.upsert(batch([2], 5))
    tbl.flush()
    tbl.upsert(batch([3, 3], 9))
    got = {r["k"]: r["_gen"] for r in tbl.to_arrow(["k"], with_system_columns=True).to_pylist()}
    assert got == {1: -1, 2: 1, 3: 2}
    tbl.close()


def test_a_small_base_is_filtered_in_memory_from_its_second_filtered_scan(tmp_path):
    """The first filtered scan of a base version reads it through Lance; later ones evaluate
    the filter over its fragments kept whole in the lookup cache, read once, and return the
    same rows (superseded and deleted base rows left out)."""
    tbl = mw.create_table(str(tmp_path), batch(list(range(30)), 1), primary_key="k")
    tbl.upsert(batch([1, 2, 40], 3))
    tbl.flush()
    tbl.delete([4, 5])
    model = Model(["k"])
    model.upsert(batch(list(range(30)), 1))
    model.upsert(batch([1, 2, 40], 3))
    model.delete(pa.table({"k": pa.array([4, 5], pa.int64())}))
    ctx = mw.connect()
    ctx.register("t", tbl)
    for f in ["n >= 50 OR n IS NULL", "s = 's3' AND k < 20"]:
        in_memory = []
        for _ in range(3):
            got = ctx.sql(f"SELECT * FROM t WHERE {f}").to_arrow_table()
            assert got.sort_by("k") == expected(model, f), f
            in_memory.append("over whole fragments in memory" in ctx.last_plan("t").explain())
        assert in_memory == [False, True, True] if f.startswith("n") else [True] * 3
    kept = [uri for kind, uri in tbl.caches.lookup.entries() if kind == "rows"]
    assert any(uri.startswith(tbl.dataset().uri) for uri in kept)  # the base's one fragment
    with cache_budget(0):  # nothing kept whole: every scan goes through Lance
        other = mw.open_table(str(tmp_path))
        for _ in range(2):
            assert other.to_arrow(filter="n >= 50").sort_by("k") == expected(model, "n >= 50")
            assert "in memory" not in other.explain("n >= 50")
        other.close()
    tbl.close()


_CONDITIONS = st.sampled_from(
    ["k < 12", "n >= 50", "n IS NULL", "n IS NOT NULL", "s = 's7'", "n = 3", "grp <> 'g1'"]
)
_FILTERS = st.one_of(
    st.none(),
    _CONDITIONS,
    st.builds(
        lambda a, b, op: f"({a}) {op} ({b})",
        _CONDITIONS,
        _CONDITIONS,
        st.sampled_from(["AND", "OR"]),
    ),
    st.builds(lambda a: f"NOT ({a})", _CONDITIONS),
    st.sampled_from(["k = 3", "k IN (1, 4, 40)"]),  # point lookups
    st.builds(
        lambda a, like: f"({a}) AND {like}",
        _CONDITIONS,
        st.sampled_from(["s LIKE 's1%'", "s NOT LIKE '%3'", "grp LIKE 'g_'", "s LIKE '_'"]),
    ),
    st.sampled_from(["s LIKE 's1%' AND s NOT LIKE 's1_'", "s LIKE '%' OR n = 1"]),
    # DataFusion keeps these: ILIKE, an escape, a computed value
    st.sampled_from(["s ILIKE 'S1%'", "s LIKE 's\\_1'", "n + 1 > 30"]),
)


def _batch_nulls(ks, seed):
    """:func:`batch`, with ``s`` NULL in some rows (LIKE is NULL there)."""
    rows = batch(ks, seed)
    s = [None if (k + seed) % 4 == 0 else v for k, v in zip(ks, rows.column("s").to_pylist())]
    return rows.set_column(3, SCHEMA.field("s"), pa.array(s, pa.string()))


def _last_planned(reads):
    """The dataset DataFusion last planned a query of the table in (None: none yet)."""
    return None if reads._ctx is None else reads._ctx.memwal_schema.last_datasets.get("t_strong_0")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops,
    filters=st.lists(_FILTERS, min_size=1, max_size=4),
    columns=st.sampled_from([None, ["s", "k"], ["n"]]),
)
def test_to_arrow_without_datafusion_returns_what_datafusion_returns(ops, filters, columns):
    """A filter DataFusion pushes whole into the scan (but for plain LIKE conditions) is run
    by ``to_arrow`` without DataFusion from then on: the same rows (NULLs included) as the SQL
    query, and DataFusion plans nothing for it; a filter DataFusion keeps another part of still
    goes through DataFusion."""
    with tempfile.TemporaryDirectory() as d:
        tbl = mw.create_table(
            d,
            _batch_nulls(list(range(10)), 1),
            primary_key="k",
            writer_config=mw.WriterConfig(max_memtable_rows=6),
        )
        model = Model(["k"])
        ctx = mw.connect()
        ctx.register("t", tbl)
        for op, ks, seed in [*ops, ("read", [], 0)]:
            if op != "read":
                tbl = apply_op(
                    tbl, model, op, ks, seed, d, _batch_nulls, delete_columns=["k", "grp"]
                )
                ctx.register("t", tbl)
                continue
            for f in filters:
                select = "*" if columns is None else ", ".join(columns)
                sql = f"SELECT {select} FROM t" + ("" if f is None else f" WHERE {f}")
                want = ctx.sql(sql).to_arrow_table()
                tbl.to_arrow(columns, filter=f)  # DataFusion plans a filter the first time
                reads = tbl._reads
                planned = _last_planned(reads)
                got = tbl.to_arrow(columns, filter=f)
                unplanned = _last_planned(reads) is planned
                kept = f is not None and any(w in f for w in ("ILIKE", "\\", "+", " OR n"))
                assert unplanned != kept, f
                assert got.schema == want.schema, f
                order = [(c, "ascending") for c in got.column_names]
                assert repr(got.sort_by(order).to_pylist()) == repr(want.sort_by(order).to_pylist())
        tbl.close()


def test_like_conditions_are_null_for_null_values_without_datafusion(tmp_path):
    tbl = mw.create_table(str(tmp_path), _batch_nulls(list(range(12)), 0), primary_key="k")
    tbl.upsert(_batch_nulls([1, 2, 3], 1))
    ctx = mw.connect()
    ctx.register("t", tbl)
    for f in ["s LIKE 's%'", "s NOT LIKE 's1%'", "k < 8 AND s NOT LIKE '%9'"]:
        want = ctx.sql(f"SELECT k FROM t WHERE {f}").to_arrow_table().column("k").to_pylist()
        for _ in range(2):  # DataFusion's first planning, then without it
            got = tbl.to_arrow(["k"], filter=f).column("k").to_pylist()
            assert sorted(got) == sorted(want) and len(got) < tbl.count_rows(), f
    tbl.close()


def test_a_like_filter_reads_the_other_columns_of_its_matching_rows_only(tmp_path, monkeypatch):
    """The scan reads the keys and the LIKE's column; only the keys that match are looked up
    for the other columns, in the scan's snapshot (a write in between is not seen), unless
    more than a quarter of the rows match."""
    from memwal_sql import reads

    tbl = mw.create_table(str(tmp_path), batch(list(range(200)), 0), primary_key="k")
    tbl.upsert(batch(list(range(0, 200, 3)), 1))
    looked_up = []
    real = reads.plan_lookup

    def counted(snapshot, store, spec, keys, *rest):
        looked_up.append(sorted(keys.column("k").to_pylist()))
        tbl.upsert(batch(keys.column("k").to_pylist(), 2))  # after the snapshot: not seen
        return real(snapshot, store, spec, keys, *rest)

    f = "n < 150 AND s LIKE 's1%'"
    ctx = mw.connect()
    ctx.register("t", tbl)
    want = ctx.sql(f"SELECT * FROM t WHERE {f}").to_arrow_table().sort_by("k")
    tbl.to_arrow(filter=f)  # DataFusion plans a filter the first time
    monkeypatch.setattr(reads, "plan_lookup", counted)
    got = tbl.to_arrow(filter=f)
    assert got.sort_by("k") == want and want.num_rows > 0
    assert looked_up == [sorted(want.column("k").to_pylist())]  # only the matching rows
    assert ctx.sql("SELECT count(*) AS n FROM t WHERE n < 150").to_pydict()["n"][0] > want.num_rows
    looked_up.clear()
    now = ctx.sql(f"SELECT k, s FROM t WHERE {f}").to_arrow_table().sort_by("k")
    assert tbl.to_arrow(["k", "s"], filter=f).sort_by("k") == now and not looked_up
    # A LIKE most rows match: the rows are read whole instead of looked up.
    most = "n < 150 AND s LIKE 's%'"
    want = ctx.sql(f"SELECT * FROM t WHERE {most}").to_arrow_table().sort_by("k")
    tbl.to_arrow(filter=most)
    assert tbl.to_arrow(filter=most).sort_by("k") == want and want.num_rows and not looked_up
    tbl.close()


def test_eventual_reads_see_only_flushed_generations(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch([1], 0), primary_key="k")
    tbl.upsert(batch([2], 0))
    assert tbl.count_rows(consistency="eventual") == 1
    assert tbl.count_rows() == 2
    tbl.flush()
    assert tbl.count_rows(consistency="eventual") == 2


def test_sql_over_memwal_and_ordinary_tables(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        batch(list(range(10)), 0),
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
    )
    tbl.upsert(batch([1, 2, 11], 50))
    tbl.delete(pa.table({"k": [3]}))
    ctx = mw.connect()
    ctx.register("t", tbl)
    ctx.register_record_batches(
        "names", [[pa.record_batch({"grp": ["g0", "g1", "g2"], "label": ["zero", "one", "two"]})]]
    )
    joined = ctx.sql(
        "SELECT label, count(*) AS c FROM t JOIN names USING (grp) GROUP BY label ORDER BY label"
    ).to_pydict()
    model = Model(["k"])
    model.upsert(batch(list(range(10)), 0))
    model.upsert(batch([1, 2, 11], 50))
    model.delete(pa.table({"k": [3]}))
    counts: dict[str, int] = {}
    for row in model.rows.values():
        label = {"g0": "zero", "g1": "one", "g2": "two"}[row["grp"]]
        counts[label] = counts.get(label, 0) + 1
    assert joined == {"label": sorted(counts), "c": [counts[k] for k in sorted(counts)]}
    top = ctx.sql(
        "SELECT k, row_number() OVER (ORDER BY k DESC) AS r FROM t ORDER BY k DESC LIMIT 3"
    ).to_pydict()
    assert top == {"k": [11, 9, 8], "r": [1, 2, 3]}
    assert ctx.sql("SELECT count(*) AS n FROM t a JOIN t b ON a.k = b.k").to_pydict() == {"n": [10]}
    # Every query sees the latest writes.
    tbl.upsert(batch([100], 1))
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pydict() == {"n": [11]}
    assert "t" in ctx.sql("SHOW TABLES").to_pydict()["table_name"]
    tbl.close()


def test_reads_while_a_writer_writes_and_flushes(tmp_path):
    """No duplicates, and nothing acknowledged before a read began is missing from it."""
    schema = pa.schema([pa.field("k", pa.int64(), False), pa.field("version", pa.int64())])
    tbl = mw.create_table(
        str(tmp_path),
        schema,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        writer_config=mw.WriterConfig(max_memtable_rows=300),
    )
    acked: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def write():
        v = 0
        while not stop.is_set() and v < 400:
            v += 1
            ks = [(v * 13 + j) % 500 for j in range(20)]
            tbl.upsert(pa.table({"k": ks, "version": [v] * len(ks)}, schema=schema))
            with lock:
                for k in ks:
                    acked[k] = v

    t = threading.Thread(target=write)
    t.start()
    reads = 0
    deadline = time.monotonic() + 20
    while t.is_alive() and time.monotonic() < deadline:
        with lock:
            before = dict(acked)
        got = tbl.to_arrow()
        ks = got.column("k").to_pylist()
        assert len(ks) == len(set(ks))
        seen = dict(zip(ks, got.column("version").to_pylist()))
        for k, v in before.items():
            assert seen.get(k, -1) >= v, (k, v, seen.get(k))
        reads += 1
    stop.set()
    t.join()
    tbl.close()
    assert reads >= 3


@pytest.mark.interop
def test_our_reads_of_a_lance_written_table_equal_lsm_scanner(tmp_path):
    uri = str(tmp_path / "t")
    ds = lance.write_dataset(
        pa.Table.from_batches(
            batch(list(range(20)), 0).to_batches(), schema=SCHEMA.with_metadata(None)
        ).cast(
            pa.schema(
                [
                    SCHEMA.field("k").with_metadata(
                        {"lance-schema:unenforced-primary-key": "true"}
                    ),
                    *list(SCHEMA)[1:],
                ]
            )
        ),
        uri,
    )
    ds.initialize_mem_wal(bucket_column="k", num_buckets=2)
    model = Model(["k"])
    model.upsert(batch(list(range(20)), 0))
    shard = str(uuid.uuid4())
    with lance.dataset(uri).mem_wal_writer(shard) as w:
        w.put(batch(list(range(5, 15)), 3))
        w.delete(pa.table({"k": [6, 7]}))
    model.upsert(batch(list(range(5, 15)), 3))
    model.delete(pa.table({"k": [6, 7]}))
    with lance.dataset(uri).mem_wal_writer(shard) as w:
        w.put(batch([7, 30], 4))
    model.upsert(batch([7, 30], 4))
    tbl = mw.open_table(uri)
    ours = tbl.to_arrow().sort_by("k")
    theirs = LsmScanner.from_snapshots(lance.dataset(uri), lance_snapshots(uri)).to_table()
    theirs = theirs.select(SCHEMA.names).sort_by("k")
    assert ours.cast(theirs.schema) == theirs
    assert ours == model.table(SCHEMA).cast(ours.schema)
    assert (
        tbl.count_rows("n > 30")
        == LsmScanner.from_snapshots(lance.dataset(uri), lance_snapshots(uri))
        .filter("n > 30")
        .count_rows()
    )


@pytest.mark.interop
def test_generations_merged_into_the_base_table_are_skipped(tmp_path):
    from lance.mem_wal import CompactedSsTable

    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1], 7))  # generation 1 holds k=1 at seed 7
    # A merger folds generation 1 into the base table and records it, atomically (Lance's API);
    # then the base row moves on (seed 9). A reader that kept generation 1 would resurrect seed 7.
    ds = lance.dataset(str(tmp_path))
    ds.merge_insert(
        "k"
    ).when_matched_update_all().when_not_matched_insert_all().mark_sstables_as_compacted(
        [CompactedSsTable(w.region_id, 1)]
    ).execute(batch([1], 7))
    lance.dataset(str(tmp_path)).merge_insert(
        "k"
    ).when_matched_update_all().when_not_matched_insert_all().execute(batch([1], 9))
    assert tbl.merged_generations() == {w.region_id: 1}
    got = tbl.to_arrow().sort_by("k")
    assert got == pa.concat_tables([batch([1], 9), batch([2], 0)]).cast(got.schema)


def test_register_by_uri(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")
    with tbl.writer() as w:
        w.delete([2])
    ctx = mw.connect()
    ctx.register("t", str(tmp_path))
    assert ctx.sql("SELECT k FROM t").to_pydict() == {"k": [1]}


def test_bad_read_arguments_are_typed_errors_that_name_no_private_table(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    tbl = mw.create_table(str(tmp_path), schema, primary_key="id")
    tbl.upsert({"id": [1, 2], "v": ["a", "b"]})
    with pytest.raises(SchemaMismatchError, match="nope"):
        tbl.to_arrow(["nope"])
    with pytest.raises(SchemaMismatchError, match="_gen"):
        tbl.to_arrow(["id", "_gen"])  # a system column without system_columns=True
    with pytest.raises(SchemaMismatchError, match="nope"):
        tbl.lookup([1], columns=["nope"])
    with pytest.raises(InvalidInputError, match="string"):
        tbl.to_arrow("id")
    for bad in ("nope > 1", "id >", "v + 1 = 'x' AND"):
        with pytest.raises(InvalidInputError) as e:
            tbl.to_arrow(filter=bad)
        assert "t_strong" not in str(e.value)
    with pytest.raises(InvalidInputError, match="consistency"):
        tbl.to_arrow(consistency="weak")
    assert tbl.to_arrow(["v"], filter="id = 2").column("v").to_pylist() == ["b"]
    assert tbl.lookup([2], columns=["v"], with_system_columns=True).column_names == [
        "id",
        "v",
        "_gen",
        "_rowaddr",
    ]


def test_a_missing_generation_file_is_a_storage_error_on_every_read_path(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    tbl = mw.create_table(str(tmp_path), schema, primary_key="id")
    with tbl.writer() as w:
        w.upsert({"id": [1, 2], "v": ["a", "b"]})
    [(rid, manifest)] = tbl.region_manifests()
    gen_dir = tmp_path / "_mem_wal" / rid / manifest.flushed_generations[0].path
    for f in (gen_dir / "data").iterdir():
        f.unlink()
    reader = mw.open_table(str(tmp_path))
    for read in (reader.to_arrow, reader.count_rows, lambda: reader.lookup([1])):
        with pytest.raises(StorageError, match="is damaged: it is missing"):
            read()


@pytest.mark.parametrize(
    "bad",
    [
        "id > 0 UNION ALL SELECT 100 AS n",
        "1=1; DROP TABLE x",
        "id > 0 LIMIT 1",
        "id > 0 ORDER BY id",
        "",
        "id + 1",
        "EXISTS (SELECT 1)",
        "id > (SELECT 1)",
        "count(*) > 0",
        "id = $1",
        "nosuch > 1",
        "id > 0)",
    ],
)
def test_a_filter_is_one_boolean_expression_and_nothing_else(tmp_path, bad):
    tbl = mw.create_table(
        str(tmp_path), pa.table({"id": pa.array([1, 2, 3], pa.int64())}), primary_key="id"
    )
    for read in (
        lambda: tbl.count_rows(bad),
        lambda: tbl.to_arrow(filter=bad),
        lambda: tbl.scan(filter=bad),
        lambda: tbl.explain(bad),
    ):
        with pytest.raises(mw.errors.InvalidFilterError):
            read()
    assert tbl.count_rows("id > 1 -- a comment") == 2
    assert tbl.to_arrow(filter="id IN (1, 3) AND NOT id = 3").to_pydict() == {"id": [1]}


def test_a_filter_planned_beside_another_threads_keeps_its_own_predicate(tmp_path, monkeypatch):
    """Two threads plan their first query of one table object with different filters; the
    second plans between the first's planning and its look at what it planned. Each must
    learn (and remember) its own pushed predicate, not the other's."""
    from memwal_sql import reads as reads_module

    tbl = mw.create_table(str(tmp_path / "t"), batch(list(range(30)), 0), primary_key="k")
    first_planned, second_done = threading.Event(), threading.Event()
    real = reads_module._filtered

    def interleaved(df, text, name):
        out = real(df, text, name)
        if text == "n >= 50" and not first_planned.is_set():
            first_planned.set()
            assert second_done.wait(30)
        return out

    monkeypatch.setattr(reads_module, "_filtered", interleaved)
    got = {}
    first = threading.Thread(target=lambda: got.update(a=tbl.to_arrow(filter="n >= 50")))
    first.start()
    assert first_planned.wait(30)
    got["b"] = tbl.to_arrow(filter="k < 3")
    second_done.set()
    first.join()
    model = Model(["k"])
    model.upsert(batch(list(range(30)), 0))
    for key, f in (("a", "n >= 50"), ("b", "k < 3")):
        want = expected(model, f)
        assert got[key].sort_by([(c, "ascending") for c in got[key].column_names]) == want
        again = tbl.to_arrow(filter=f)  # what was remembered for the filter
        assert again.sort_by([(c, "ascending") for c in again.column_names]) == want
    tbl.close()
