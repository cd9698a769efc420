"""SQL over a table of every region-spec transform: right rows, no panic, pruned regions.

The spec columns never change for a key (a key lives in one region); `v` carries the updates.

Pruning and lookup routing run inside DataFusion's callbacks, where a nested DataFusion call
panics; date parts are computed in numpy there, and SQL expression specs never prune.
"""

from __future__ import annotations

import datetime

import datafusion
import pyarrow as pa
import pytest

import memwal_sql as mw

N = 120
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("ts", pa.timestamp("us")),
        pa.field("d", pa.date32()),
        pa.field("k", pa.int32()),
        pa.field("s", pa.string()),
        pa.field("v", pa.int64()),
    ]
)
SPECS = {
    "year": mw.RegionSpec.year("d"),
    "month": mw.RegionSpec.month("d"),
    "day": mw.RegionSpec.day("ts"),
    "hour": mw.RegionSpec.hour("ts"),
    "truncate": mw.RegionSpec.truncate("k", 10),
    "truncate_string": mw.RegionSpec.truncate("s", 1),
    "multi_bucket": mw.RegionSpec.multi_bucket(["k", "s"], 4),
    "bucket": mw.RegionSpec.bucket("id", 4),
    "identity": mw.RegionSpec.identity("k"),
    "expression": mw.RegionSpec.expression("col0 % 3", ["id"], "int64"),
    "unsharded": mw.RegionSpec.unsharded(),
}
QUERIES = [
    "d = DATE '2001-03-04'",
    "d >= DATE '2002-01-01'",
    "d IN (DATE '2000-01-01', DATE '2001-03-04')",
    "ts = TIMESTAMP '2000-01-05 07:00:00'",
    "ts < TIMESTAMP '2000-01-02 00:00:00'",
    "k = -17",
    "k BETWEEN -5 AND 25",
    "k IN (1, 2, 3, 4, 5, 6)",
    "k IS NULL",
    "k NOT IN (1, 2, 3, 4)",
    "s = 'b'",
    "s < 'c'",
    "s IN ('a', 'C:\\\\x', 'e', 'f')",
    "id = 7",
    "id IN (1, 2, 3, 50, 51, 999)",
    "id = 7 AND k = 3",
    "d = DATE '2001-03-04' OR k = 5",
    "NOT (k > 0)",
    "v = 2 AND k < 0",
]


def rows(ids: range, version: int) -> pa.Table:
    base = datetime.datetime(2000, 1, 1)
    return pa.table(
        {
            "id": list(ids),
            "ts": [base + datetime.timedelta(hours=7 * i) for i in ids],
            "d": [
                None if i % 11 == 0 else datetime.date(2000 + i % 4, 1 + i % 12, 1 + i % 28)
                for i in ids
            ],
            "k": [None if i % 13 == 0 else (i * 7) % 61 - 30 for i in ids],
            "s": [["a", "b", "C:\\x", "e", None][i % 5] for i in ids],
            "v": [version] * len(ids),
        },
        schema=SCHEMA,
    )


def build(path: str, spec: mw.RegionSpec) -> tuple[mw.MemWalTable, pa.Table]:
    """A table of ``spec`` spread over the base, two generations per region, MemTables and
    deletes, and its latest rows (from a model of the writes, not from the table)."""
    tbl = mw.create_table(
        path, rows(range(N), 0), primary_key="id", region_spec=spec, allow_non_key_region_spec=True
    )
    model = {r["id"]: r for r in rows(range(N), 0).to_pylist()}
    for version, ids in ((1, range(0, N, 3)), (2, range(1, N, 5))):
        tbl.upsert(rows(ids, version))
        model.update({r["id"]: r for r in rows(ids, version).to_pylist()})
        tbl.flush()
    tbl.upsert(rows(range(2, N, 7), 3))
    model.update({r["id"]: r for r in rows(range(2, N, 7), 3).to_pylist()})
    tbl.delete(rows(range(4, N, 9), 0).select(list(dict.fromkeys(["id", *spec.source_columns]))))
    for i in range(4, N, 9):
        model.pop(i)
    return tbl, pa.Table.from_pylist(list(model.values()), schema=SCHEMA)


@pytest.fixture(scope="module", params=sorted(SPECS))
def table_and_model(request, tmp_path_factory):
    tbl, latest = build(str(tmp_path_factory.mktemp(request.param)), SPECS[request.param])
    yield tbl, latest
    tbl.close()


@pytest.mark.parametrize("where", QUERIES)
def test_sql_matches_plain_datafusion(table_and_model, where):
    tbl, latest = table_and_model
    ctx = mw.connect()
    ctx.register("t", tbl)
    plain = datafusion.SessionContext()
    plain.register_record_batches("t", [latest.to_batches()])
    q = f"SELECT * FROM t WHERE {where} ORDER BY id"
    got = ctx.sql(q).to_arrow_table()
    assert got.to_pylist() == plain.sql(q).to_arrow_table().cast(got.schema).to_pylist()
    assert tbl.to_arrow(filter=where).sort_by("id").to_pylist() == got.to_pylist()


def test_equality_on_the_spec_column_reads_only_matching_regions(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        rows(range(N), 0),
        primary_key="id",
        region_spec=mw.RegionSpec.year("d"),
        allow_non_key_region_spec=True,
    )
    tbl.upsert(rows(range(N), 1))
    ctx = mw.connect()
    ctx.register("t", tbl)
    ctx.sql("SELECT count(*) FROM t WHERE d = DATE '2001-03-04'").collect()
    plan = ctx.last_plan("t")
    assert len(plan.kept_regions) == 1 and len(plan.pruned_regions) >= 4
    assert {s.region_id for s in plan.sources_opened()} <= set(plan.kept_regions)
    tbl.close()
