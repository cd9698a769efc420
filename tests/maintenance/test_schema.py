"""Schema evolution while writers write: added columns read NULL in every row written before
(WAL entries, generations, a live MemTable of a writer opened before, the base), through every
read path, flush, merge, compaction and reopen; checked against a model of the latest rows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import SchemaMismatchError
from tests.lsm import Model, apply_op

OLD = pa.schema([pa.field("id", pa.int64(), False), pa.field("n", pa.int64())])


def keys_of(tbl, region: int, count: int, start: int = 0) -> list[int]:
    """``count`` keys from ``start`` on that the table's bucket spec puts in bucket ``region``."""
    ids = list(range(start, start + 40 * count))
    buckets = tbl.region_spec.region_values(pa.table({"id": ids})).column(0).to_pylist()
    return [i for i, b in zip(ids, buckets) if b == region][:count]


def expected(model: Model, schema: pa.Schema) -> pa.Table:
    rows = [{f.name: r.get(f.name) for f in schema} for r in model.rows.values()]
    return pa.Table.from_pylist(rows, schema=schema).sort_by("id")


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, pa.table({"id": [0, 1, 2, 3], "n": [0, 1, 2, 3]}, schema=OLD), primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )  # fmt: skip
    model = Model(["id"])
    model.upsert(pa.table({"id": [0, 1, 2, 3], "n": [0, 1, 2, 3]}, schema=OLD))
    yield tbl, model, uri
    tbl.close()


def test_rows_of_a_writer_opened_before_read_null_in_the_new_column(table):
    tbl, model, _ = table
    old_keys, new_keys = keys_of(tbl, 1, 6, 100), keys_of(tbl, 0, 4, 100)
    old = tbl.writer(region_values=(1,))  # opened before the change: writes the old schema
    old.upsert(pa.table({"id": old_keys[:3], "n": [7, 8, 9]}, schema=OLD))
    tbl.add_columns({"note": pa.string()})
    assert tbl.schema.names == ["id", "n", "note"]
    new_rows = pa.table({"id": new_keys, "n": [1, 2, 3, 4], "note": ["a", None, "c", "d"]})
    tbl.upsert(new_rows)
    old.upsert(pa.table({"id": old_keys[3:], "n": [4, 5, 6]}, schema=OLD))
    with pytest.raises(SchemaMismatchError):  # the old writer does not know the column
        old.upsert(pa.table({"id": old_keys[:1], "n": [1], "note": ["x"]}))
    for rows in (
        pa.table({"id": old_keys[:3], "n": [7, 8, 9]}, schema=OLD),
        new_rows,
        pa.table({"id": old_keys[3:], "n": [4, 5, 6]}, schema=OLD),
    ):
        model.upsert(rows)
    want = expected(model, tbl.schema)
    assert tbl.to_arrow().sort_by("id") == want  # MemTables: one old, one new
    assert tbl.lookup(old_keys[:2] + new_keys[:1]).sort_by("id") == want.filter(
        pa.compute.is_in(want["id"], pa.array(old_keys[:2] + new_keys[:1]))
    )
    ctx = mw.connect()
    ctx.register("t", tbl)
    assert ctx.sql("SELECT count(note) AS n FROM t").to_pydict() == {"n": [3]}
    assert tbl.count_rows("note IS NULL") == want.num_rows - 3
    old.flush()
    tbl.flush()
    assert tbl.to_arrow().sort_by("id") == want  # generations of both schemas
    tbl.merge()
    assert tbl.to_arrow().sort_by("id") == want
    base = tbl.dataset().to_table().sort_by("id")
    assert base.select(["id", "n", "note"]) == want  # merged rows: NULL where never written
    old.close()


def test_an_old_writers_wal_replayed_by_a_new_writer_takes_the_new_schema(table):
    tbl, model, uri = table
    keys = keys_of(tbl, 1, 3, 100)
    old = tbl.writer(region_values=(1,))
    old.upsert(pa.table({"id": keys, "n": [1, 2, 3]}, schema=OLD))
    old.release()  # gone without a flush: its rows only in the WAL
    tbl.add_columns({"note": pa.string()})
    model.upsert(pa.table({"id": keys, "n": [1, 2, 3]}, schema=OLD))
    assert tbl.to_arrow().sort_by("id") == expected(model, tbl.schema)  # the WAL tail
    tbl.upsert({"id": keys[:1], "n": [10], "note": ["new"]})  # claims, replays, writes
    model.upsert(pa.table({"id": keys[:1], "n": [10], "note": ["new"]}))
    tbl.flush()
    tbl.merge()
    reopened = mw.open_table(uri)
    assert reopened.to_arrow().sort_by("id") == expected(model, reopened.schema)
    reopened.close()


def test_another_process_sees_the_column_from_its_next_query(table):
    tbl, _, uri = table
    other = mw.open_table(uri)  # opened before the change
    assert other.to_arrow().schema.names == ["id", "n"]
    ctx = mw.connect()
    ctx.register("t", other)
    tbl.add_columns({"note": pa.string()})
    tbl.upsert({"id": [1], "n": [1], "note": ["one"]})
    assert other.to_arrow().schema.names == ["id", "n", "note"]
    assert other.lookup([1]).to_pylist() == [{"id": 1, "n": 1, "note": "one"}]
    assert ctx.sql("SELECT note FROM t WHERE id = 1").to_pydict() == {"note": ["one"]}
    third = mw.open_table(uri)
    tbl.add_columns({"score": pa.float64()})
    # A write naming the new column finds it without a read first.
    third.upsert({"id": [2], "n": [2], "note": ["two"], "score": [0.5]})
    assert other.to_arrow(["id", "score"], filter="score > 0").to_pylist() == [
        {"id": 2, "score": 0.5}
    ]
    other.close()
    third.close()


def test_routed_writers_opened_before_take_the_new_schema_after_a_flush(table):
    tbl, model, _ = table
    a, b = keys_of(tbl, 0, 2, 10), keys_of(tbl, 1, 2, 10)
    tbl.upsert({"id": [a[0], b[0]], "n": [1, 2]})  # routed writers open in the old schema
    writers = dict(tbl.live_writers())
    assert len(writers) == 2
    tbl.add_columns({"note": pa.string()})
    tbl.upsert({"id": [a[0], a[1], b[1]], "n": [3, 4, 5], "note": ["x", "y", None]})
    assert all(w.closed for w in writers.values())  # flushed and closed, not dropped
    assert all(w.wal_schema.names[:3] == ["id", "n", "note"] for w in tbl.live_writers().values())
    model.upsert(pa.table({"id": [a[0], b[0]], "n": [1, 2]}, schema=OLD))
    model.upsert(pa.table({"id": [a[0], a[1], b[1]], "n": [3, 4, 5], "note": ["x", "y", None]}))
    assert tbl.to_arrow().sort_by("id") == expected(model, tbl.schema)


def test_a_non_null_column_made_nullable_takes_nulls(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("n", pa.int64(), False)])
    tbl = mw.create_table(str(tmp_path / "t"), pa.table({"id": [1], "n": [1]}, schema=schema),
                          primary_key="id")  # fmt: skip
    with pytest.raises(SchemaMismatchError):
        tbl.upsert({"id": [2], "n": [None]})
    tbl.alter_columns({"path": "n", "nullable": True})
    tbl.upsert({"id": [2], "n": [None]})
    tbl.flush()
    tbl.merge()
    assert tbl.to_arrow().sort_by("id").to_pylist() == [{"id": 1, "n": 1}, {"id": 2, "n": None}]
    tbl.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.add_columns({"n": pa.int32()}), "exists already"),
        (lambda t: t.add_columns({"_tombstone": pa.bool_()}), "reserves"),
        (lambda t: t.add_columns([pa.field("m", pa.int64(), False)]), "must be nullable"),
        (lambda t: t.add_columns({}), "at least one"),
        (lambda t: t.alter_columns({"path": "n", "data_type": pa.float64()}), "Lance 14"),
        (lambda t: t.alter_columns({"path": "n", "name": "m"}), "renamed"),
        (lambda t: t.alter_columns({"path": "id", "nullable": True}), "key column"),
        (lambda t: t.alter_columns({"path": "n", "nullable": False}), "not non-nullable"),
        (lambda t: t.alter_columns({"path": "zz", "nullable": True}), "no column 'zz'"),
    ],
)
def test_changes_that_would_break_rows_written_before_are_refused(table, change, message):
    tbl, model, _ = table
    version = tbl.dataset().version
    with pytest.raises(SchemaMismatchError, match=message):
        change(tbl)
    assert tbl.dataset().version == version  # nothing committed
    assert tbl.to_arrow().sort_by("id") == expected(model, OLD)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(st.integers(0, 30), min_size=1, max_size=5, unique=True), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 30), min_size=1, max_size=3, unique=True), st.just(0)),
        st.tuples(st.sampled_from(["flush", "merge", "compact", "reopen", "crash", "add_column"]), st.just([]), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=ops)
def test_evolving_table_matches_the_model(tmp_path_factory, steps):
    uri = str(tmp_path_factory.mktemp("evolve") / "t")
    tbl = mw.create_table(uri, pa.table({"id": [0, 1], "n": [0, 1]}, schema=OLD),
                          primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2))  # fmt: skip
    model = Model(["id"])
    model.upsert(pa.table({"id": [0, 1], "n": [0, 1]}, schema=OLD))
    added = 0

    def batch(keys: list[int], seed: int) -> pa.Table:
        # Every write names the columns the table has now; older rows lack the later ones.
        cols = {"id": keys, "n": [k + seed for k in keys]}
        for i in range(added):
            cols[f"c{i}"] = [None if (k + seed + i) % 3 == 0 else f"{k}.{seed}" for k in keys]
        return pa.table(cols)

    try:
        for op, keys, seed in steps:
            if op == "add_column":
                tbl.add_columns({f"c{added}": pa.string()})
                added += 1
            else:
                tbl = apply_op(tbl, model, op, keys, seed, uri, batch)
            assert tbl.to_arrow().sort_by("id") == expected(model, tbl.schema)
            probe = [0, 1, *keys]
            want = expected(model, tbl.schema)
            assert tbl.lookup(probe).sort_by("id") == want.filter(
                pa.compute.is_in(want["id"], pa.array(probe))
            )
    finally:
        tbl.close()


def test_a_writer_in_another_process_keeps_writing_the_old_schema(table, tmp_path):
    """The done-when of issue 40: a column is added while another process's writer goes on
    writing the old schema; after its flush and a merge the old rows read NULL in it."""
    tbl, model, uri = table
    old_keys, new_keys = keys_of(tbl, 1, 40, 1000), keys_of(tbl, 0, 5, 1000)
    go, ready = tmp_path / "go", tmp_path / "ready"
    script = textwrap.dedent(f"""
        import os, time, pyarrow as pa, memwal_sql as mw
        tbl = mw.open_table({uri!r})
        keys = {old_keys!r}
        with tbl.writer(region_values=(1,)) as w:
            w.upsert(pa.table({{"id": keys[:20], "n": keys[:20]}}))
            open({str(ready)!r}, "w").close()
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            w.upsert(pa.table({{"id": keys[20:], "n": keys[20:]}}))  # after the change
        # leaving the block flushed the MemTable: a generation in the old schema
    """)
    writer = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(6000):
            if ready.exists() or writer.poll() is not None:
                break
            time.sleep(0.01)
        assert ready.exists(), "the writer process did not start"
        tbl.add_columns({"note": pa.string()})
        tbl.upsert({"id": new_keys, "n": new_keys, "note": [f"k{k}" for k in new_keys]})
        go.touch()
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
    model.upsert(pa.table({"id": old_keys, "n": old_keys}, schema=OLD))
    model.upsert(pa.table({"id": new_keys, "n": new_keys, "note": [f"k{k}" for k in new_keys]}))
    want = expected(model, tbl.schema)
    assert tbl.to_arrow().sort_by("id") == want
    tbl.flush()
    tbl.merge()
    reopened = mw.open_table(uri)
    assert reopened.to_arrow().sort_by("id") == want
    assert reopened.dataset().to_table().sort_by("id").select(want.column_names) == want
    reopened.close()
