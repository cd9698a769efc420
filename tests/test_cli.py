"""The ``memwal`` command line, run in-process through ``main`` and, for exit codes, the broken
pipe and Lance's log, as the installed entry point."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import memwal_sql as mw
from memwal_sql.cli import main
from memwal_sql.cli.region_specs import parse as parse_spec
from memwal_sql.cli.storage_options import parse as parse_options
from tests.lsm import lance_latest_rows

MEMWAL = str(Path(sys.executable).parent / "memwal")


def run(capsys, *args: str) -> str:
    """stdout of a successful ``memwal args``."""
    main(list(args))
    return capsys.readouterr().out


def fails(capsys, *args: str, code: int = 1) -> str:
    """The one stderr line of a failing ``memwal args``."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(list(args))
    err = capsys.readouterr().err
    assert e.value.code == code, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memwal: error: "), err
    assert "Traceback" not in err and "mw." not in err
    return lines[0]


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def option_args(options: dict[str, str] | None) -> list[str]:
    return [a for k, v in (options or {}).items() for a in ("--storage-options", f"{k}={v}")]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Input files: a CSV to create from, JSON Lines and Parquet updates, a CSV of deletes."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "rows.csv").write_text("id,user,amount\n1,ann,1.5\n2,bob,\n3,,3.0\n")
    (d / "update.jsonl").write_text(
        '{"id": 2, "user": "BOB", "amount": 20.0}\n{"id": 4, "user": "dan", "amount": 4.0}\n'
    )
    pq.write_table(
        pa.table({"id": pa.array([5, 6], pa.int64()), "user": ["eve", "fay"], "amount": [5.0, 6]}),
        d / "more.parquet",
    )
    (d / "gone.csv").write_text("id\n1\n6\n")
    return d


# ---- the operator's round trip, local and on S3 -------------------------------------------------


def test_round_trip(table_root, files, tmp_path, capsys):
    uri, options = table_root
    opts = option_args(options)
    out = run(
        capsys,
        "create", uri, "--primary-key", "id", "--from", str(files / "rows.csv"), "--with-data",
        "--region-spec", "bucket:id:2", *opts,
    )  # fmt: skip
    assert "bucket(id, 2)" in out and "3 rows" in out
    out = run(
        capsys, "ingest", uri, str(files / "update.jsonl"), str(files / "more.parquet"), *opts
    )
    assert out.startswith("upserted 4 row(s) from 2 file(s) in ")
    # The rest of the options from a file: a JSON object (the S3 case) or nothing to add.
    options_file = tmp_path / "s3.json"
    options_file.write_text(json.dumps(options or {}))
    out = run(
        capsys, "ingest", uri, str(files / "gone.csv"), "--delete",
        "--storage-options-file", str(options_file),
    )  # fmt: skip
    assert out.startswith("deleted 2 key(s) from 1 file(s)")

    expected = [
        {"id": 2, "user": "BOB", "amount": 20.0},
        {"id": 3, "user": "", "amount": 3.0},  # an empty CSV field of a string column is text
        {"id": 4, "user": "dan", "amount": 4.0},
        {"id": 5, "user": "eve", "amount": 5.0},
    ]
    query = "SELECT id, user, amount FROM t ORDER BY id"
    out = run(capsys, "sql", query, "--table", f"t={uri}", "--output", "json", *opts)
    assert json_lines(out) == expected

    main(["lookup", uri, "5", "2", "99", "--output", "json", *opts])
    got = capsys.readouterr()
    assert [(r["id"], r["user"]) for r in json_lines(got.out)] == [(5, "eve"), (2, "BOB")]
    assert "found 2 of 3 key(s)" in got.err
    out = run(capsys, "lookup", uri, "3", "--columns", "amount", "--output", "csv", *opts)
    header, row = out.splitlines()
    assert "user" not in header and dict(zip(header.split(","), row.split(",")))["amount"] == "3.0"
    if options:  # a wrong secret: one line naming the options to check
        wrong = option_args({**options, "aws_secret_access_key": "wrong"})
        assert "--storage-options" in fails(capsys, "inspect", uri, *wrong)

    doc = json.loads(run(capsys, "inspect", uri, "--json", *opts))
    assert doc["primary_key"] == ["id"] and "bucket(id, 2)" in doc["region_spec"]
    assert sum(r["unmerged_rows"] for r in doc["regions"]) == 6  # 4 upserts + 2 deletes
    text = run(capsys, "inspect", uri, *opts)
    assert "primary key:  id" in text
    assert all(r["region_id"] in text for r in doc["regions"])

    out = run(capsys, "merge", uri, *opts)
    assert "rows upserted" in out and not out.startswith("merged 0 ")
    out = run(capsys, "gc", uri, *opts)  # the index has not caught up: everything is kept
    assert "generation" in out
    out = run(
        capsys, "maintain", uri, "--iterations", "2", "--base-versions-older-than", "0", *opts
    )
    assert [line.split(":")[0] for line in out.splitlines()] == ["pass 1", "pass 2"]
    doc = json.loads(run(capsys, "inspect", uri, "--json", *opts))
    assert all(r["unmerged_rows"] == 0 and not r["flushed_generations"] for r in doc["regions"])

    out = run(capsys, "sql", query, "--table", f"t={uri}", *opts)
    assert out.splitlines()[:3] == [
        "id | user | amount",
        "---+------+-------",
        " 2 | BOB  |   20.0",
    ]
    assert out.splitlines()[-1] == "(4 rows)"
    assert "no damage found" in run(capsys, "verify", uri, *opts)
    rows = lance_latest_rows(uri, ["id"], options)
    assert rows.select(["id", "user", "amount"]).to_pylist() == expected


# ---- create -------------------------------------------------------------------------------------


def _write_inputs(d: Path) -> dict[str, Path]:
    t = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    d.mkdir()
    pq.write_table(t, d / "t.parquet")
    feather.write_feather(t, d / "t.feather")
    with pa.ipc.new_stream(d / "t.arrow", t.schema) as w:  # the IPC stream format
        w.write_table(t)
    with pa.ipc.new_file(d / "t.ipc", t.schema) as w:
        w.write_table(t)
    (d / "t.ndjson").write_text('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')
    (d / "t.json").write_text('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')
    (d / "t.txt").write_text("id,v\n1,a\n2,b\n")
    (d / "dir").mkdir()
    (d / "dir" / "part-0.csv").write_text("id,v\n1,a\n")
    (d / "dir" / "part-1.csv").write_text("id,v\n2,b\n")
    return {p.name: p for p in d.iterdir()}


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("t.parquet", []),
        ("t.feather", []),
        ("t.arrow", []),
        ("t.ipc", []),
        ("t.ndjson", []),
        ("t.json", []),
        ("t.txt", ["--format", "csv"]),
        ("dir", []),
    ],
)
def test_create_with_data_from_each_format(tmp_path, capsys, name, extra):
    path = _write_inputs(tmp_path / "in")[name]
    uri = str(tmp_path / "t")
    run(capsys, "create", uri, "--primary-key", "id", "--from", str(path), "--with-data", *extra)
    out = run(capsys, "sql", "SELECT id, v FROM t ORDER BY id", "--table", f"t={uri}", "-o", "csv")
    assert out == "id,v\n1,a\n2,b\n"


def test_create_in_a_chosen_file_format(tmp_path, capsys):
    import lance

    path = _write_inputs(tmp_path / "in")["t.parquet"]
    uri = str(tmp_path / "t")
    run(capsys, "create", uri, "--primary-key", "id", "--from", str(path), "--with-data",
        "--data-storage-version", "2.0")  # fmt: skip
    assert lance.dataset(uri).data_storage_version == "2.0"
    out = run(capsys, "sql", "SELECT id, v FROM t ORDER BY id", "--table", f"t={uri}", "-o", "csv")
    assert out == "id,v\n1,a\n2,b\n"


def test_create_with_a_sequence_column_then_ingest_out_of_order(tmp_path, capsys):
    data = tmp_path / "orders.csv"
    data.write_text("id,lsn,v\n1,5,new\n1,3,old\n2,1,b\n")
    uri = str(tmp_path / "t")
    out = run(capsys, "create", uri, "--primary-key", "id", "--from", str(data), "--with-data",
              "--sequence-column", "lsn")  # fmt: skip
    assert "ordered by lsn" in out and "1 older rows" in out
    late = tmp_path / "late.csv"
    late.write_text("id,lsn,v\n1,4,late\n2,2,newer\n")
    run(capsys, "ingest", uri, str(late))
    got = run(capsys, "sql", "SELECT id, v FROM t ORDER BY id", "--table", f"t={uri}", "-o", "csv")
    assert got == "id,v\n1,new\n2,newer\n"
    assert "sequence:     lsn" in run(capsys, "inspect", uri)


def test_create_from_schema_only_then_ingest_keeps_csv_key_types(tmp_path, capsys):
    # The key is a string in the table: a CSV key "007" is read as the string, not 7.
    sample = tmp_path / "sample.jsonl"
    sample.write_text('{"sku": "x", "n": 1}\n')
    uri = str(tmp_path / "t")
    out = run(capsys, "create", uri, "--primary-key", "sku", "--schema-from", str(sample))
    assert "rows" not in out
    assert run(
        capsys, "sql", "SELECT count(*) AS n FROM t", "--table", f"t={uri}", "-o", "csv"
    ) == ("n\n0\n")
    rows = tmp_path / "rows.csv"
    rows.write_text('sku,n\n007,1\n"",2\n')
    run(capsys, "ingest", uri, str(rows), "--batch-rows", "1", "--no-durable")
    out = run(capsys, "lookup", uri, "007", "", "-o", "json")
    assert json_lines(out) == [{"sku": "007", "n": 1}, {"sku": "", "n": 2}]


def test_csv_values_are_read_as_written_unless_null_values_are_named(tmp_path, capsys):
    import memwal_sql as mw

    rows = tmp_path / "rows.csv"
    rows.write_text('id,f,s,d\n1,NaN,NA,2024-01-02\n2,,,\n3,nan,null,\n4,1.5,N/A,\n5,-2,"",\n')

    def stored(uri: str) -> dict[str, list]:
        got = mw.open_table(uri).to_arrow().sort_by("id").to_pydict()
        return {k: ["NaN" if v != v else v for v in vs] for k, vs in got.items()}  # NaN != NaN

    # By default every field of a string column is text, NaN is a float, and an empty field of
    # a number or date column is NULL (pyarrow has nothing else for it).
    created = str(tmp_path / "created")
    run(capsys, "create", created, "--primary-key", "id", "--from", str(rows), "--with-data")
    read_as_written = {
        "id": [1, 2, 3, 4, 5],
        "f": ["NaN", None, "NaN", 1.5, -2.0],
        "s": ["NA", "", "null", "N/A", ""],
        "d": [datetime.date(2024, 1, 2), None, None, None, None],
    }
    assert stored(created) == read_as_written
    # Ingest reads the same way, in the table's types.
    ingested = str(tmp_path / "ingested")
    run(capsys, "create", ingested, "--primary-key", "id", "--schema-from", str(rows))
    run(capsys, "ingest", ingested, str(rows))
    assert stored(ingested) == read_as_written
    # Named markers (exactly as written), and then an empty field, are NULL in every column;
    # quoted text stays text.
    run(capsys, "ingest", ingested, str(rows), "--null-values", "NA,null,NaN")
    assert stored(ingested) == {
        **read_as_written,
        "f": [None, None, "NaN", 1.5, -2.0],
        "s": [None, None, None, "N/A", ""],
    }
    # Only CSV has such markers.
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"id": 1, "f": 1.0, "s": "x", "d": null}\n')
    line = fails(capsys, "ingest", ingested, str(jsonl), "--null-values", "NA", code=2)
    assert "--null-values applies to CSV input" in line


def test_create_enables_memwal_on_an_existing_lance_table(tmp_path, capsys):
    import lance

    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])
    lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=schema), uri)
    out = run(capsys, "create", uri, "--primary-key", "id")
    assert "primary key (id)" in out
    assert json_lines(run(capsys, "lookup", uri, "2", "-o", "json")) == [{"id": 2, "v": "b"}]


@pytest.mark.parametrize(
    ("text", "described"),
    [
        ("bucket:id:8", "bucket = bucket(id, 8)"),
        ("identity:tenant", "bucket = identity(tenant)"),
        ("unsharded", "bucket = unsharded()"),
        ("year:ts", "year = year(ts)"),
        ("month:ts", "month = month(ts)"),
        ("day:ts", "day = day(ts)"),
        ("hour:ts", "hour = hour(ts)"),
        ("truncate:tenant:2", "truncate = truncate(tenant, 2)"),
        ("multi_bucket:tenant,id:4", "multi_bucket = multi_bucket(tenant, id, 4)"),
        ("expression:id:int64:col0 % 10", "expression = col0 % 10 WITH (col0..) = (id) -> int64"),
        (
            "identity:tenant+bucket:id:4+expression:id,ts:int64:col0 + 1",
            "identity = identity(tenant); bucket = bucket(id, 4); "
            "expression = col0 + 1 WITH (col0..) = (id, ts) -> int64",
        ),
        ("bucket:id:2+bucket:tenant:3", "bucket = bucket(id, 2); bucket_2 = bucket(tenant, 3)"),
    ],
)
def test_region_spec_text(text, described):
    assert parse_spec(text).describe() == f"spec 1: {described}"


def test_composed_region_spec_and_composite_key(tmp_path, capsys):
    src = tmp_path / "orders.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"tenant": t, "id": i, "ts": f"2024-0{i}-01T10:00:00", "v": f"{t}{i}"})
            for t in ("acme", "zeta")
            for i in (1, 2, 3)
        )
    )
    uri = str(tmp_path / "t")
    run(
        capsys, "create", uri, "--primary-key", "tenant,id", "--schema-from", str(src),
        "--region-spec", "identity:tenant+month:ts", "--allow-non-key-region-spec",
    )  # fmt: skip
    out = run(capsys, "ingest", uri, str(src))
    assert "upserted 6 row(s) from 1 file(s) in 6 region(s)" in out
    out = run(capsys, "lookup", uri, "zeta,2", "acme, 3", "--columns", "tenant,id,v", "-o", "json")
    assert json_lines(out) == [
        {"tenant": "zeta", "id": 2, "v": "zeta2"},
        {"tenant": "acme", "id": 3, "v": "acme3"},
    ]
    # Deleting by key needs the region-spec columns too, to find the region.
    keys = tmp_path / "keys.csv"
    keys.write_text("tenant,id\nacme,1\n")
    assert "needs the column(s) ts" in fails(capsys, "ingest", uri, str(keys), "--delete")
    keys.write_text("tenant,id,ts\nacme,1,2024-01-01T10:00:00\n")
    run(capsys, "ingest", uri, str(keys), "--delete")
    out = run(capsys, "sql", "SELECT count(*) AS n FROM t", "--table", f"t={uri}", "-o", "csv")
    assert out == "n\n5\n"


# ---- sql over several tables, output formats ----------------------------------------------------


def test_sql_joins_tables(tmp_path, capsys):
    users, orders = tmp_path / "users.csv", tmp_path / "orders.csv"
    users.write_text("id,name\n1,ann\n2,bob\n")
    orders.write_text("oid,uid,total\n10,1,5\n11,1,7\n12,2,1\n")
    for name, src, key in (("u", users, "id"), ("o", orders, "oid")):
        run(
            capsys,
            "create",
            str(tmp_path / name),
            "--primary-key",
            key,
            "--from",
            str(src),
            "--with-data",
        )
    query = (
        "SELECT u.name, sum(o.total) AS total FROM o JOIN u ON o.uid = u.id "
        "GROUP BY u.name ORDER BY u.name"
    )
    tables = ["--table", f"o={tmp_path / 'o'}", "--table", f"u={tmp_path / 'u'}"]
    assert run(capsys, "sql", query, *tables, "-o", "csv") == "name,total\nann,12\nbob,1\n"
    assert run(capsys, "sql", query, *tables).splitlines() == [
        "name | total",
        "-----+------",
        "ann  |    12",
        "bob  |     1",
        "(2 rows)",
    ]


def test_sql_writes_and_delete_where(tmp_path, capsys):
    src = tmp_path / "t.csv"
    src.write_text("id,x,s\n1,1,a\n2,5,b\n3,9,\n4,,c\n")
    uri = str(tmp_path / "t")
    run(capsys, "create", uri, "--primary-key", "id", "--from", str(src), "--with-data")
    table = ["--table", f"t={uri}"]
    assert run(capsys, "sql", "UPDATE t SET x = x * 10 WHERE s = 'b'", *table, "-o", "csv") == (
        "count\n1\n"
    )
    assert run(capsys, "sql", "INSERT INTO t VALUES (5, 50, 'e')", *table, "-o", "csv") == (
        "count\n1\n"
    )
    main(["delete", uri, "--where", "x > 8"])  # 2 (now 50), 3 (9) and 5; NULL x is kept
    assert capsys.readouterr().err == "memwal: deleted 3 row(s)\n"
    rows = run(capsys, "sql", "SELECT id, x FROM t ORDER BY id", *table, "-o", "csv")
    assert rows == "id,x\n1,1\n4,\n"
    refused = fails(capsys, "sql", "DELETE FROM t", *table, "--read-only")
    assert "DELETE is not supported here: this session is read-only" in refused
    assert run(capsys, "sql", "SELECT count(*) AS n FROM t", *table, "-o", "csv") == "n\n2\n"


# ---- maintenance --------------------------------------------------------------------------------


def _table_with_generations(tmp_path: Path, delete: bool = True) -> str:
    import memwal_sql as mw

    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}), primary_key="id"
    )
    tbl.upsert({"id": [2, 3], "v": ["B", "C"]})
    if delete:
        tbl.delete([1])
    tbl.close()
    return uri


def test_compact_rewrites_what_a_merge_left(tmp_path, capsys):
    uri = _table_with_generations(tmp_path, delete=False)
    run(capsys, "merge", uri)  # row 2 deleted in the base fragment, rows 2 and 3 appended
    out = run(capsys, "compact", uri, "--deletion-threshold", "0")
    assert out.startswith("compacted 2 fragment(s) into 1 (base table version")
    assert run(capsys, "compact", uri) == "nothing to compact\n"
    assert lance_latest_rows(uri, ["id"]).column("v").to_pylist() == ["a", "B", "C"]


def test_merge_maintain_watch_gc_verify(tmp_path, capsys):
    uri = _table_with_generations(tmp_path)
    assert run(capsys, "merge", uri).startswith("merged 1 generation(s) from 1 region(s)")
    out = run(capsys, "maintain", uri, "--watch", "0.01", "--iterations", "2")
    lines = out.splitlines()
    assert len(lines) == 2 and all(" pass " in line for line in lines)
    assert "merged 0 generation(s)" in lines[1] and "compacted 0 fragment(s)" in lines[1]
    (region,) = json.loads(run(capsys, "inspect", uri, "--json"))["regions"]
    assert region["flushed_generations"] == [1]  # base version 1 predates the merge
    out = run(capsys, "gc", uri, "--base-versions-older-than", "0", "--keep-manifest-versions", "1")
    assert "generation" in out
    (region,) = json.loads(run(capsys, "inspect", uri, "--json"))["regions"]
    assert region["merged_generation"] == 1 and region["flushed_generations"] == []
    assert "no damage" in run(capsys, "verify", uri)
    assert json.loads(run(capsys, "verify", uri, "--json"))["problems"] == []
    assert lance_latest_rows(uri, ["id"]).column("v").to_pylist() == ["B", "C"]


def test_set_aside_gives_up_a_damaged_last_wal_entry_and_refuses_anything_else(tmp_path, capsys):
    # A damaged last entry not known to be torn (written since the machine started) stops reads
    # and writers with a CorruptWalEntryError whose message names this command.
    import memwal_sql as mw
    from memwal_sql.errors import CorruptWalEntryError
    from memwal_sql.storage import layout

    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())]), primary_key="id"
    )
    w = tbl.writer()
    for i in (1, 2, 3):
        w.upsert({"id": [i], "v": [f"v{i}"]})
    rid, last = w.region_id, w.stats()["next_wal_position"] - 1
    w.release()
    path = layout.wal_entry_path(rid, last)
    data = tbl.store.get(path)
    tbl.store.delete(path)
    tbl.store.put(path, data[:-20])
    with pytest.raises(CorruptWalEntryError, match="memwal set-aside"):
        mw.open_table(uri).to_arrow()
    assert "memwal set-aside" in fails(capsys, "sql", "SELECT * FROM t", "--table", f"t={uri}")
    with pytest.raises(SystemExit) as e:
        main(["verify", uri])
    assert e.value.code == 1 and "wal" in capsys.readouterr().out.lower()
    for args in ([rid, str(last - 1)], [rid, str(last - 2)]):  # reads well: refused
        assert "reads well" in fails(capsys, "set-aside", uri, *args)
    tbl.store.put(layout.wal_entry_path(rid, last + 1), data)  # an entry after it: refused
    assert "cut them off" in fails(capsys, "set-aside", uri, rid, str(last))
    tbl.store.delete(layout.wal_entry_path(rid, last + 1))
    assert "torn_wal" in run(capsys, "set-aside", uri, rid, str(last))
    assert sorted(mw.open_table(uri).to_arrow().column("id").to_pylist()) == [1, 2]
    with mw.open_table(uri).writer(region_id=rid) as w2:
        w2.upsert({"id": [4], "v": ["v4"]})
    assert sorted(mw.open_table(uri).to_arrow().column("id").to_pylist()) == [1, 2, 4]


def test_set_aside_refuses_a_region_or_position_that_cannot_name_an_entry(tmp_path, capsys):
    import memwal_sql as mw

    uri = str(tmp_path / "t")
    mw.create_table(uri, pa.schema([pa.field("id", pa.int64(), False)]), primary_key="id")
    rid = "0b7c0000-0000-0000-0000-000000000000"
    for args, says in (
        (["../../etc", "1"], "region id '../../etc' is not a UUID"),
        ([rid, "0"], "WAL position 0 is out of range"),
        ([rid, "-1"], "WAL position -1 is out of range"),
        ([rid, str(2**64)], f"WAL position {2**64} is out of range"),
    ):
        line = fails(capsys, "set-aside", uri, *args)
        assert says in line and "unexpected" not in line, line
    assert not (tmp_path / "etc").exists() and not (tmp_path / "t" / "_mem_wal").exists()
    # The largest position names an entry: there is none, which is said as such.
    assert "has no WAL entry" in fails(capsys, "set-aside", uri, rid.upper(), str(2**64 - 1))


def test_demo_checks_what_it_wrote(capsys):
    main(["demo", "--rows", "5000", "--regions", "2"])
    assert "MATCH" in capsys.readouterr().out


# ---- options and help ---------------------------------------------------------------------------


def test_storage_options_file_forms(tmp_path):
    env = tmp_path / "s3.env"
    env.write_text("# endpoint\naws_endpoint = http://h:9000\n\nallow_http=true\n")
    js = tmp_path / "s3.json"
    js.write_text('{"aws_region": "eu-west-1", "allow_http": true}')
    assert parse_options([], str(env)) == {"aws_endpoint": "http://h:9000", "allow_http": "true"}
    assert parse_options(["aws_region=us-east-1"], str(js)) == {
        "aws_region": "us-east-1",  # the command line wins
        "allow_http": "true",
    }
    assert parse_options([], None) is None


@pytest.mark.parametrize(
    "command",
    ["create", "ingest", "sql", "lookup", "inspect", "flush", "merge", "compact", "gc", "maintain",
     "verify", "set-aside", "demo"],
)  # fmt: skip
def test_every_command_has_help_with_examples(capsys, command):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "examples:" in out and f"memwal {command}" in out.split("examples:")[1]
    if command != "demo":
        assert "--storage-options" in out


def test_verbose_logs_the_library_on_stderr(tmp_path, capsys):
    import logging

    uri = _table_with_generations(tmp_path)
    log = logging.getLogger("memwal_sql")
    level = log.level
    try:
        main(["inspect", uri])
        assert capsys.readouterr().err == ""
        main(["-v", "merge", uri])
        assert "memwal: INFO memwal_sql.maintenance.merger: merge of" in capsys.readouterr().err
        main(["inspect", "-vv", uri])  # after the command too
        assert log.level == logging.DEBUG
    finally:
        log.setLevel(level)
        log.handlers = [h for h in log.handlers if not getattr(h, "memwal_cli", False)]


# ---- errors: one line on stderr, exit status 1 (2 for a bad command line) -----------------------


@pytest.fixture
def table(tmp_path: Path, files: Path, capsys) -> str:
    uri = str(tmp_path / "t")
    run(
        capsys,
        "create",
        uri,
        "--primary-key",
        "id",
        "--from",
        str(files / "rows.csv"),
        "--with-data",
    )
    return uri


def test_errors(tmp_path, files, table, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    csv = str(files / "rows.csv")
    missing = str(tmp_path / "missing")
    extra = tmp_path / "extra.csv"
    extra.write_text("id,colour\n1,red\n")
    cases = [
        # bad files
        (["ingest", table, str(bad)], 1, "cannot read"),
        (["ingest", table, csv, "--format", "parquet"], 1, "as parquet"),
        (["ingest", table, str(tmp_path / "nope.csv")], 1, "no such file"),
        (["create", missing, "--primary-key", "id", "--from", str(bad)], 1, "cannot read"),
        (["ingest", table, str(tmp_path / "x.xlsx")], 1, "no such file"),
        (["ingest", table, str(extra)], 1, "colour"),
        (["ingest", table, str(files / "update.jsonl"), "--batch-rows", "0"], 2, "--batch-rows"),
        # missing tables
        (["inspect", missing], 1, "no Lance table"),
        (["merge", missing], 1, "memwal create"),
        (["lookup", missing, "1"], 1, "no Lance table"),
        (["sql", "SELECT 1", "--table", f"t={missing}"], 1, "no Lance table"),
        (["create", missing, "--primary-key", "id"], 1, "--schema-from"),
        # storage options
        (["inspect", table, "--storage-options", "aws_region"], 2, "KEY=VALUE"),
        (["inspect", table, "--storage-options-file", missing], 2, "cannot read"),
        # unknown columns
        (["lookup", table, "1", "--columns", "nope"], 1, "nope"),
        (["create", missing, "--primary-key", "key", "--from", csv], 1, "key"),
        (["sql", "SELECT nope FROM t", "--table", f"t={table}"], 1, "nope"),
        # region specs
        (["create", missing, "--primary-key", "id", "--from", csv, "--region-spec", "bucket:id"], 2, "bucket:COL:N"),
        (["create", missing, "--primary-key", "id", "--from", csv, "--region-spec", "hash:id"], 2, "identity:COL"),
        (["create", missing, "--primary-key", "id", "--from", csv, "--region-spec", "day:nope"], 1, "nope"),
        # an existing table
        (["create", table, "--primary-key", "id", "--from", csv], 1, "memwal ingest"),
        # keys, tables, sources
        (["lookup", table, "abc"], 2, "int64"),
        (["sql", "SELECT 1", "--table", str(tmp_path / "9lives")], 2, "NAME=URI"),
        (["sql", "SELEC 1", "--table", f"t={table}"], 1, "SQL syntax error at line 1, column 1"),
        (["create", missing, "--primary-key", "id", "--with-data"], 2, "--from"),
        (["ingest", table, str(extra), "--delete"], 0, None),
        (["ingest", table, str(files / "update.jsonl"), str(tmp_path / "t.csv")], 1, "no such file"),
    ]  # fmt: skip
    for args, code, text in cases:
        if code == 0:
            run(capsys, *args)
            continue
        line = fails(capsys, *args, code=code)
        assert text in line, (args, line)
    # nothing of a failed ingest was written: every file is checked first
    out = run(capsys, "sql", "SELECT id FROM t ORDER BY id", "--table", f"t={table}", "-o", "csv")
    assert out == "id\n2\n3\n"  # key 1 deleted by extra.csv --delete only


def test_usage_errors_are_argparse_s(capsys):
    with pytest.raises(SystemExit) as e:
        main(["lookup"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


# ---- the installed entry point -------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}


def test_entry_point_exit_codes_one_line_errors_and_no_lance_log(tmp_path):
    uri = _table_with_generations(tmp_path, delete=False)
    p = subprocess.run([MEMWAL, "merge", uri], capture_output=True, text=True, env=_env())
    # Lance logs "[ERROR lance::index] Index __lance_mem_wal has no fields" on this merge
    assert p.returncode == 0 and p.stderr == "" and p.stdout.startswith("merged 1 generation(s)")
    p = subprocess.run(
        [MEMWAL, "inspect", str(tmp_path / "missing")], capture_output=True, text=True, env=_env()
    )
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("memwal: error: no Lance table") and p.stderr.count("\n") == 1
    p = subprocess.run(
        [MEMWAL, "inspect", uri, "--storage-options", "secret"],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "secret" not in p.stderr


def test_entry_point_stops_quietly_on_a_broken_pipe(tmp_path):
    uri = _table_with_generations(tmp_path)
    r, w = os.pipe()
    os.close(r)  # the reader is gone before memwal writes anything
    p = subprocess.run(
        [MEMWAL, "inspect", uri, "--json"], stdout=w, stderr=subprocess.PIPE, text=True
    )
    os.close(w)
    assert p.stderr == "" and p.returncode == 1


def test_ctrl_c_stops_a_long_sql_query_at_once(tmp_path):
    uri = _table_with_generations(tmp_path)
    # A nested-loop join that works for many seconds on each batch: DataFusion looks for a
    # signal only between batches.
    query = (
        "SELECT count(*) FROM t, range(5000000) a, range(5000000) b WHERE a.value + b.value = t.id"
    )
    p = subprocess.Popen(
        [MEMWAL, "sql", "--table", f"t={uri}", query],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(6)  # imports take 1-2 s: the query is running
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("memwal sql kept running after Ctrl-C")
    assert p.returncode == 130 and err == "memwal: interrupted\n" and out == ""


def test_snapshot_sql_as_of_and_changes(capsys, tmp_path):
    uri = str(tmp_path / "events")
    mw.create_table(uri, pa.table({"id": [1, 2], "v": ["a", "b"]}), primary_key="id").close()
    token = run(capsys, "snapshot", uri).strip()
    assert token.startswith("mw1.")
    run(capsys, "snapshot", uri, "--tag", "first")
    run(capsys, "sql", "INSERT INTO events VALUES (3, 'c')", "--table", uri)
    run(capsys, "sql", "DELETE FROM events WHERE id = 2", "--table", uri)
    assert "first |" in run(capsys, "snapshot", uri, "--list")
    then = run(capsys, "sql", "SELECT id FROM events ORDER BY id", "--table", uri, "--as-of", token, "-o", "csv")  # fmt: skip
    assert then.split() == ["id", "1", "2"]
    now = run(capsys, "sql", "SELECT id FROM e ORDER BY id", "--table", f"e={uri}", "-o", "csv")  # fmt: skip
    assert now.split() == ["id", "1", "3"]
    out = run(capsys, "changes", uri, "--from", "first", "-o", "json")
    changes = sorted((r["id"], r["_change_type"]) for r in map(json.loads, out.splitlines()))
    assert changes == [(2, "delete"), (3, "insert")]
    target = tmp_path / "c.parquet"
    run(capsys, "changes", uri, "--from", token, "--mode", "all", "--out", str(target))
    assert pq.read_table(target).num_rows == 2
    err = fails(capsys, "sql", "SELECT 1", "--table", f"a={uri}", "--table", f"b={uri}", "--as-of", token, code=2)  # fmt: skip
    assert "NAME=SNAPSHOT" in err
    run(capsys, "snapshot", uri, "--untag", "first")
    assert "no tag 'first'" in fails(capsys, "changes", uri, "--from", "first")


def test_sql_over_a_namespace(capsys, tmp_path):
    ns = mw.namespace(str(tmp_path / "wh"))
    ns.create_table("sales.orders", pa.table({"id": [1, 2], "c": [7, 8]}), primary_key="id").close()
    ns.create_table("sales.items", pa.table({"i": [1], "oid": [2]}), primary_key="i").close()
    out = run(capsys, "sql", "SELECT o.c FROM sales.orders o JOIN sales.items i ON i.oid = o.id",
              "--namespace", ns.root, "-o", "csv")  # fmt: skip
    assert out.split() == ["c", "8"]
    out = run(capsys, "sql", "SELECT count(*) AS n FROM orders", "--namespace", ns.root,
              "--default-schema", "sales", "-o", "csv")  # fmt: skip
    assert out.split() == ["n", "2"]
    assert "--namespace" in fails(capsys, "sql", "SELECT 1", "--default-schema", "x", code=2)
