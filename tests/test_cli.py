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
    main(["create", uri, "--from", str(src), "--primary-key", "id",
          "--region-spec", "bucket:id:2"])
    main(["ingest", uri, str(src)])
    main(["inspect", uri, "--json"])
    out = capsys.readouterr().out
    regions = json.loads(out[out.index("[\n"):])
    assert sum(len(r["flushed_generations"]) for r in regions) == len(regions) >= 1
    assert lance_latest_rows(uri, ["id"]).column("v").to_pylist() == ["a", "b", "c"]


def test_errors_are_reported_with_their_type(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(tmp_path / "missing")])
    assert e.value.code == 2
    assert "TableNotFoundError" in capsys.readouterr().err


def test_bad_region_spec_text(tmp_path):
    with pytest.raises(SystemExit, match="bucket:COL:N"):
        main(["create", str(tmp_path / "t"), "--from", "x", "--primary-key", "id",
              "--region-spec", "bucket:id"])


def test_demo_checks_what_it_wrote(capsys):
    main(["demo", "--rows", "20000", "--regions", "2"])
    assert "MATCH" in capsys.readouterr().out


def test_merge_gc_maintain(tmp_path, capsys):
    import memwal_sql as mw

    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}),
                          primary_key="id")
    tbl.upsert({"id": [2, 3], "v": ["B", "C"]})
    tbl.delete([1])
    tbl.close()
    main(["merge", uri])
    assert "merged 1 generation(s)" in capsys.readouterr().out
    main(["maintain", uri, "--base-versions-older-than", "0", "--watch", "0.01",
          "--iterations", "2"])
    main(["inspect", uri, "--json"])
    out = capsys.readouterr().out
    (region,) = json.loads(out[out.index("[\n"):])
    assert region["merged_generation"] == 1 and region["flushed_generations"] == []
    main(["gc", uri])
    assert lance_latest_rows(uri, ["id"]).column("v").to_pylist() == ["B", "C"]
