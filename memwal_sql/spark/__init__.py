"""Spark: MemWAL tables as a PySpark source and sink, and query results handed to Spark.

Example:
    ``import memwal_sql.spark as mws; mws.register(spark)``
    ``mws.write(df, uri)``  # each region written by exactly one task
    ``spark.read.format("memwal").load(uri).where("id < 10")``
    ``mws.to_spark(spark, ctx.sql("SELECT ...")).show()``
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import warnings
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa

from memwal_sql.errors import InvalidInputError, InvalidRegionSpecError
from memwal_sql.spark.arrow import as_arrow_table, spark_compatible
from memwal_sql.spark.source import MemWalDataSource, WriteSummary

__all__ = [
    "MemWalDataSource",
    "WriteSummary",
    "local_session",
    "register",
    "to_spark",
    "write",
]

_REGION = "__memwal_region"
_PART = "__memwal_part"


def register(spark: Any) -> None:
    """Make ``format("memwal")`` available to ``spark``'s readers and writers (and turn on
    Spark's filter pushdown into Python data sources, which memwal reads need).

    Example:
        ``register(spark); spark.read.format("memwal").load("/data/events")``
    """
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MemWalDataSource)


def local_session(app: str, master: str = "local[2]", **conf: str) -> Any:
    """A local Spark session ready for MemWAL tables, ``format("memwal")`` registered.

    Spark's Python workers run this interpreter (``PYSPARK_PYTHON``, unless set) and everything
    binds to loopback, so it works on a machine whose host name does not resolve; the UI and
    progress bars are off and Spark logs errors only. ``conf`` adds settings
    (``spark.driver.memory="4g"``).

    Example:
        ``spark = local_session("ingest", **{"spark.driver.memory": "4g"})``
    """
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def to_spark(spark: Any, result: Any) -> Any:
    """A Spark DataFrame of a query result (pyarrow Table, RecordBatch(Reader), DataFusion
    DataFrame), with the types Spark rejects cast to ones it reads (see
    :mod:`memwal_sql.spark.arrow`).

    Example:
        ``to_spark(spark, ctx.sql("SELECT tenant, count(*) FROM t GROUP BY 1"))``
    """
    table = as_arrow_table(result)
    # PySpark 4.3 builds no rows from a table whose first batch is empty (a query's result
    # may start with one): only batches with rows are handed over.
    batches = [b for b in table.to_batches() if b.num_rows]
    table = pa.Table.from_batches(batches, schema=table.schema)
    return spark.createDataFrame(table.cast(spark_compatible(table.schema)))


def write(
    df: Any, uri: str, *, operation: str = "upsert", storage_options: dict[str, str] | None = None
) -> WriteSummary:
    """Write a Spark DataFrame into the table at ``uri`` with one task per region.

    Each row's region is computed in Arrow exactly as the table's writer routes it (Spark's
    own ``hash()`` is another murmur3), the rows are repartitioned so that every region is
    written by one task, and each task returns once its rows are durable. Returns what was
    written (the tasks' reports, gathered by the job's commit).

    Example:
        ``write(spark.read.parquet("events/"), "/data/events")``
    """
    import memwal_sql as mw

    if operation not in ("upsert", "delete"):
        raise InvalidInputError(f"operation must be 'upsert' or 'delete', not {operation!r}")
    options = dict(storage_options or {})
    table = mw.open_table(uri, options or None)
    spec = table.region_spec
    routable = spec is not None and (
        operation == "upsert" or set(spec.source_columns) <= set(table.primary_key)
    )
    out = df
    if routable:
        assert spec is not None
        tagged = df.mapInArrow(_tagger(uri, options), _with_column(df.schema, _REGION))
        regions = _every_region(spec)
        if regions is None:  # values that only the data tells: one pass to find them
            regions = sorted(r[_REGION] for r in tagged.select(_REGION).distinct().collect())
        if regions:
            part = {r: _partition_value(i, len(regions)) for i, r in enumerate(regions)}
            from pyspark.sql import functions as F

            mapping = F.create_map(*[x for r, v in part.items() for x in (F.lit(r), F.lit(v))])
            out = (
                tagged.withColumn(_PART, mapping[F.col(_REGION)])
                .repartition(len(regions), _PART)
                .drop(_REGION, _PART)
            )
    with tempfile.TemporaryDirectory() as d:
        summary_path = os.path.join(d, "summary.json")
        writer = (
            out.write.format("memwal")
            .mode("append")
            .option("operation", operation)
            .option("summary_path", summary_path)
        )
        for k, v in options.items():
            writer = writer.option(k, v)
        writer.save(uri)
        with open(summary_path) as f:
            done = json.load(f)
    return WriteSummary(
        rows=done["rows"],
        regions=tuple(done["regions"]),
        tasks=done["tasks"],
        regions_per_task=tuple(done["regions_per_task"]),
    )


def _tagger(uri: str, options: dict[str, str]) -> Any:
    """A mapInArrow function adding each row's region id (computed on the executors)."""

    def tag(batches: Any) -> Any:
        import memwal_sql as mw
        from memwal_sql.table import region_id_for

        table = mw.open_table(uri, options or None)
        spec = table.region_spec
        if spec is None:  # write() tags rows only for a table it found with a region spec
            raise InvalidRegionSpecError(f"the table at {uri} has no region spec to route by")
        for batch in batches:
            groups = spec.group_rows(table._rows.upserts(batch))
            which = np.empty(batch.num_rows, dtype=np.int32)
            for k, idx in enumerate(groups.values()):
                which[idx] = k
            ids = pa.array([region_id_for(spec, values) for values in groups], pa.string())
            yield batch.append_column(_REGION, ids.take(pa.array(which)))

    return tag


def _every_region(spec: Any) -> list[str] | None:
    """Every region id a spec of bucket and unsharded fields can route to; None for others."""
    from itertools import product

    from memwal_sql.table import region_id_for

    ranges = []
    for f in spec.fields:
        if f.transform == "bucket":
            ranges.append(range(int(f.params["num_buckets"])))
        elif f.transform == "unsharded":
            ranges.append(range(1))
        else:
            return None
    return sorted(region_id_for(spec, values) for values in product(*ranges))


def _with_column(schema: Any, name: str) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([*schema.fields, StructField(name, StringType(), False)])


def _partition_value(index: int, partitions: int) -> int:
    """The smallest non-negative int that Spark's hash partitioning (``repartition(n, col)``:
    ``pmod(murmur3_x86_32(value, seed 42), n)``) sends to partition ``index``."""
    v = 0
    while True:
        h = mmh3.hash(struct.pack("<i", v), seed=42, signed=True)
        if h % partitions == index:  # Python's % is pmod for a positive divisor
            return v
        v += 1
