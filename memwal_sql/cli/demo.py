"""`memwal demo`: stream a realistic upsert workload into a MemWAL table and check the result.

The stream mixes inserts, updates of earlier keys and deletes, routed over bucket regions. At the
end every writer flushes, and the latest row per key as Lance 14's own ``LsmScanner`` reads it
from the files is compared with a numpy model of what was written. Then a few SQL queries run
through DataFusion over the table (with one fresh, unflushed write) and one plan is explained.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from tqdm import tqdm

import memwal_sql as mw
from memwal_sql.interop import lance_scanner

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("user", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("version", pa.int64()),
    ]
)


@dataclass
class DemoResult:
    rows: int
    seconds: float
    live_keys: int
    matches: bool


def _stream(
    rows: int, batch_rows: int, update_frac: float, delete_frac: float, seed: int
) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Yield (upserts, deleted_ids) batches; ids are dense so the model is a numpy array."""
    rng = np.random.default_rng(seed)
    next_id = 0
    version = 0
    produced = 0
    while produced < rows:
        n = min(batch_rows, rows - produced)
        n_upd = int(n * update_frac) if next_id else 0
        ids = np.concatenate(
            [
                np.arange(next_id, next_id + n - n_upd, dtype=np.int64),
                rng.integers(0, max(next_id, 1), n_upd, dtype=np.int64),
            ]
        )
        next_id += n - n_upd
        ids = np.unique(ids)  # one version per key per batch keeps the model exact
        version += 1
        upserts = pa.table(
            {
                "id": ids,
                "user": pa.array([f"user{u}" for u in (ids % 997)]),
                "amount": ids * 0.5 + version,
                "version": np.full(len(ids), version, dtype=np.int64),
            },
            schema=SCHEMA,
        )
        deletes = np.unique(rng.integers(0, next_id, int(n * delete_frac), dtype=np.int64))
        produced += n
        yield upserts, deletes


def run_demo(
    rows: int = 1_000_000,
    regions: int = 4,
    batch_rows: int = 10_000,
    uri: str | None = None,
    durable: bool = True,
) -> DemoResult:
    """Run the demo; returns what it measured. Example: ``run_demo(rows=20_000)``."""
    workdir = None
    if uri is None:
        workdir = tempfile.mkdtemp(prefix="memwal-demo-")
        uri = f"{workdir}/events"
    tbl = mw.create_table(
        uri,
        SCHEMA,
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", regions),
        writer_config=mw.WriterConfig(durable_write=durable, max_memtable_rows=200_000),
    )
    print(f"table {uri}: primary key id, {regions} bucket regions, durable={durable}")
    latest_version = np.zeros(rows + 1, dtype=np.int64)  # 0 = absent
    t0 = time.perf_counter()
    with tqdm(total=rows, unit="row", unit_scale=True, desc="upserting") as bar:
        for upserts, deletes in _stream(rows, batch_rows, 0.30, 0.01, seed=42):
            tbl.upsert(upserts)
            latest_version[upserts.column("id").to_numpy()] = upserts.column("version").to_numpy()
            if len(deletes):
                tbl.delete(pa.table({"id": deletes}))
                latest_version[deletes] = 0
            bar.update(upserts.num_rows)
    writers = list(tbl._writers.values())
    tbl.close()  # flush every MemTable to a generation
    seconds = time.perf_counter() - t0

    print(f"\n{'region':<38}{'epoch':>6}{'rows':>10}{'deletes':>9}{'WAL entries':>12}{'gens':>6}")
    for w in writers:
        s = w.stats()
        print(
            f"{s['region_id']:<38}{s['writer_epoch']:>6}{s['rows_written']:>10}"
            f"{s['deletes']:>9}{s['wal_entries_written']:>12}{len(s['generations']):>6}"
        )

    stored = lance_scanner(tbl).project(["id", "version"]).to_table().sort_by("id")
    expected_ids = np.nonzero(latest_version)[0]
    matches = np.array_equal(stored.column("id").to_numpy(), expected_ids) and np.array_equal(
        stored.column("version").to_numpy(), latest_version[expected_ids]
    )
    print(
        f"\n{rows:,} rows in {seconds:.1f} s = {rows / seconds:,.0f} rows/s "
        f"(durable={durable}, flush included)"
    )
    print(
        f"latest rows read back by Lance's LsmScanner: {stored.num_rows:,}; "
        f"model: {len(expected_ids):,}; {'MATCH' if matches else 'MISMATCH'}"
    )
    matches = bool(matches) and _sql_tour(uri, latest_version)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    return DemoResult(rows, seconds, len(expected_ids), bool(matches))


def _sql_tour(uri: str, latest_version: np.ndarray) -> bool:
    """A few SQL queries over the table through DataFusion, checked against the model."""
    tbl = mw.open_table(uri)
    tbl.upsert(
        pa.table(
            {"id": [0], "user": ["late-writer"], "amount": [1.0], "version": [10**6]}, schema=SCHEMA
        )
    )  # unflushed: visible at once to strong reads
    latest_version[0] = 10**6
    ctx = mw.connect()
    ctx.register("events", tbl)
    queries = [
        "SELECT count(*) AS live_keys, max(version) AS newest FROM events",
        "SELECT user, count(*) AS n, round(sum(amount), 1) AS total FROM events "
        "GROUP BY user ORDER BY n DESC, user LIMIT 3",
        "SELECT id, user, version FROM events WHERE id IN (0, 1, 2) ORDER BY id",
    ]
    ok = True
    for sql in queries:
        print(f"\nSQL> {sql}")
        print(
            ctx.sql(sql).to_arrow_table().to_pandas().to_string(index=False)
            if _has_pandas()
            else ctx.sql(sql).to_arrow_table()
        )
    live = int(np.count_nonzero(latest_version))
    got = ctx.sql("SELECT count(*) AS n FROM events").to_pydict()["n"][0]
    ok &= got == live
    print(f"\ncount(*) = {got:,}, model {live:,}: {'MATCH' if got == live else 'MISMATCH'}")
    print("\nEXPLAIN (memwal-sql exec nodes) of: SELECT * FROM events WHERE id = 12345")
    print(tbl.explain("id = 12345"))
    tbl.close()
    return ok


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def run_spark_demo(rows: int = 200_000, regions: int = 4, uri: str | None = None) -> bool:
    """Spark: ingest a Spark DataFrame into a bucketed table with ``memwal_sql.spark.write``
    (one task per region), read it back with ``spark.read.format("memwal")``, and run one
    Spark SQL query over it; True if every check matches. Example: ``run_spark_demo(10_000)``.
    """
    import memwal_sql.spark as mws

    workdir = None
    if uri is None:
        workdir = tempfile.mkdtemp(prefix="memwal-spark-demo-")
        uri = f"{workdir}/events"
    print("starting Spark (local[2]) ...")
    spark = mws.local_session("memwal-demo")
    try:
        mw.create_table(
            uri, SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", regions)
        ).close()
        ids = np.arange(rows, dtype=np.int64)
        data = pa.table(
            {
                "id": ids,
                "user": pa.array([f"user{u}" for u in ids % 997]),
                "amount": ids * 0.25,
                "version": np.ones(rows, dtype=np.int64),
            },
            schema=SCHEMA,
        )
        t0 = time.perf_counter()
        summary = mws.write(spark.createDataFrame(data), uri)
        seconds = time.perf_counter() - t0
        print(
            f"spark ingest: {summary.rows:,} rows into {len(summary.regions)} regions by "
            f"{sum(1 for n in summary.regions_per_task if n)} tasks (one region each: "
            f"{all(n <= 1 for n in summary.regions_per_task)}) in {seconds:.1f} s"
        )
        df = spark.read.format("memwal").load(uri)
        df.createOrReplaceTempView("events")
        back = df.count()
        top = spark.sql(
            "SELECT user, round(sum(amount), 2) AS total FROM events "
            "WHERE id < 10000 GROUP BY user ORDER BY total DESC LIMIT 3"
        ).collect()
        expected = mw.open_table(uri).to_arrow(filter="id < 10000")
        totals = pa.TableGroupBy(expected, "user").aggregate([("amount", "sum")])
        best = sorted(
            zip(totals["amount_sum"].to_pylist(), totals["user"].to_pylist()), reverse=True
        )[:3]
        sql_ok = [(r["user"], r["total"]) for r in top] == [(u, round(a, 2)) for a, u in best]
        print(
            f"spark.read.format('memwal'): {back:,} rows, written {rows:,}: "
            f"{'MATCH' if back == rows else 'MISMATCH'}"
        )
        print(
            "Spark SQL, top users by amount among ids < 10,000: "
            + ", ".join(f"{r['user']}={r['total']}" for r in top)
            + f" ({'MATCH' if sql_ok else 'MISMATCH'} with the table's own read)"
        )
        return back == rows and sql_ok
    finally:
        spark.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
