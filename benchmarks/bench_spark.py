"""Spark benchmark: ingest and read through the memwal data source, against the anchors.

In one run, on ``local[2]`` and the same rows, upserted into a table that already holds
``--base-rows`` rows (a bucketed table of 4 regions; the upserts update a tenth of the base and
insert the rest):

* ingest rows/s through ``memwal_sql.spark.write`` (one task per region, durable writes, each
  task's MemTables flushed), against the in-process writer (``tbl.upsert`` of the same rows in
  the 10,000-row batches Spark hands the sink, flushed), and against Spark writing into a plain
  Lance table with ``merge_insert`` per Arrow batch (the usual alternative; the key has a btree
  index, as the MemWAL table's base has, so the join does not scan the table; a lost commit
  race is retried). Also shown, not a bar: the in-process writer given 65,536-row batches;
* the fixed cost of a Spark write job: ``memwal_sql.spark.write`` of 10 rows, in seconds. The
  default job of 4M rows is large enough that this cost does not dominate; at 1M rows it is
  a fifth of the job;
* the floor of any Python-side sink: the same rows shuffled into one task per region and
  handed to Python workers as Arrow batches that are only counted (what ``memwal_sql.spark.write``
  pays before writing anything; the ``merge_insert`` anchor skips the shuffle);
* read rows/s through ``spark.read.format("memwal")`` (rows reach Spark: ``count`` of every
  column), against ``tbl.to_arrow()`` and against the floor of any Python data source: one
  that only yields the same rows' Arrow batches from a memory-mapped file, in as many
  partitions.

Each measurement is the best of ``--runs`` after one warm-up (Spark's first jobs start its
Python workers); each ingest starts from a freshly created table, whose creation is not
timed. Prints a table of ratios and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from results_file import write_results

import memwal_sql as mw
import memwal_sql.spark as mws

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("user", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("version", pa.int64()),
    ]
)


def rows(n: int, first: int = 0, seed: int = 1) -> pa.Table:
    ids = np.random.default_rng(seed).permutation(n).astype(np.int64) + first
    return pa.table(
        {
            "id": ids,
            "user": pa.array([f"user{u}" for u in ids % 997]),
            "amount": ids * 0.25,
            "version": np.ones(n, dtype=np.int64),
        },
        schema=SCHEMA,
    )


def new_table(work: str, base: pa.Table) -> str:
    uri = tempfile.mkdtemp(dir=work) + "/t"
    mw.create_table(uri, base, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)).close()
    return uri


def merge_insert_partitions(uri: str):
    """A mapInArrow function: each Arrow batch merge-inserted into the Lance table at ``uri``."""

    def write(batches):
        import lance as lance_

        for batch in batches:
            for attempt in range(20):
                try:
                    ds = lance_.dataset(uri)
                    ds.merge_insert(
                        "id"
                    ).when_matched_update_all().when_not_matched_insert_all().execute(
                        pa.Table.from_batches([batch])
                    )
                    break
                except OSError:  # another task committed first: retry on the new version
                    if attempt == 19:
                        raise
                    time.sleep(0.01 * (attempt + 1))
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows]})

    return write


class ArrowFileSource(DataSource):
    """``format("arrow_file")``: the record batches of the Arrow IPC file ``path`` (rows of
    ``SCHEMA``), dealt round-robin to ``partitions`` partitions, and nothing else done."""

    @classmethod
    def name(cls) -> str:
        return "arrow_file"

    def schema(self):
        return from_arrow_schema(SCHEMA)

    def reader(self, schema):
        return ArrowFileReader(self.options["path"], int(self.options["partitions"]))


class ArrowFileReader(DataSourceReader):
    def __init__(self, path: str, partitions: int) -> None:
        self.path, self.count = path, partitions

    def partitions(self):
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition):
        with pa.memory_map(self.path) as f:
            batches = pa.ipc.open_file(f)
            for k in range(partition.value, batches.num_record_batches, self.count):
                yield batches.get_batch(k)


def every_row_to_spark(df) -> None:
    """Run ``df`` so that every value of every column reaches Spark (a count of each)."""
    df.selectExpr(*(f"count({name})" for name in SCHEMA.names)).collect()


def count_batches(batches):
    """A mapInArrow function that only counts its rows: Spark's cost of reaching Python."""
    yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})


def best(fn, runs: int, *, setup=None, warm_up: bool = True) -> float:
    """Best seconds of ``fn`` over ``runs`` (after a warm-up): ``fn(setup())`` when ``setup``
    is given, whose own time (creating a fresh table) is not counted."""

    def once() -> float:
        args = (setup(),) if setup else ()
        t0 = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t0

    if warm_up:
        once()
    return min(once() for _ in range(runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--base-rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/bench_spark.json")
    args = ap.parse_args()
    spark = mws.local_session("bench-spark", **{"spark.driver.memory": "4g"})
    work = tempfile.mkdtemp(prefix="memwal-bench-spark-")
    try:
        base = rows(args.base_rows, seed=2)
        data = rows(args.rows, first=args.base_rows - args.rows // 10)
        df = spark.createDataFrame(data).repartition(8).cache()
        df.count()

        def fresh_table() -> str:
            return new_table(work, base)

        def spark_ingest(uri: str) -> None:
            mws.write(df, uri)

        def in_process(uri: str, batch_rows: int = 10_000) -> None:
            with mw.open_table(uri) as tbl:
                for batch in data.to_batches(max_chunksize=batch_rows):
                    tbl.upsert(batch)

        def in_process_large_batches(uri: str) -> None:
            in_process(uri, batch_rows=65_536)

        ten_rows = spark.createDataFrame(data.slice(0, 10))

        def spark_fixed_cost(uri: str) -> None:
            mws.write(ten_rows, uri)

        def python_floor() -> None:
            df.repartition(4, "id").mapInArrow(count_batches, "n long").collect()

        def fresh_lance_table() -> str:
            uri = tempfile.mkdtemp(dir=work) + "/plain"
            # Indexed on the key as the MemWAL table's base is: merge_insert joins through it.
            lance.write_dataset(base, uri).create_scalar_index("id", "BTREE")
            return uri

        def merge_insert(uri: str) -> None:
            df.mapInArrow(merge_insert_partitions(uri), "n long").collect()

        read_uri = new_table(work, base)
        mws.write(df, read_uri)

        def spark_read() -> None:
            every_row_to_spark(spark.read.format("memwal").load(read_uri))

        def arrow_read() -> None:
            mw.open_table(read_uri).to_arrow()

        spark.dataSource.register(ArrowFileSource)
        latest_file = f"{work}/latest.arrow"
        with pa.OSFile(latest_file, "wb") as f, pa.ipc.new_file(f, SCHEMA) as out:
            for batch in mw.open_table(read_uri).to_arrow().cast(SCHEMA).to_batches(65_536):
                out.write_batch(batch)
        partitions = spark.read.format("memwal").load(read_uri).rdd.getNumPartitions()

        def python_source_floor_read() -> None:
            every_row_to_spark(
                spark.read.format("arrow_file")
                .option("path", latest_file)
                .option("partitions", partitions)
                .load()
            )

        seconds = {
            "spark_write": best(spark_ingest, args.runs, setup=fresh_table),
            "in_process_write": best(in_process, args.runs, setup=fresh_table),
            "in_process_write_large_batches": best(
                in_process_large_batches, args.runs, setup=fresh_table
            ),
            "spark_python_floor": best(python_floor, args.runs),
            "spark_read": best(spark_read, args.runs),
            "to_arrow_read": best(arrow_read, args.runs),
            "python_source_floor_read": best(python_source_floor_read, args.runs),
        }
        # Slow, and slower as the table grows: one run, the Python workers already warm.
        seconds["spark_merge_insert"] = best(
            merge_insert, 1, setup=fresh_lance_table, warm_up=False
        )
        fixed_seconds = best(spark_fixed_cost, args.runs, setup=fresh_table)
        table_rows = mw.open_table(read_uri).count_rows()  # what each read returns
        rps = {
            k: (table_rows if k.endswith("_read") else args.rows) / v for k, v in seconds.items()
        }
        ratios = {
            "spark_write_vs_in_process": rps["spark_write"] / rps["in_process_write"],
            "spark_write_vs_in_process_large_batches": rps["spark_write"]
            / rps["in_process_write_large_batches"],
            "spark_write_vs_merge_insert": rps["spark_write"] / rps["spark_merge_insert"],
            "spark_write_vs_python_floor": rps["spark_write"] / rps["spark_python_floor"],
            # No Python-side sink can beat merge_insert by more than this on this machine.
            "python_floor_vs_merge_insert": rps["spark_python_floor"] / rps["spark_merge_insert"],
            "spark_read_vs_to_arrow": rps["spark_read"] / rps["to_arrow_read"],
            "spark_read_vs_python_source_floor": rps["spark_read"]
            / rps["python_source_floor_read"],
        }
        print(f"\n{args.rows:,} rows upserted into {args.base_rows:,}, local[2], bucket(id, 4)")
        print(f"{'path':<32}{'rows/s':>14}")
        for k, v in rps.items():
            print(f"{k:<32}{v:>14,.0f}")
        print(f"\n{'a Spark write job of 10 rows':<32}{fixed_seconds:>13.3f}s\n")
        for k, v in ratios.items():
            print(f"{k:<40}{v:>8.2f}x")
        write_results(
            args.out,
            {
                "rows": args.rows,
                "base_rows": args.base_rows,
                "rows_per_s": rps,
                "spark_write_fixed_seconds": fixed_seconds,
                "ratios": ratios,
            },
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
