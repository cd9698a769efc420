"""A scan plan built in one process runs in another (Spark ships it to executors)."""

from __future__ import annotations

import pickle

import pyarrow as pa

import memwal_sql as mw
from memwal_sql.expressions.predicate import Compare
from memwal_sql.read_snapshot import take_read_snapshot
from planner.scan import plan_scan


def test_a_pickled_scan_plan_reads_the_same_snapshot(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        pa.table({"id": pa.array(range(10), pa.int64()), "v": [f"b{i}" for i in range(10)]}),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    tbl.upsert({"id": [2, 15], "v": ["gen", "gen"]})
    tbl.flush()
    tbl.upsert({"id": [3], "v": ["mem"]})
    tbl.delete([4])
    plan = plan_scan(
        take_read_snapshot(tbl),
        tbl.region_spec,
        tbl.schema,
        Compare("id", "<", pa.scalar(100, pa.int64())),
        partitions=2,
    )
    expected = plan.root.to_table().sort_by("id")
    for i in range(plan.root.partitions):  # what it computed while running is not shipped
        list(plan.root.execute(i))
    shipped = pickle.loads(pickle.dumps(plan.root))
    tbl.upsert({"id": [5], "v": ["later"]})  # after the snapshot: not read
    got = pa.concat_tables(
        pa.Table.from_batches(list(shipped.execute(i)), schema=shipped.schema)
        for i in range(shipped.partitions)
    ).sort_by("id")
    assert got.equals(expected)
    assert dict(zip(got["id"].to_pylist(), got["v"].to_pylist()))[3] == "mem"
    assert 4 not in got["id"].to_pylist()
    tbl.close()
