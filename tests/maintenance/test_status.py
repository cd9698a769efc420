import time
from datetime import timedelta

import pyarrow as pa

import memwal_sql as mw
from memwal_sql.maintenance.status import region_status


def test_status_reports_lag_rows_and_storage_until_maintenance_clears_them(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"),
        pa.table({"id": pa.array([0], pa.int64()), "v": ["x"]}),
        primary_key="id",
    )
    with tbl.writer() as w:
        w.upsert({"id": [1, 2, 3], "v": ["a", "b", "c"]})
        w.flush()
        w.upsert({"id": [3, 4], "v": ["C", "d"]})
        w.delete([1])
    time.sleep(0.05)
    (before,) = region_status(tbl)
    assert before.flushed_generations == [1, 2]
    assert before.unmerged_generations == 2 and before.unmerged_rows == 6  # 3 + 2 + 1 tombstone
    assert before.merge_lag_seconds > 0
    assert before.wal_entries >= 2
    assert all(before.storage_bytes[k] > 0 for k in ("wal", "generations", "manifests"))

    tbl.maintain(base_versions_older_than=timedelta(0))
    (after,) = region_status(tbl)
    assert after.merged_generation == 2 and after.unmerged_generations == 0
    assert after.unmerged_rows == 0 and after.merge_lag_seconds == 0
    assert after.storage_bytes["generations"] == 0  # merged and collected
    assert after.storage_bytes["wal"] < before.storage_bytes["wal"]
