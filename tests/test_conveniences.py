"""What a new user expects to work: paths, pandas and polars, the Arrow PyCapsule stream, the
usual shapes of rows and keys, typed SQL and storage errors, a quiet library, and the command
line's --version, table-less SQL, plain EXPLAIN and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.cli import main
from memwal_sql.errors import (
    PrimaryKeyError,
    SqlError,
    StorageError,
    TableExistsError,
)

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
COMPOSITE = pa.schema(
    [pa.field("a", pa.string(), False), pa.field("b", pa.int64(), False), pa.field("v", pa.int64())]
)
MEMWAL = str(Path(sys.executable).parent / "memwal")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}
    return {**env, **extra}


# ---- the library ---------------------------------------------------------------------------------


def test_paths_rows_in_every_shape_and_dataframes_out(tmp_path):
    path = tmp_path / "t"  # a pathlib.Path everywhere a uri is taken
    tbl = mw.create_table(path, SCHEMA, primary_key="id")
    tbl.upsert([{"id": 1, "v": "a"}, {"id": 2}])  # rows as dicts; a missing value is null
    tbl.upsert({"id": [3], "v": ["c"]})
    tbl.upsert(pd.DataFrame({"id": [4], "v": ["d"]}))
    tbl.upsert(pl.DataFrame({"id": [5], "v": ["e"]}))
    tbl.upsert(
        pa.RecordBatchReader.from_batches(
            SCHEMA, pa.table({"id": [6], "v": ["f"]}, schema=SCHEMA).to_batches()
        )
    )
    expected = {"id": [1, 2, 3, 4, 5, 6], "v": ["a", None, "c", "d", "e", "f"]}
    frame = tbl.to_pandas().sort_values("id")
    assert isinstance(frame, pd.DataFrame) and frame["id"].tolist() == expected["id"]
    assert [None if pd.isna(v) else v for v in frame["v"]] == expected["v"]
    frame = tbl.to_polars(filter="id > 4")
    assert isinstance(frame, pl.DataFrame) and frame.sort("id").to_dict(as_series=False) == {
        "id": [5, 6],
        "v": ["e", "f"],
    }
    again = mw.open_table(path)
    assert again.count_rows() == 6
    ctx = mw.connect()
    ctx.register("t", path)
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pydict() == {"n": [6]}
    # Running a script that creates its table twice: exist_ok opens it, unless the key differs.
    same = mw.create_table(path, SCHEMA, primary_key="id", exist_ok=True)
    assert same.count_rows() == 6
    with pytest.raises(TableExistsError, match="primary key"):
        mw.create_table(path, SCHEMA, primary_key="v", exist_ok=True)
    with pytest.raises(TableExistsError):
        mw.create_table(path, SCHEMA, primary_key="id")
    for t in (tbl, again, same):
        t.close()


def test_duckdb_and_polars_read_a_table_and_a_sql_result_through_the_pycapsule_stream(tmp_path):
    tbl = mw.create_table(tmp_path / "t", {"id": [1, 2, 3], "v": ["a", "b", "c"]}, primary_key="id")
    tbl.upsert({"id": [2], "v": ["B"]})  # unflushed: the stream reads every acknowledged write
    tbl.delete(3)
    assert hasattr(tbl, "__arrow_c_stream__")
    assert duckdb.sql("SELECT id, v FROM tbl ORDER BY id").fetchall() == [(1, "a"), (2, "B")]
    assert pl.DataFrame(tbl).sort("id").to_dict(as_series=False) == {"id": [1, 2], "v": ["a", "B"]}
    ctx = mw.connect()
    ctx.register("t", tbl)
    result = ctx.sql("SELECT id * 10 AS x FROM t")
    assert sorted(duckdb.sql("SELECT x FROM result").fetchall()) == [(10,), (20,)]
    result = ctx.sql("SELECT id * 10 AS x FROM t")
    assert sorted(pl.DataFrame(result)["x"].to_list()) == [10, 20]
    tbl.close()


def test_lookups_take_a_scalar_and_tuples_and_align_marks_keys_not_found(tmp_path):
    tbl = mw.create_table(tmp_path / "t", {"id": [1, 2], "v": ["a", None]}, primary_key="id")
    assert tbl.lookup(1).to_pylist() == [{"id": 1, "v": "a"}]
    assert tbl.lookup(99).num_rows == 0
    # A key whose row is null and a key not found differ only in _found.
    assert tbl.lookup([2, 99], align=True).to_pylist() == [
        {"id": 2, "v": None, "_found": True},
        {"id": 99, "v": None, "_found": False},
    ]
    tbl.delete(1)  # a scalar key deletes too
    assert tbl.lookup([1], align=True).column("_found").to_pylist() == [False]
    comp = mw.create_table(
        tmp_path / "c", pa.table({"a": ["x", "y"], "b": [1, 2], "v": [10, 20]}, schema=COMPOSITE),
        primary_key=["a", "b"],
    )  # fmt: skip
    assert comp.lookup(("y", 2)).to_pylist() == [{"a": "y", "b": 2, "v": 20}]
    assert comp.lookup([("x", 1), ("x", 2)], align=True).to_pylist() == [
        {"a": "x", "b": 1, "v": 10, "_found": True},
        {"a": "x", "b": 2, "v": None, "_found": False},
    ]
    comp.delete([("x", 1)])
    assert comp.count_rows() == 1
    with pytest.raises(PrimaryKeyError, match="tuple of 2 values"):
        comp.lookup("x")
    with pytest.raises(PrimaryKeyError, match="has 3 value"):
        comp.lookup([("x", 1, 5)])
    tbl.close()
    comp.close()


@pytest.mark.parametrize(
    ("statement", "line", "column", "text"),
    [
        ("SELEC 1", 1, 1, "SQL syntax error at line 1, column 1 (near 'SELEC 1')"),
        ("SELECT 1 +", 1, 11, "Expected: an expression, found: EOF"),
        ("SELECT *\nFROM nope", 2, 6, "table 'memwal.public.nope' not found"),
        ("SELECT id,\n  nope FROM t", 2, 3, "No field named nope"),
        ("SELECT id, frobnicate(v) FROM t", 1, 12, "Invalid function 'frobnicate'"),
    ],
)
def test_sql_that_does_not_parse_or_plan_is_a_typed_error_with_its_position(
    tmp_path, statement, line, column, text
):
    tbl = mw.create_table(tmp_path / "t", {"id": [1], "v": ["a"]}, primary_key="id")
    ctx = mw.connect()
    ctx.register("t", tbl)
    with pytest.raises(SqlError) as e:
        ctx.sql(statement)
    assert isinstance(e.value, mw.errors.MemWalError) and isinstance(e.value, ValueError)
    assert (e.value.line, e.value.column, e.value.statement) == (line, column, statement)
    assert text in str(e.value)
    tbl.close()


def test_storage_failures_from_lance_are_storage_errors_with_a_hint(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(StorageError, match="a part of the path is a file") as e:
        mw.create_table(a_file / "t", SCHEMA, primary_key="id")
    assert "object_store.rs" not in str(e.value)  # Lance's source location left out
    with pytest.raises(StorageError, match="parent directories can be created"):
        mw.create_table("/proc/no-such-dir/t", SCHEMA, primary_key="id")  # nothing can be made
    plain_http = {
        "aws_endpoint": "http://127.0.0.1:9",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "us-east-1",
    }
    with pytest.raises(StorageError, match="allow_http=true") as e:
        mw.open_table("s3://bucket/t", plain_http)
    assert "Debug source" not in str(e.value)


@pytest.mark.s3
def test_a_missing_bucket_is_a_storage_error_that_says_so(s3_server):
    opts = {**s3_server, "allow_http": "true"}
    opts = {k: v for k, v in opts.items() if k.startswith(("aws_", "allow_"))}
    with pytest.raises(StorageError, match="does not exist"):
        mw.create_table(
            "s3://no-such-bucket-memwal/t", SCHEMA, primary_key="id", storage_options=opts
        )


NOISY = """
import sys
import memwal_sql as mw  # first: Lance reads LANCE_LOG when it is imported
import lance, numpy as np, pyarrow as pa
n = 600
vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.random.rand(n * 8).astype("float32")), 8)
rows = pa.table({"id": pa.array(range(n), pa.int64()), "text": [f"word {i}" for i in range(n)],
                 "vec": vectors})
tbl = mw.create_table(sys.argv[1], rows, primary_key="id")
tbl.create_index("vec", index_type="IVF_PQ", num_partitions=4, num_sub_vectors=2)
tbl.create_index("text", index_type="INVERTED")
tbl.upsert(rows.slice(0, 5))
tbl.flush()
tbl.maintain()  # an index catch-up over few rows: Lance warns of empty IVF partitions
for _ in range(3):
    tbl.vector_search(np.random.rand(8).astype("float32"), "vec", k=3)
tbl.fts("word", "text", k=3)
lance.dataset(sys.argv[1]).to_table(full_text_query="word")  # Lance's own FTS on our table
tbl.close()
"""


def test_the_library_prints_nothing_from_lance_unless_lance_log_is_set(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text(NOISY)
    quiet = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "q")],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # The user's LANCE_LOG wins: the same script then logs Lance's warnings, and still no
    # deprecation warning (the vector search asks for _distance itself).
    loud = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "l")],
        capture_output=True, text=True, env=_env(LANCE_LOG="warn"), timeout=600,
    )  # fmt: skip
    assert loud.returncode == 0 and "WARN" in loud.stderr, loud.stderr
    assert "eprecat" not in loud.stderr


# ---- the command line ----------------------------------------------------------------------------


def test_version_sql_without_tables_a_directory_of_tables_and_explain_as_text(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"memwal {mw.__version__}\n"
    main(["sql", "SELECT 1 + 1 AS two", "-o", "csv"])
    assert capsys.readouterr().out == "two\n2\n"
    data = tmp_path / "data"
    for name, n in (("events", 3), ("users", 2)):
        mw.create_table(data / name, {"id": list(range(n))}, primary_key="id").close()
    (data / "notes").mkdir()  # not a table: left out
    main(["sql", "SELECT count(*) AS n FROM events JOIN users USING (id)", "--table", str(data), "-o", "csv"])  # fmt: skip
    assert capsys.readouterr().out == "n\n2\n"
    main(["sql", "SELECT count(*) AS n FROM e", "--table", str(data / "events"), "--table", f"e={data / 'users'}", "-o", "csv"])  # fmt: skip
    assert capsys.readouterr().out == "n\n2\n"
    main(["sql", "EXPLAIN SELECT * FROM events WHERE id = 1", "--table", str(data / "events")])
    out = capsys.readouterr().out
    assert out.startswith("logical_plan:\n  ") and "\nphysical_plan:\n  " in out
    assert "\\n" not in out and "..." not in out
    with pytest.raises(SystemExit) as e:
        main(["sql", "SELECT 1", "--table", str(data), "--table", str(data / "events")])
    assert e.value.code == 2 and "events is given twice" in capsys.readouterr().err


def test_an_interrupted_ingest_says_how_many_rows_were_written_and_how_to_resume(
    tmp_path, capsys, monkeypatch
):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="id").close()
    rows = tmp_path / "rows.csv"
    rows.write_text("id,v\n" + "".join(f"{i},v{i}\n" for i in range(10)))
    upsert = mw.MemWalTable.upsert
    calls = []

    def interrupted_on_the_third(self, data):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        upsert(self, data)

    monkeypatch.setattr(mw.MemWalTable, "upsert", interrupted_on_the_third)
    with pytest.raises(SystemExit) as e:
        main(["ingest", uri, str(rows), "--batch-rows", "3"])
    err = capsys.readouterr().err
    assert e.value.code == 130
    assert err.startswith("memwal: interrupted: 6 row(s) of this run were written durably")
    assert f"up to row 6 of {rows}" in err and "run the same command again" in err
    assert mw.open_table(uri).count_rows() == 6
    monkeypatch.setattr(mw.MemWalTable, "upsert", upsert)
    main(["ingest", uri, str(rows), "--batch-rows", "3"])
    assert mw.open_table(uri).count_rows() == 10


INTERRUPT_WHILE_LOADING = """
import builtins, os, signal, sys
real = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == "pyarrow":  # the first heavy import: Ctrl-C while memwal loads its libraries
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)
builtins.__import__ = interrupting
from memwal_sql.cli import main
main(["sql", "SELECT 1"])
"""


def test_ctrl_c_while_memwal_loads_exits_130_without_a_traceback():
    p = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_LOADING],
        capture_output=True, text=True, env=_env(), timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert (p.returncode, p.stderr, p.stdout) == (130, "memwal: interrupted\n", "")


def test_the_entry_point_prints_version_and_plain_errors(tmp_path):
    p = subprocess.run([MEMWAL, "--version"], capture_output=True, text=True, env=_env())
    assert (p.returncode, p.stdout, p.stderr) == (0, f"memwal {mw.__version__}\n", "")
    p = subprocess.run([MEMWAL, "sql", "SELECT nope"], capture_output=True, text=True, env=_env())
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("memwal: error: SQL error at line 1, column 8 (near 'nope')")
    assert p.stderr.count("\n") == 1 and "No field named nope" in p.stderr


FORK = """
import warnings
import lance  # loaded first, as in a script that used Lance before Spark
import memwal_sql.spark as mws
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    spark = mws.local_session("fork-warning", **{"spark.driver.memory": "512m"})
    spark.range(3).count()
    spark.stop()
print([str(w.message) for w in seen if "fork" in str(w.message)])
"""


@pytest.mark.spark
@pytest.mark.slow
def test_starting_spark_after_lance_gives_no_fork_safety_warning():
    # Starting the JVM forks with a preexec_fn, which runs Lance's at-fork warning.
    p = subprocess.run(
        [sys.executable, "-c", FORK], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout
