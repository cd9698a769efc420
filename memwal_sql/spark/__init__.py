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
from typing import TYPE_CHECKING, Any

import mmh3
import numpy as np
import pyarrow as pa

from memwal_sql.errors import InvalidInputError, InvalidRegionSpecError
from memwal_sql.spark.arrow import as_arrow_table, spark_compatible
from memwal_sql.spark.source import MemWalDataSource, WriteSummary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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


def register(spark: SparkSession) -> None:
    """Make ``format("memwal")`` available to ``spark``'s readers and writers (and turn on
    Spark's filter pushdown into Python data sources, which memwal reads need).

    Spark's Python workers run this interpreter unless ``PYSPARK_PYTHON`` or
    ``spark.pyspark.python`` names another, so a session started from a venv's python without
    activating the venv finds memwal_sql in its workers.

    Example:
        ``register(spark); spark.read.format("memwal").load("/data/events")``
    """
    _workers_run_this_interpreter(spark)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MemWalDataSource)


def _workers_run_this_interpreter(spark: SparkSession) -> None:
    """Point the workers of ``spark`` at ``sys.executable`` when nothing else is configured.

    PySpark fixes the workers' interpreter when its context starts, from ``PYSPARK_PYTHON`` or
    else ``python3`` on PATH (a Python without memwal_sql unless the venv is activated); only
    spark-submit turns ``spark.pyspark.python`` into ``PYSPARK_PYTHON``, so it is applied here.
    The data source and every Python function registered after this run the interpreter set.
    """
    sc = spark.sparkContext
    configured = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python")
    if configured is None:
        # Also for a context this process starts later (after spark.stop()).
        os.environ["PYSPARK_PYTHON"] = sys.executable
    sc.pythonExec = configured or sys.executable


def local_session(app: str, master: str = "local[2]", **conf: str) -> SparkSession:
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
    with warnings.catch_warnings():
        # Starting the JVM forks with a preexec_fn, which runs Lance's at-fork warning when
        # Lance is loaded; the child execs java at once and never touches Lance.
        warnings.filterwarnings("ignore", "lance is not fork-safe", UserWarning)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def to_spark(spark: SparkSession, result: Any) -> DataFrame:
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
    df: DataFrame,
    uri: str | os.PathLike[str],
    *,
    operation: str = "upsert",
    storage_options: dict[str, str] | None = None,
) -> WriteSummary:
    """Write a Spark DataFrame into the table at ``uri`` with one task per region.

    Each row's region is computed exactly as the table's writer routes it: by Spark itself
    for bucket specs on columns Spark hashes as Lance does (integers, strings, dates,
    booleans), otherwise in Arrow on the executors. The rows are repartitioned so that every
    region is written by one task, and each task returns once its rows are durable. Returns
    what was written (the tasks' reports, gathered by the job's commit).

    Example:
        ``write(spark.read.parquet("events/"), "/data/events")``
    """
    import memwal_sql as mw
    from memwal_sql.partitioning.region_spec import region_id_for

    if operation not in ("upsert", "delete"):
        raise InvalidInputError(f"operation must be 'upsert' or 'delete', not {operation!r}")
    uri = os.fspath(uri)
    options = dict(storage_options or {})
    table = mw.open_table(uri, options or None)
    spec = table.region_spec
    routable = spec is not None and (operation == "upsert" or spec.routes_by_key(table.primary_key))
    out = df
    if routable:
        assert spec is not None
        combinations = _bucket_combinations(spec)
        in_spark = _combination_in_spark(df, spec, table.schema) if combinations else None
        if in_spark is not None:  # no Python pass before the shuffle
            assert combinations is not None
            out = _one_task_per_value(df, in_spark, list(range(len(combinations))))
        else:
            tagged = df.mapInArrow(_tagger(uri, options), _with_column(df.schema, _REGION))
            if combinations is not None:
                regions = sorted(region_id_for(spec, values) for values in combinations)
            else:  # values that only the data tells: one pass to find them
                regions = sorted(r[_REGION] for r in tagged.select(_REGION).distinct().collect())
            if regions:
                from pyspark.sql import functions as F

                out = _one_task_per_value(tagged, F.col(_REGION), regions).drop(_REGION)
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
        from memwal_sql.partitioning.region_spec import region_id_for

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


def _bucket_combinations(spec: Any) -> list[tuple[int, ...]] | None:
    """Every region-value tuple of a spec of bucket and unsharded fields (None for others),
    in the order :func:`_combination_in_spark` numbers them."""
    from itertools import product

    ranges = []
    for f in spec.fields:
        if f.transform == "bucket":
            ranges.append(range(int(f.params["num_buckets"])))
        elif f.transform == "unsharded":
            ranges.append(range(1))
        else:
            return None
    return list(product(*ranges))


# Spark's hash() is Lance's bucket hash (murmur3 x86_32, strings hashed as Spark's
# hashUnsafeBytes) with seed 42 instead of 0, and hashes each further argument with the
# previous result as its seed. This int hashes to 0 under seed 42, so
# hash(lit(_SEED_ZERO), c) is Lance's hash of c.
_SEED_ZERO = -1693959553

# Arrow types whose values Spark hashes exactly as Lance 14 does, and their Spark type names.
_HASHED_ALIKE = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.date32(): "date",
    pa.bool_(): "boolean",
}


def _combination_in_spark(df: Any, spec: Any, schema: pa.Schema) -> Any:
    """A Spark column with each row's index in :func:`_bucket_combinations`, computed by Spark
    bit-exactly as the writer routes the row; None when a bucket column's type is not one
    Spark hashes as Lance does (or differs from the table's)."""
    from pyspark.sql import functions as F

    spark_types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    index, stride = F.lit(0), 1
    for f in reversed(spec.fields):
        if f.transform == "unsharded":
            continue
        (column,) = f.source_columns
        if column not in schema.names:
            return None
        arrow_type = schema.field(column).type
        if arrow_type not in _HASHED_ALIKE or spark_types.get(column) != _HASHED_ALIKE[arrow_type]:
            return None
        h = F.hash(F.lit(_SEED_ZERO), F.col(column)).bitwiseAND(F.lit(0x7FFFFFFF))
        n = int(f.params["num_buckets"])
        index = index + (h % F.lit(n)) * F.lit(stride)
        stride *= n
    return index


def _one_task_per_value(df: Any, value: Any, values: list[Any]) -> Any:
    """``df`` repartitioned so that the rows of each of ``values`` (of the column ``value``)
    land in a partition of their own."""
    from pyspark.sql import functions as F

    part = {v: _partition_value(i, len(values)) for i, v in enumerate(values)}
    mapping = F.create_map(*[x for v, p in part.items() for x in (F.lit(v), F.lit(p))])
    return df.withColumn(_PART, mapping[value]).repartition(len(values), _PART).drop(_PART)


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
