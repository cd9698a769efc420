"""Schema evolution while writers write: added columns read NULL in every row written before
(WAL entries, generations, a live MemTable of a writer opened before, the base), through every
read path, flush, merge, compaction and reopen; checked against a model of the latest rows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import SchemaMismatchError
from memwal_sql.maintenance.schema import is_widening
from tests.lsm import Model, apply_op, lance_latest_rows

OLD = pa.schema([pa.field("id", pa.int64(), False), pa.field("n", pa.int64())])


def keys_of(tbl, region: int, count: int, start: int = 0) -> list[int]:
    """``count`` keys from ``start`` on that the table's bucket spec puts in bucket ``region``."""
    ids = list(range(start, start + 40 * count))
    buckets = tbl.region_spec.region_values(pa.table({"id": ids})).column(0).to_pylist()
    return [i for i, b in zip(ids, buckets) if b == region][:count]


def start_writer(script: str, ready) -> subprocess.Popen:
    """A process running ``script``, once it has touched ``ready`` (its writer is open)."""
    writer = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(6000):
        if ready.exists() or writer.poll() is not None:
            break
        time.sleep(0.01)
    if not ready.exists():
        writer.kill()
        raise AssertionError("the writer process did not start")
    return writer


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


def test_a_table_opened_before_a_change_claims_in_the_new_schema(table):
    """A table object opened before another one added a column claims a region whose WAL holds
    rows with the column: the claim takes the new schema, so replaying keeps their values (an
    old-schema writer would drop them, and its flush would lose them)."""
    tbl, model, uri = table
    keys = keys_of(tbl, 1, 3, 200)
    stale = mw.open_table(uri)  # opened before the change, never reads after it
    tbl.add_columns({"note": pa.string()})
    with_note = pa.table({"id": keys, "n": [1, 2, 3], "note": ["a", "b", None]})
    new = tbl.writer(region_values=(1,))
    new.upsert(with_note)
    new.release()  # its rows only in the WAL
    model.upsert(with_note)
    with stale.writer(region_values=(1,)) as claimed:  # replays, then flushes on close
        assert "note" in claimed.wal_schema.names
    stale.merge()
    reopened = mw.open_table(uri)
    assert reopened.to_arrow().sort_by("id") == expected(model, reopened.schema)
    reopened.close()
    stale.close()


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
        (lambda t: t.alter_columns({"path": "n", "data_type": pa.float64()}), "cannot become"),
        (lambda t: t.alter_columns({"path": "n", "data_type": pa.int32()}), "cannot become"),
        (lambda t: t.alter_columns({"path": "id", "data_type": pa.float64()}), "key column"),
        (lambda t: t.alter_columns({"path": "n"}), "nothing to change"),
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
        st.tuples(st.sampled_from(["flush", "merge", "compact", "reopen", "crash", "add_column", "widen"]), st.just([]), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)  # fmt: skip
# Column w's types, widened in turn, and a factor that puts (key + seed) <= 39 beyond the range
# of the type before: a value written after a widening fits only the wider type.
WIDTHS = [(pa.int8(), 3), (pa.int16(), 800), (pa.int32(), 50_000_000), (pa.int64(), 2**40)]


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=ops)
def test_evolving_table_matches_the_model(tmp_path_factory, steps):
    uri = str(tmp_path_factory.mktemp("evolve") / "t")
    first = pa.table({"id": [0, 1], "n": [0, 1], "w": pa.array([0, 1], pa.int8())})
    tbl = mw.create_table(uri, first, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2))
    model = Model(["id"])
    model.upsert(first)
    added, width = 0, 0

    def batch(keys: list[int], seed: int) -> pa.Table:
        # Every write names the columns the table has now; older rows lack the later ones.
        wtype, factor = WIDTHS[width]
        cols = {"id": keys, "n": [k + seed for k in keys],
                "w": pa.array([(k + seed) * factor for k in keys], wtype)}  # fmt: skip
        for i in range(added):
            cols[f"c{i}"] = [None if (k + seed + i) % 3 == 0 else f"{k}.{seed}" for k in keys]
        return pa.table(cols)

    try:
        for op, keys, seed in steps:
            if op == "add_column":
                tbl.add_columns({f"c{added}": pa.string()})
                added += 1
            elif op == "widen":
                if width + 1 < len(WIDTHS):
                    width += 1
                    tbl.alter_columns({"path": "w", "data_type": WIDTHS[width][0]})
            else:
                tbl = apply_op(tbl, model, op, keys, seed, uri, batch)
            assert tbl.schema.field("w").type == WIDTHS[width][0]
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
    writer = start_writer(script, ready)
    try:
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


# ---- type widening ----------------------------------------------------------------------------

NARROW = pa.schema([pa.field("id", pa.int64(), False), pa.field("m", pa.int32()), pa.field("s", pa.string())])  # fmt: skip
BIG = 2**40  # fits the widened type only


@pytest.fixture
def narrow(tmp_path):
    uri = str(tmp_path / "w")
    rows = pa.table({"id": [0, 1, 2, 3], "m": [0, -1, None, 3], "s": list("abcd")}, schema=NARROW)
    tbl = mw.create_table(uri, rows, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2))
    model = Model(["id"])
    model.upsert(rows)
    yield tbl, model, uri
    tbl.close()


def wide(model: Model) -> pa.Table:
    return expected(model, pa.schema([NARROW.field("id"), pa.field("m", pa.int64()), NARROW.field("s")]))  # fmt: skip


def test_a_widened_column_reads_every_row_written_before_widened(narrow):
    tbl, model, uri = narrow
    old_keys, new_keys = keys_of(tbl, 1, 6, 100), keys_of(tbl, 0, 3, 100)
    old = tbl.writer(region_values=(1,))  # opened before: writes int32
    old.upsert(pa.table({"id": old_keys[:2], "m": [7, 8], "s": ["o", "o"]}, schema=NARROW))
    old.flush()  # a generation of int32
    old.upsert(pa.table({"id": old_keys[2:4], "m": [9, -9], "s": ["p", "p"]}, schema=NARROW))
    tbl.alter_columns({"path": "m", "data_type": pa.int64()})
    assert tbl.schema.field("m").type == pa.int64()
    assert tbl.dataset().schema.field("m").type == pa.int64()
    old.upsert(pa.table({"id": old_keys[4:], "m": [5, 6], "s": ["q", "q"]}, schema=NARROW))
    with pytest.raises(SchemaMismatchError):  # the old writer's type cannot hold it
        old.upsert(pa.table({"id": old_keys[:1], "m": [BIG], "s": ["x"]}))
    new_rows = pa.table({"id": new_keys, "m": [BIG, -BIG, None], "s": ["n", "n", "n"]})
    tbl.upsert(new_rows)
    for rows in (
        pa.table({"id": old_keys[:2], "m": [7, 8], "s": ["o", "o"]}),
        pa.table({"id": old_keys[2:4], "m": [9, -9], "s": ["p", "p"]}),
        pa.table({"id": old_keys[4:], "m": [5, 6], "s": ["q", "q"]}),
        new_rows,
    ):
        model.upsert(rows)
    want = wide(model)
    assert tbl.to_arrow().sort_by("id") == want  # base, generation, both MemTables
    assert tbl.lookup([*old_keys, *new_keys, 0]).sort_by("id") == want.filter(
        pa.compute.is_in(want["id"], pa.array([*old_keys, *new_keys, 0]))
    )
    ctx = mw.connect()
    ctx.register("t", tbl)
    got = ctx.sql(f"SELECT id, m FROM t WHERE m > {BIG // 2} OR m < 0 ORDER BY id").to_arrow_table()
    assert got.to_pylist() == [
        r for r in want.select(["id", "m"]).to_pylist() if r["m"] is not None and (r["m"] > BIG // 2 or r["m"] < 0)
    ]  # fmt: skip
    old.close()
    tbl.flush()
    # Lance's reader matches a generation's columns by field id: those written after the
    # widening carry the new one and read right before any merge.
    lance_rows = lance_latest_rows(uri, ["id"]).to_pylist()
    got = {r["id"]: r["m"] for r in lance_rows if r["id"] in new_keys}
    assert got == dict(zip(new_keys, [BIG, -BIG, None]))
    tbl.merge()
    assert tbl.to_arrow().sort_by("id") == want
    assert lance_latest_rows(uri, ["id"]) == want
    reopened = mw.open_table(uri)
    assert reopened.to_arrow().sort_by("id") == want
    assert reopened.dataset().to_table().sort_by("id").select(want.column_names) == want
    reopened.close()


def test_a_merge_racing_the_widening_loses_no_value(narrow, monkeypatch):
    """A merge that read the base before the widening began commits while it runs (its rows
    lack the hidden column, or keep a stale value in it), once before the widening's scan and
    once between the scan and the swap: the widening must catch both."""
    from memwal_sql.maintenance import schema as schema_module

    tbl, model, uri = narrow
    before = tbl.dataset().version
    real = schema_module._stale_rows
    stale_merges = iter([([1, 50], [11, 50]), ([2, 60], [22, 60])])

    def stale_merge() -> None:
        keys, values = next(stale_merges)
        rows = pa.table({"id": keys, "m": values, "s": ["r", "r"]}, schema=NARROW)
        (
            lance.dataset(uri, version=before).merge_insert("id")
            .when_matched_update_all().when_not_matched_insert_all().execute(rows)
        )  # fmt: skip
        model.upsert(rows)

    calls = []

    def racing(ds, pk, name, hidden):
        calls.append(ds.version)
        if len(calls) == 1:
            stale_merge()  # lands after this scan's version: the next scan sees it
        out = real(ds, pk, name, hidden)
        if len(calls) == 3:
            stale_merge()  # after a clean scan, before the swap: the swap must conflict
        return out

    monkeypatch.setattr(schema_module, "_stale_rows", racing)
    tbl.alter_columns({"path": "m", "data_type": pa.int64()})
    assert len(calls) >= 4
    base = lance.dataset(uri).to_table().sort_by("id")
    assert base.schema.field("m").type == pa.int64()
    assert base.select(["id", "m", "s"]) == wide(model)
    assert tbl.to_arrow().sort_by("id") == wide(model)


def test_a_writer_in_another_process_keeps_writing_the_narrow_type(narrow, tmp_path):
    tbl, model, uri = narrow
    old_keys = keys_of(tbl, 1, 40, 1000)
    go, ready = tmp_path / "go", tmp_path / "ready"
    script = textwrap.dedent(f"""
        import os, time, pyarrow as pa, memwal_sql as mw
        tbl = mw.open_table({uri!r})
        keys = {old_keys!r}
        with tbl.writer(region_values=(1,)) as w:
            w.upsert(pa.table({{"id": keys[:20], "m": pa.array(keys[:20], pa.int32()), "s": ["p"] * 20}}))
            w.flush()
            open({str(ready)!r}, "w").close()
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            w.upsert(pa.table({{"id": keys[20:], "m": pa.array(keys[20:], pa.int32()), "s": ["q"] * 20}}))
    """)
    writer = start_writer(script, ready)
    try:
        tbl.alter_columns({"path": "m", "data_type": pa.int64()})
        tbl.upsert({"id": [0], "m": [BIG], "s": ["n"]})
        go.touch()
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
    model.upsert(pa.table({"id": old_keys, "m": old_keys, "s": ["p"] * 20 + ["q"] * 20}))
    model.upsert(pa.table({"id": [0], "m": [BIG], "s": ["n"]}))
    want = wide(model)
    assert tbl.to_arrow().sort_by("id") == want
    tbl.flush()
    tbl.merge()
    assert lance_latest_rows(uri, ["id"]) == want
    reopened = mw.open_table(uri)
    assert reopened.to_arrow().sort_by("id") == want
    reopened.close()


def test_an_interrupted_widening_is_hidden_and_finished_by_the_next(narrow, monkeypatch):
    from memwal_sql.maintenance import schema as schema_module

    tbl, model, uri = narrow

    def crash(*_args):
        raise KeyboardInterrupt("killed after the hidden column was added")

    monkeypatch.setattr(schema_module, "_stale_rows", crash)
    with pytest.raises(KeyboardInterrupt):
        tbl.alter_columns({"path": "m", "data_type": pa.int64()})
    monkeypatch.undo()
    assert "_memwal_widening_m" in lance.dataset(uri).schema.names
    reopened = mw.open_table(uri)  # readers and writers do not see the hidden column
    assert reopened.schema == NARROW.remove_metadata() or reopened.schema.names == ["id", "m", "s"]
    reopened.upsert({"id": [7], "m": [70], "s": ["z"]})
    reopened.flush()
    reopened.merge()  # fills the hidden column of the rows it merges
    model.upsert(pa.table({"id": [7], "m": [70], "s": ["z"]}))
    with pytest.raises(SchemaMismatchError, match="interrupted"):
        reopened.alter_columns({"path": "m", "data_type": pa.float64()})
    reopened.alter_columns({"path": "m", "data_type": pa.int64()})
    assert lance.dataset(uri).schema.names == ["id", "m", "s"]
    assert reopened.to_arrow().sort_by("id") == wide(model)
    reopened.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"path": "m", "data_type": pa.int16()}, "cannot become"),
        ({"path": "m", "data_type": pa.float32()}, "cannot become"),  # 2**31 is not exact
        ({"path": "m", "data_type": pa.string()}, "cannot become"),
        ({"path": "m", "data_type": "int64"}, "cannot become"),
        ({"path": "s", "data_type": pa.large_string()}, "cannot become"),
    ],
)
def test_a_type_change_that_is_not_a_widening_is_refused(narrow, change, message):
    tbl, model, _ = narrow
    version = tbl.dataset().version
    with pytest.raises(SchemaMismatchError, match=message):
        tbl.alter_columns(change)
    assert tbl.dataset().version == version
    assert tbl.to_arrow().sort_by("id") == expected(model, NARROW)


def test_region_and_indexed_columns_keep_their_types(tmp_path):
    rows = pa.table({"id": [1, 2], "g": pa.array([1, 2], pa.int32()), "m": pa.array([1, 2], pa.int32())})  # fmt: skip
    tbl = mw.create_table(str(tmp_path / "t"), rows, primary_key="id",
                          region_spec=mw.RegionSpec.identity("g"), allow_non_key_region_spec=True)  # fmt: skip
    with pytest.raises(SchemaMismatchError, match="routes rows"):
        tbl.alter_columns({"path": "g", "data_type": pa.int64()})
    tbl.dataset().create_scalar_index("m", "BTREE")
    with pytest.raises(SchemaMismatchError, match="indexed by"):
        tbl.alter_columns({"path": "m", "data_type": pa.int64()})
    tbl.close()


@pytest.mark.parametrize(
    ("old", "new", "widens"),
    [
        (pa.int8(), pa.int16(), True), (pa.int32(), pa.int64(), True), (pa.int64(), pa.int32(), False),
        (pa.uint8(), pa.int16(), True), (pa.uint32(), pa.int32(), False), (pa.int8(), pa.uint16(), False),
        (pa.uint16(), pa.uint64(), True), (pa.float16(), pa.float32(), True),
        (pa.float32(), pa.float64(), True), (pa.float64(), pa.float32(), False),
        (pa.int32(), pa.float64(), True), (pa.int64(), pa.float64(), False),
        (pa.int16(), pa.float32(), True), (pa.int32(), pa.float32(), False),
        (pa.decimal128(5, 2), pa.decimal128(9, 2), True), (pa.decimal128(5, 2), pa.decimal128(9, 3), False),
        (pa.int32(), pa.int32(), False), (pa.string(), pa.large_string(), False),
    ],
)  # fmt: skip
def test_is_widening(old, new, widens):
    assert is_widening(old, new) is widens


def test_a_writer_whose_schema_lacks_a_column_in_the_wal_refuses_to_replay_it(table, monkeypatch):
    """The claim's schema check lost a race with the change: the replay refuses rather than
    drop the column's values, and the rows stay in the WAL for a writer that knows it."""
    from memwal_sql.table_state import TableState

    tbl, model, uri = table
    keys = keys_of(tbl, 1, 2, 300)
    stale = mw.open_table(uri)
    tbl.add_columns({"note": pa.string()})
    new = tbl.writer(region_values=(1,))
    new.upsert(pa.table({"id": keys, "n": [1, 2], "note": ["a", "b"]}))
    new.release()
    monkeypatch.setattr(TableState, "follow_schema", lambda self, ds: False)  # the race
    with pytest.raises(SchemaMismatchError, match="open the table again"):
        stale.writer(region_values=(1,))
    monkeypatch.undo()
    model.upsert(pa.table({"id": keys, "n": [1, 2], "note": ["a", "b"]}))
    fresh = mw.open_table(uri)
    assert fresh.to_arrow().sort_by("id") == expected(model, fresh.schema)
    fresh.close()
    stale.close()
