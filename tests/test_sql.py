"""SQL DML through ``mw.connect()``: INSERT (an upsert), UPDATE and DELETE on MemWAL tables, and
``tbl.delete(filter=...)``, checked against a model of the latest row per key.

The model judges each statement's predicate with plain DataFusion over its own rows (never a
read of the MemWAL table), so NULLs follow SQL's three-valued logic in both."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import datafusion
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError, StatementNotAllowedError
from tests.lsm import Model, apply_op

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("x", pa.int64()),
        pa.field("s", pa.string()),
    ]
)
VALUES = [None, -3, 0, 1, 5, 9]
STRINGS = [None, "", "a", "ab", "b"]
PREDICATES = [
    "x > 4",
    "x IS NULL",
    "NOT (x > 0)",  # unknown for NULL x: neither the row nor its negation matches
    "s LIKE 'a%'",
    "x > 0 AND s = 'b'",
    "x = 1 OR s IS NULL",
    "id % 3 = 0",
    "id IN (SELECT id FROM t WHERE x < 1)",
]
SETS = ["x = x + 1", "s = 'b'", "x = NULL, s = s || 'z'", "x = id"]


def rows(keys: list[int], seed: int) -> pa.Table:
    return pa.table(
        {
            "id": keys,
            "x": [VALUES[(k + seed) % len(VALUES)] for k in keys],
            "s": [STRINGS[(k * 7 + seed) % len(STRINGS)] for k in keys],
        },
        schema=SCHEMA,
    )


def matched(model: Model, select: str, where: str) -> pa.Table:
    """What ``SELECT select FROM t WHERE where`` gives over the model's rows (plain DataFusion)."""
    ctx = datafusion.SessionContext()
    batches = model.table(SCHEMA).to_batches() or [pa.RecordBatch.from_pylist([], schema=SCHEMA)]
    ctx.register_record_batches("t", [batches])
    return ctx.sql(f"SELECT {select} FROM t WHERE {where}").to_arrow_table()


def sql_literal(v: object) -> str:
    return "NULL" if v is None else repr(v) if isinstance(v, str) else str(v)


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"), rows(list(range(30)), 0), primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )  # fmt: skip
    model = Model(["id"])
    model.upsert(rows(list(range(30)), 0))
    yield tbl, model, str(tmp_path / "t")
    tbl.close()


statements = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 45), min_size=1, max_size=6, unique=True), st.integers(0, 9)),
        st.tuples(st.just("update"), st.sampled_from(SETS), st.sampled_from(PREDICATES)),
        st.tuples(st.just("delete"), st.just(""), st.sampled_from(PREDICATES)),
        st.tuples(st.just("api_delete"), st.just(""), st.sampled_from(PREDICATES[:-1])),
        st.tuples(st.sampled_from(["flush", "merge", "compact", "reopen", "crash"]), st.just(""), st.just("")),
    ),
    min_size=1,
    max_size=12,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=statements)
def test_dml_matches_the_model(tmp_path_factory, ops):
    uri = str(tmp_path_factory.mktemp("dml") / "t")
    tbl = mw.create_table(uri, rows(list(range(30)), 0), primary_key="id",
                          region_spec=mw.RegionSpec.bucket("id", 2))  # fmt: skip
    model = Model(["id"])
    model.upsert(rows(list(range(30)), 0))
    try:
        for op, what, where in ops:
            ctx = mw.connect()
            ctx.register("t", tbl)
            if op == "insert":
                new = rows(what, where)
                values = ", ".join(
                    f"({r['id']}, {sql_literal(r['x'])}, {sql_literal(r['s'])})"
                    for r in new.to_pylist()
                )
                got = ctx.sql(f"INSERT INTO t VALUES {values}").to_pydict()
                model.upsert(new)
                assert got == {"count": [new.num_rows]}
            elif op == "update":
                sets = dict(part.split(" = ", 1) for part in what.split(", "))
                select = ", ".join(f"{sets.get(c, c)} AS {c}" for c in SCHEMA.names)
                want = matched(model, select, where).cast(SCHEMA)
                got = ctx.sql(f"UPDATE t SET {what} WHERE {where}").to_pydict()
                model.upsert(want)
                assert got == {"count": [want.num_rows]}
            elif op in ("delete", "api_delete"):
                gone = matched(model, "id", where)
                if op == "delete":
                    got = ctx.sql(f"DELETE FROM t WHERE {where}").to_pydict()["count"][0]
                else:
                    got = tbl.delete(filter=where)
                model.delete(gone)
                assert got == gone.num_rows
            else:
                tbl = apply_op(tbl, model, op, [], 0, uri, rows)
            assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)
    finally:
        tbl.close()


def test_delete_by_filter_judges_each_keys_latest_row(table):
    tbl, _, _ = table
    tbl.upsert({"id": [1, 2], "x": [100, -100], "s": ["new", "new"]})  # 1 now matches, 2 not
    tbl.flush()
    tbl.upsert({"id": [3], "x": [None], "s": ["live"]})  # in the MemTable; NULL never > 50
    assert tbl.delete(filter="x > 50") == 1
    got = tbl.to_arrow().sort_by("id")
    assert 1 not in got["id"].to_pylist() and {2, 3} <= set(got["id"].to_pylist())
    assert tbl.delete(filter="x > 1000") == 0
    with pytest.raises(InvalidInputError, match="keys or filter"):
        tbl.delete([1], filter="x > 0")
    with pytest.raises(InvalidInputError, match="keys or filter"):
        tbl.delete()


def test_delete_by_filter_routes_by_a_non_key_region_column(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"),
        pa.table({"id": [1, 2, 3, 4], "tenant": ["a", "b", "a", "b"], "x": [1, 2, 3, 4]}),
        primary_key="id",
        region_spec=mw.RegionSpec.identity("tenant"),
        allow_non_key_region_spec=True,
    )
    with tbl:
        assert tbl.delete(filter="x >= 2") == 3
        assert tbl.to_arrow().to_pydict() == {"id": [1], "tenant": ["a"], "x": [1]}
        ctx = mw.connect()
        ctx.register("t", tbl)
        assert ctx.sql("DELETE FROM t WHERE tenant = 'a'").to_pydict() == {"count": [1]}
        assert tbl.count_rows() == 0


def test_insert_without_a_column_writes_it_null(table):
    tbl, _, _ = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    assert ctx.sql("INSERT INTO t (id, s) VALUES (1, 'only s')").to_pydict() == {"count": [1]}
    assert tbl.lookup([1]).to_pylist() == [{"id": 1, "x": None, "s": "only s"}]
    assert ctx.sql("INSERT INTO t SELECT id + 1000, x, s FROM t WHERE id < 3").to_pydict() == {
        "count": [3]
    }
    assert tbl.lookup([1000, 1001, 1002]).num_rows == 3


def test_update_refuses_to_change_a_key_and_writes_nothing(table):
    tbl, model, _ = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    for statement in ["UPDATE t SET id = id + 100", "UPDATE t SET id = x WHERE x > 0"]:
        with pytest.raises(InvalidInputError, match="cannot set key column 'id'"):
            ctx.sql(statement)
    assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)


def test_bad_rows_are_typed_errors_and_write_nothing(table):
    tbl, model, _ = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    with pytest.raises(InvalidInputError, match="non-nullable"):
        ctx.sql("INSERT INTO t VALUES (NULL, 1, 'a')")
    with pytest.raises(InvalidInputError, match="Cannot cast"):
        ctx.sql("INSERT INTO t VALUES (99, 'not a number', 'a')")
    assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)


def test_statements_a_memwal_table_does_not_run_say_what_to_use(table):
    tbl, model, _ = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    for statement, name in [
        ("MERGE INTO t USING t AS s ON t.id = s.id WHEN MATCHED THEN DELETE", "MERGE INTO"),
        ("TRUNCATE t", "TRUNCATE"),
    ]:
        with pytest.raises(StatementNotAllowedError, match=f"^{name} is not supported") as e:
            ctx.sql(statement)
        assert "INSERT INTO (an upsert), UPDATE or DELETE FROM" in str(e.value)
    assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)


def test_a_read_only_session_refuses_every_write(table):
    tbl, model, _ = table
    ctx = mw.connect(read_only=True)
    ctx.register("t", tbl)
    for statement, name in [
        ("INSERT INTO t VALUES (2, 1, 'b')", "INSERT"),
        ("DELETE FROM t WHERE id = 1", "DELETE"),
        ("UPDATE t SET s = 'z'", "UPDATE"),
    ]:
        with pytest.raises(StatementNotAllowedError, match=f"^{name} is not supported") as e:
            ctx.sql(statement)
        assert "read-only" in str(e.value) and "tbl.delete(filter=...)" in str(e.value)
    assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)


def test_an_untrusted_session_writes_no_other_table(table):
    tbl, _, _ = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    ctx.register_record_batches("plain", [[pa.record_batch({"a": [1]})]])
    with pytest.raises(StatementNotAllowedError, match=r"^INSERT is not supported"):
        ctx.sql("INSERT INTO plain VALUES (2)").collect()
    assert ctx.sql("SELECT count(*) AS n FROM plain").to_pydict() == {"n": [1]}
    trusted = mw.connect(trusted=True)
    trusted.register_record_batches("plain", [[pa.record_batch({"a": [1]})]])
    trusted.sql("INSERT INTO plain VALUES (2)").collect()  # DataFusion's own, as before
    assert trusted.sql("SELECT count(*) AS n FROM plain").to_pydict() == {"n": [2]}


def test_a_sql_write_is_durable_when_it_returns(table):
    """The writing process dies right after its INSERT and DELETE return (no close, no
    flush): a new process reads both, replayed from the WAL."""
    tbl, _, uri = table
    tbl.close()
    script = textwrap.dedent(f"""
        import os, memwal_sql as mw
        tbl = mw.open_table({uri!r})
        ctx = mw.connect()
        ctx.register("t", tbl)
        ctx.sql("INSERT INTO t VALUES (500, 5, 'five hundred')")
        ctx.sql("DELETE FROM t WHERE id < 10")
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    reopened = mw.open_table(uri)
    got = reopened.to_arrow().sort_by("id")
    assert got["id"].to_pylist() == [*range(10, 30), 500]
    reopened.close()


def test_a_trusted_read_only_session_refuses_memwal_writes_too(table):
    tbl, model, _ = table
    ctx = mw.connect(trusted=True, read_only=True)
    ctx.register("t", tbl)
    with pytest.raises(
        StatementNotAllowedError, match=r"^DELETE is not supported here: .*read-only"
    ):
        ctx.sql("DELETE FROM t WHERE id = 1")
    assert tbl.to_arrow().sort_by("id") == model.table(SCHEMA)
