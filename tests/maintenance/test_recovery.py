"""Rows a killed writer left only in its WAL: `memwal inspect` shows them, `maintain` folds
them in once the region is idle, `memwal flush` at once; a slow live writer is never fenced."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.cli import main
from memwal_sql.errors import UnknownRegionError
from memwal_sql.maintenance import recovery

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])

# Durable upserts of 10 rows each; each batch is printed once acknowledged, then it waits to be
# killed (it never closes its writer).
_WRITER = textwrap.dedent("""
    import sys, time
    import memwal_sql as mw
    w = mw.open_table(sys.argv[1]).writer(durable_write=True)
    for i in range(int(sys.argv[2])):
        w.upsert({"k": list(range(i * 10, i * 10 + 10)), "v": ["a"] * 10})
        print(i, flush=True)
    print("done", flush=True)
    time.sleep(600)
""")


def killed_writer(uri: str, batches: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, uri, str(batches)], stdout=subprocess.PIPE, text=True
    )
    try:
        for line in child.stdout:
            if line.strip() == "done":
                break
        else:
            pytest.fail("the writer died before its writes were acknowledged")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL


def inspect_json(capsys, uri: str) -> dict:
    main(["inspect", uri, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def clock(monkeypatch):
    now = [time.time()]
    monkeypatch.setattr(recovery, "_now", lambda: now[0])
    return now


def test_maintain_flushes_and_merges_a_killed_writers_rows_after_the_idle_time(
    tmp_path, capsys, clock
):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="k").close()
    killed_writer(uri, 30)
    (region,) = inspect_json(capsys, uri)["regions"]
    assert (region["unflushed_rows"], region["unflushed_wal_entries"]) == (300, 30)
    assert region["unmerged_rows"] == 0
    main(["inspect", uri])
    assert "300 unflushed WAL row(s)" in capsys.readouterr().out

    tbl = mw.open_table(uri)
    r = tbl.maintain()  # just killed: within the idle time, left alone
    assert (r.recovery.recovered, r.merge.rows_upserted) == ({}, 0)
    clock[0] += 31 * 60
    r = tbl.maintain()
    assert r.ok, r.failures
    assert r.recovery.recovered == {region["region_id"]: 300}
    assert r.merge.rows_upserted == 300
    (region,) = inspect_json(capsys, uri)["regions"]
    assert (region["unflushed_rows"], region["unmerged_rows"]) == (0, 0)
    assert tbl.dataset().count_rows() == 300  # in the base table itself


def test_memwal_flush_folds_them_in_at_once(tmp_path, capsys):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="k").close()
    killed_writer(uri, 3)
    (region,) = inspect_json(capsys, uri)["regions"]
    with pytest.raises(SystemExit):
        main(["flush", uri, "--region", "0b7c0000-0000-0000-0000-000000000000"])
    assert "no region 0b7c0000-" in capsys.readouterr().err
    with pytest.raises(UnknownRegionError):
        mw.open_table(uri).maintenance.flush_regions(["0b7c0000-0000-0000-0000-000000000000"])
    main(["flush", uri, "--region", region["region_id"]])
    assert f"region {region['region_id']}: flushed 30 WAL row(s)" in capsys.readouterr().out
    (region,) = inspect_json(capsys, uri)["regions"]
    assert (region["unflushed_rows"], region["unmerged_rows"]) == (0, 30)
    main(["flush", uri])
    assert "no region has unflushed WAL rows" in capsys.readouterr().out


def test_a_slow_live_writer_is_never_fenced(tmp_path, clock):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, SCHEMA, primary_key="k")
    w = mw.open_table(uri).writer()
    for i in range(4):  # a write every 20 (simulated) minutes, each pass 20 minutes later
        w.upsert({"k": [i], "v": ["slow"]})
        clock[0] = time.time() + 20 * 60
        r = tbl.maintain()
        assert r.recovery.recovered == {} and w.region_id in r.recovery.waiting
    w.upsert({"k": [99], "v": ["still mine"]})  # not fenced
    w.close()
    assert sorted(tbl.to_arrow()["k"].to_pylist()) == [0, 1, 2, 3, 99]


def test_memwal_maintain_takes_the_idle_time_as_an_option(tmp_path, capsys):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="k").close()
    killed_writer(uri, 2)
    main(["maintain", uri])
    assert "flushed 0 WAL row(s) of 0 idle region(s), merged 0 generation(s)" in (
        capsys.readouterr().out
    )
    main(["maintain", uri, "--recover-regions-idle-for", "0"])
    out = capsys.readouterr().out
    assert "flushed 20 WAL row(s) of 1 idle region(s), merged 1 generation(s)" in out
