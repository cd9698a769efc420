import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memwal_sql.cli import main
from tests.lsm import lance_latest_rows


def test_create_ingest_inspect(tmp_path, capsys):
    src = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}), src)
    uri = str(tmp_path / "t")
    main(["create", uri, "--from", str(src), "--primary-key", "id", "--region-spec", "bucket:id:2"])
    main(["ingest", uri, str(src)])
    main(["inspect", uri, "--json"])
    out = capsys.readouterr().out
    regions = json.loads(out[out.index("[\n") :])
    assert sum(len(r["flushed_generations"]) for r in regions) == len(regions) >= 1
    assert lance_latest_rows(uri, ["id"]).column("v").to_pylist() == ["a", "b", "c"]


def test_errors_are_reported_with_their_type(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(tmp_path / "missing")])
    assert e.value.code == 2
    assert "TableNotFoundError" in capsys.readouterr().err


def test_bad_region_spec_text(tmp_path):
    with pytest.raises(SystemExit, match="bucket:COL:N"):
        main(
            [
                "create",
                str(tmp_path / "t"),
                "--from",
                "x",
                "--primary-key",
                "id",
                "--region-spec",
                "bucket:id",
            ]
        )


def test_demo_checks_what_it_wrote(capsys):
    main(["demo", "--rows", "20000", "--regions", "2"])
    assert "MATCH" in capsys.readouterr().out


def test_merge_gc_maintain(tmp_path, capsys):
    import memwal_sql as mw

    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}), primary_key="id"
    )
    tbl.upsert({"id": [2, 3], "v": ["B", "C"]})
    tbl.delete([1])
    tbl.close()
    main(["merge", uri])
    assert "merged 1 generation(s)" in capsys.readouterr().out
    main(
        ["maintain", uri, "--base-versions-older-than", "0", "--watch", "0.01", "--iterations", "2"]
    )
    main(["inspect", uri, "--json"])
    out = capsys.readouterr().out
    (region,) = json.loads(out[out.index("[\n") :])
    assert region["merged_generation"] == 1 and region["flushed_generations"] == []
    main(["gc", uri])
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
    w._release_at_exit()
    path = layout.wal_entry_path(rid, last)
    data = tbl.store.get(path)
    tbl.store.delete(path)
    tbl.store.put(path, data[:-20])
    with pytest.raises(CorruptWalEntryError, match="memwal set-aside"):
        mw.open_table(uri).to_arrow()
    for args in ([rid, str(last - 1)], [rid, str(last - 2)]):  # reads well: refused
        with pytest.raises(SystemExit) as e:
            main(["set-aside", uri, *args])
        assert e.value.code == 2 and "InvalidInputError" in capsys.readouterr().err
    tbl.store.put(layout.wal_entry_path(rid, last + 1), data)  # an entry after it: refused
    with pytest.raises(SystemExit):
        main(["set-aside", uri, rid, str(last)])
    assert "cut them off" in capsys.readouterr().err
    tbl.store.delete(layout.wal_entry_path(rid, last + 1))
    main(["set-aside", uri, rid, str(last)])
    assert "torn_wal" in capsys.readouterr().out
    assert sorted(mw.open_table(uri).to_arrow().column("id").to_pylist()) == [1, 2]
    with mw.open_table(uri).writer(region_id=rid) as w2:
        w2.upsert({"id": [4], "v": ["v4"]})
    assert sorted(mw.open_table(uri).to_arrow().column("id").to_pylist()) == [1, 2, 4]
