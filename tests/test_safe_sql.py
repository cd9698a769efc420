"""SQL from mw.connect() and `memwal sql` runs queries (and DML on MemWAL tables, tests/
test_sql.py): no statement reads or writes a path, drops a table or changes the session, unless
the session is trusted."""

from __future__ import annotations

import pytest

import memwal_sql as mw
from memwal_sql.errors import StatementNotAllowedError
from memwal_sql.storage import layout

REFUSED = {
    "external table": "CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '{secret}'",
    "copy": "COPY (SELECT 1 AS x) TO '{out}' STORED AS CSV",
    "copy over a wal entry": "COPY (SELECT 1 AS x) TO '{wal}' STORED AS ARROW",
    "drop": "DROP TABLE t",
    "create table as": "CREATE TABLE c AS SELECT * FROM t",
    "create view": "CREATE VIEW v AS SELECT * FROM t",
    "set": "SET datafusion.execution.batch_size = 1",
    "prepare": "PREPARE q AS SELECT 1",
}


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(str(tmp_path / "t"), {"id": [1, 2], "v": ["a", "b"]}, primary_key="id")
    with tbl.writer() as w:
        w.upsert({"id": [3], "v": ["c"]})
        w.release()  # a WAL entry left to overwrite
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    wal = max((tmp_path / "t" / layout.wal_dir(w.region_id)).iterdir())
    paths = {"secret": secret, "out": tmp_path / "out.csv", "wal": wal}
    yield tbl, paths
    tbl.close()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_untrusted_session_refuses_every_statement_but_a_query(table, name):
    tbl, paths = table
    wal_before = paths["wal"].read_bytes()
    ctx = mw.connect()
    ctx.register("t", tbl)
    with pytest.raises(StatementNotAllowedError, match="trusted=True"):
        ctx.sql(REFUSED[name].format(**paths)).collect()
    assert not paths["out"].exists()
    assert paths["wal"].read_bytes() == wal_before
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pydict() == {"n": [3]}
    assert sorted(ctx.sql("SHOW TABLES").to_pydict()["table_name"]).count("t") == 1


def test_a_trusted_session_has_all_of_datafusion(table):
    tbl, paths = table
    ctx = mw.connect(trusted=True)
    ctx.register("t", tbl)
    ctx.sql(REFUSED["external table"].format(**paths)).collect()
    assert ctx.sql("SELECT * FROM p").to_pydict() == {"password": ["hunter2"]}
    ctx.sql(REFUSED["copy"].format(**paths)).collect()
    assert paths["out"].read_text().splitlines() == ["x", "1"]


def test_memwal_sql_refuses_statements_unless_trusted(table, capsys):
    from memwal_sql.cli import main

    tbl, paths = table
    query = REFUSED["copy"].format(**paths)
    with pytest.raises(SystemExit) as exit_:
        main(["sql", query, "--table", f"t={tbl.uri}"])
    assert exit_.value.code != 0
    assert "--trusted" in capsys.readouterr().err
    assert not paths["out"].exists()
    main(["sql", query, "--table", f"t={tbl.uri}", "--trusted"])
    assert paths["out"].exists()


def test_explicit_options_are_the_callers(table):
    from datafusion import SQLOptions

    tbl, paths = table
    ctx = mw.connect()
    ctx.register("t", tbl)
    ctx.sql(REFUSED["copy"].format(**paths), SQLOptions()).collect()
    assert paths["out"].exists()


@pytest.mark.parametrize("trusted", [False, True])
def test_no_table_function_or_table_name_reads_a_file(table, trusted):
    """DataFusion 55 registers no file table functions (read_csv, parquet_metadata), and a
    quoted path is a table name the session's catalog does not hold (no URL tables)."""
    tbl, paths = table
    ctx = mw.connect(trusted=trusted)
    ctx.register("t", tbl)
    for query in (
        f"SELECT * FROM read_csv('{paths['secret']}')",
        f"SELECT * FROM parquet_metadata('{paths['secret']}')",
        f"SELECT * FROM '{paths['secret']}'",
    ):
        with pytest.raises(Exception, match="not found") as e:
            ctx.sql(query).collect()
        assert "hunter2" not in str(e.value)
