"""The memwal Spark data source and sink, against a model of the latest rows."""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
import memwal_sql.spark as mws
from memwal_sql.partitioning.region_spec import RegionField
from tests.lsm import lance_latest_rows

pytestmark = pytest.mark.spark

SCHEMA_DDL = "id bigint, tenant string, v double"
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("tenant", pa.string()),
        pa.field("v", pa.float64()),
    ]
)


def rows(ids, tag: float = 0.0) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {"id": ids, "tenant": [f"t{i % 3}" for i in ids], "v": ids * 1.5 + tag}, schema=SCHEMA
    )


def sorted_rows(t: pa.Table) -> pa.Table:
    return t.select(SCHEMA.names).cast(SCHEMA).sort_by("id")


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, rows(range(300)), primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    tbl.upsert(rows(range(250, 400), 1.0))
    tbl.flush()
    tbl.delete(list(range(40)))
    tbl.upsert(rows(range(390, 420), 2.0))
    tbl.close()
    return uri


def test_a_read_equals_to_arrow_with_and_without_pushed_filters(spark, table):
    tbl = mw.open_table(table)
    got = spark.read.format("memwal").load(table).toArrow()
    assert sorted_rows(got).equals(sorted_rows(tbl.to_arrow()))
    for where, expr in (
        ("id < 100 AND tenant = 't1'", "id < 100 AND tenant = 't1'"),
        ("id IN (5, 50, 260, 415, 999)", "id IN (5, 50, 260, 415, 999)"),
        ("v IS NULL OR id = 3", "v IS NULL OR id = 3"),
        ("NOT (id >= 100)", "NOT (id >= 100)"),
    ):
        got = spark.read.format("memwal").load(table).where(where).toArrow()
        assert sorted_rows(got).equals(sorted_rows(tbl.to_arrow(filter=expr))), where


def test_the_columns_option_reads_only_those_columns_in_its_order(spark, table):
    tbl = mw.open_table(table)
    got = spark.read.format("memwal").option("columns", "v, id").load(table)
    assert got.columns == ["v", "id"]
    want = tbl.to_arrow(columns=["v", "id"], filter="id > 200").sort_by("id")
    assert got.where("id > 200").toArrow().sort_by("id").cast(want.schema).equals(want)


def test_the_columns_option_is_checked_and_each_partition_reads_only_those(table):
    import pickle

    from memwal_sql.spark.source import MemWalDataSource, MemWalReader

    with pytest.raises(mw.errors.InvalidInputError, match="nope"):
        MemWalDataSource({"path": table, "columns": "id, nope"}).schema()
    reader = MemWalReader({"path": table, "columns": "tenant"})
    batches = [
        b
        for p in reader.partitions()
        for b in reader.read(p)  # what each Spark task runs
    ]
    assert {b.schema.names[0] for b in batches} == {"tenant"}
    assert all(b.num_columns == 1 for b in batches)
    _, columns = pickle.loads(reader.partitions()[0].value[0])
    assert columns.names == ["tenant"]
    assert sum(b.num_rows for b in batches) == mw.open_table(table).count_rows()


def test_pushed_key_filters_prune_regions(table):
    # Spark plans a Python data source in a worker process: the reader is driven here the
    # way Spark drives it, and the plan its partitions carry is inspected.
    import pickle

    from pyspark.sql.datasource import EqualTo, StringStartsWith

    from memwal_sql.spark.source import MemWalReader

    def regions_read(filters):
        reader = MemWalReader({"path": table})
        left = list(reader.pushFilters(filters))
        root, _ = pickle.loads(reader.partitions()[0].value[0])
        return left, {s.region_id for s in root.newer}

    left, regions = regions_read([])
    assert left == [] and len(regions) == 4
    unsupported = StringStartsWith(("tenant",), "t1")
    left, regions = regions_read([EqualTo(("id",), 260), unsupported])
    assert left == [unsupported] and len(regions) == 1


def test_batch_upsert_and_delete_match_the_model(spark, table):
    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    new = rows(range(100, 500, 3), 7.0)
    spark.createDataFrame(new).write.format("memwal").mode("append").save(table)
    model.update({r["id"]: r for r in new.to_pylist()})
    gone = pa.table({"id": pa.array(range(100, 200), pa.int64())})
    spark.createDataFrame(gone).write.format("memwal").mode("append").option(
        "operation", "delete"
    ).save(table)
    for k in range(100, 200):
        model.pop(k, None)
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)
    assert sorted_rows(lance_latest_rows(table, ["id"])).equals(expect)  # Lance 14 reads it


def test_overwrite_is_a_typed_error(spark, table):
    with pytest.raises(Exception, match="overwrite"):
        spark.createDataFrame(rows([1])).write.format("memwal").mode("overwrite").save(table)


def test_random_partitionings_lose_and_duplicate_nothing(spark, table):
    # Several tasks per region: they claim regions from each other while they write.
    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    new = rows(np.random.default_rng(3).permutation(np.arange(0, 2000)), 9.0)
    model.update({r["id"]: r for r in new.to_pylist()})
    spark.createDataFrame(new).repartition(6).write.format("memwal").mode("append").save(table)
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)


def test_write_sends_each_region_to_exactly_one_task(spark, table):
    new = rows(range(1000, 3000), 4.0)
    summary = mws.write(spark.createDataFrame(new).repartition(5), table)
    assert summary is not None and summary.rows == new.num_rows
    written = [n for n in summary.regions_per_task if n]
    assert written == [1] * len(summary.regions) and len(summary.regions) == 4
    got = mw.open_table(table).to_arrow(filter="id >= 1000")
    assert sorted_rows(got).equals(sorted_rows(new))


@pytest.mark.parametrize(
    "values",
    [
        pa.array([0, -1, 7, 2**63 - 1, -(2**63), None], pa.int64()),
        pa.array([0, -1, 2**31 - 1, -(2**31), None], pa.int32()),
        pa.array([-32768, -1, 5, None], pa.int16()),
        pa.array([-128, 3, None], pa.int8()),
        # Every tail length (Spark hashes the last len % 4 bytes one by one), multi-byte.
        pa.array(["", "a", "ab", "abc", "abcd", "abcde", "é", "ß€", "日本語の", None]),
        pa.array(["x", "yy", "zzz", None], pa.large_string()),
        pa.array([-719162, 0, 19000, None], pa.date32()),
        pa.array([True, False, None]),
    ],
    ids=lambda a: str(a.type),
)
def test_spark_routes_each_row_to_the_bucket_the_writer_does(spark, values):
    rng = np.random.default_rng(len(values))
    pad = pa.array(rng.integers(-1000, 1000, 200), pa.int32()).cast(values.type, safe=False)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        pad = pa.array([f"k{i}é" * (i % 5) for i in range(200)], values.type)
    data = pa.table({"c": pa.concat_arrays([values, pad]), "id": np.arange(len(values) + 200)})
    spec = mw.RegionSpec.compose(
        RegionField.bucket("c", 7, field_id="b1"), RegionField.bucket("id", 3, field_id="b2")
    )
    index = mws._combination_in_spark(spark.createDataFrame(data), spec, data.schema)
    got = spark.createDataFrame(data).select(index.alias("i")).toArrow().column("i")
    combinations = mws._bucket_combinations(spec)
    expect = [combinations.index(tuple(r.values())) for r in spec.region_values(data).to_pylist()]
    assert got.to_pylist() == expect


def test_write_routes_in_python_when_spark_hashes_the_column_otherwise(spark, table):
    # An int column for the table's bigint key: Spark would hash it as 4 bytes, the writer
    # as 8, so the regions are computed in Arrow on the executors instead.
    new = rows(range(5000, 6000), 5.0)
    df = spark.createDataFrame(new).selectExpr("cast(id as int) as id", "tenant", "v")
    assert mws._combination_in_spark(df, mw.open_table(table).region_spec, SCHEMA) is None
    summary = mws.write(df.repartition(3), table)
    assert [n for n in summary.regions_per_task if n] == [1] * 4
    assert sorted_rows(mw.open_table(table).to_arrow(filter="id >= 5000")).equals(sorted_rows(new))


def test_a_result_that_starts_with_empty_batches_reaches_spark_whole(spark):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    rows = pa.table({"id": [7, 8], "name": ["a", None]}, schema=schema)
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    table = pa.Table.from_batches([empty, empty, *rows.to_batches(), empty, *rows.to_batches()])
    got = mws.to_spark(spark, table).toArrow()
    assert got.column("id").to_pylist() == [7, 8, 7, 8]
    assert got.column("name").to_pylist() == ["a", None, "a", None]


def test_a_sql_result_reaches_spark_with_the_same_rows_and_types(spark, table):
    ctx = mw.connect()
    ctx.register("t", mw.open_table(table))
    result = ctx.sql(
        "SELECT tenant, count(*) AS n, arrow_cast(max(id), 'UInt64') AS top FROM t GROUP BY tenant"
    )
    expected = result.to_arrow_table()
    got = mws.to_spark(spark, result).toArrow().sort_by("tenant")
    expected = expected.sort_by("tenant")
    assert got.column("tenant").to_pylist() == expected.column("tenant").to_pylist()
    assert got.column("n").to_pylist() == expected.column("n").to_pylist()
    assert got.column("top").to_pylist() == expected.column("top").to_pylist()


def test_a_table_takes_a_spark_dataframe(spark, table):
    tbl = mw.open_table(table)
    new = rows(range(5000, 5010), 3.0)
    tbl.upsert(spark.createDataFrame(new))
    assert sorted_rows(tbl.to_arrow(filter="id >= 5000")).equals(sorted_rows(new))
    tbl.close()


def test_streaming_applies_every_micro_batch_exactly_once(spark, table, tmp_path):
    import os

    import pyarrow.parquet as pq

    src, checkpoint = tmp_path / "src", tmp_path / "checkpoint"
    src.mkdir()
    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    for i, (ids, tag) in enumerate([(range(50), 10.0), (range(25, 75), 20.0), (range(30), 30.0)]):
        batch = rows(ids, tag)
        pq.write_table(batch, src / f"part-{i:03d}.parquet")
        # Spark takes files in order of modification time (milliseconds; ties in listing
        # order): files written within one millisecond would be applied in any order.
        os.utime(src / f"part-{i:03d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
        model.update({r["id"]: r for r in batch.to_pylist()})

    def run():
        query = (
            spark.readStream.schema(spark.createDataFrame(rows([1])).schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(src))
            .writeStream.format("memwal")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(table)
        )
        query.awaitTermination(300)
        assert query.exception() is None

    run()
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)

    # A newer write after the last micro-batch, then Spark loses that batch's commit and
    # replays it on restart: the sink recognises the batch and leaves the newer value.
    tbl = mw.open_table(table)
    tbl.upsert(rows([5], 99.0))
    tbl.close()
    model[5] = rows([5], 99.0).to_pylist()[0]
    last = max(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    assert last == 2
    for name in (str(last), f".{last}.crc"):
        if (checkpoint / "commits" / name).exists():
            (checkpoint / "commits" / name).unlink()
    run()
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)


def test_an_applied_batch_delivered_again_after_a_later_one_changes_nothing(table, monkeypatch):
    from memwal_sql.spark import source

    writer = source.MemWalStreamWriter({"path": table, "operation_column": "op"})

    def deliver(batch_id, batch):
        monkeypatch.setattr(source, "stream_batch", lambda: ("query-1", batch_id))
        message = writer.write(iter(batch.to_batches()))
        writer.commit([message], batch_id)
        return message

    def changes(ids, tag, op):
        t = rows(ids, tag)
        return t.append_column("op", pa.array([op] * t.num_rows))

    assert not deliver(7, changes([1, 2, 3], 1.0, "upsert")).skipped
    assert not deliver(
        8, pa.concat_tables([changes([1], 2.0, "upsert"), changes([2], 0.0, "delete")])
    ).skipped
    before = sorted_rows(mw.open_table(table).to_arrow())
    again = deliver(7, changes([1, 2, 3], 1.0, "upsert"))
    assert again.skipped and again.rows == 0
    after = sorted_rows(mw.open_table(table).to_arrow())
    assert after.equals(before)
    got = {r["id"]: r["v"] for r in after.to_pylist() if r["id"] in (1, 2, 3)}
    assert got == {1: 1 * 1.5 + 2.0, 3: 3 * 1.5 + 1.0}  # 2 deleted by batch 8


def test_a_task_killed_mid_write_and_retried_leaves_the_model(spark, table):
    # The first attempt of a task dies (its Python worker exits) after part of its rows were
    # stored; Spark runs it again, and the table ends as if it had run once.
    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    new = rows(range(600, 1600), 5.0)
    model.update({r["id"]: r for r in new.to_pylist()})

    def dying(batches):
        import os
        import time

        from pyspark import TaskContext

        first_attempt = TaskContext.get().attemptNumber() == 0
        for i, batch in enumerate(batches):
            for part in pa.Table.from_batches([batch]).to_batches(max_chunksize=50):
                yield part
                if first_attempt and i == 0:
                    time.sleep(0.05)
            if first_attempt:
                time.sleep(1.0)  # the sink stores what it was given so far
                os._exit(1)

    df = spark.createDataFrame(new).repartition(2).mapInArrow(dying, SCHEMA_DDL)
    df.write.format("memwal").mode("append").save(table)
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)


@pytest.mark.s3
def test_an_s3_table_with_storage_options_as_source_options(spark, s3_server):
    import uuid

    uri = f"s3://memwal/{uuid.uuid4().hex}/t"
    mw.create_table(
        uri,
        rows(range(10)),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
        storage_options=s3_server,
    )
    new = rows(range(5, 20), 1.0)
    writer = spark.createDataFrame(new).write.format("memwal").mode("append")
    reader = spark.read.format("memwal")
    for k, v in s3_server.items():
        writer, reader = writer.option(k, v), reader.option(k, v)
    writer.save(uri)
    expect = pa.concat_tables([rows(range(5)), new])
    assert sorted_rows(reader.load(uri).toArrow()).equals(sorted_rows(expect))
    summary = mws.write(spark.createDataFrame(rows(range(20, 30))), uri, storage_options=s3_server)
    assert summary.rows == 10
    assert mw.open_table(uri, s3_server).count_rows() == 30


def test_register_points_the_workers_at_this_interpreter_unless_another_is_configured(
    spark, monkeypatch
):
    sc = spark.sparkContext
    try:
        # As PySpark leaves a session started without PYSPARK_PYTHON: python3 from PATH.
        monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
        monkeypatch.setattr(sc, "pythonExec", "python3")
        mws.register(spark)
        assert sc.pythonExec == sys.executable
        assert os.environ["PYSPARK_PYTHON"] == sys.executable  # and for a later context

        monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/python")
        sc.pythonExec = "/opt/env/python"
        mws.register(spark)
        assert sc.pythonExec == "/opt/env/python"

        # spark.pyspark.python, which PySpark itself ignores outside spark-submit.
        monkeypatch.delenv("PYSPARK_PYTHON")
        conf = sc.getConf().set("spark.pyspark.python", "/opt/conf/python")
        monkeypatch.setattr(sc, "getConf", lambda: conf)
        sc.pythonExec = "python3"
        mws.register(spark)
        assert sc.pythonExec == "/opt/conf/python" and "PYSPARK_PYTHON" not in os.environ
    finally:
        monkeypatch.undo()
        mws.register(spark)  # the source again with this interpreter, for the other tests
    assert sc.pythonExec == sys.executable


def test_merge_schema_adds_the_dataframes_new_columns(spark, table):
    before = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    new = rows(range(1000, 1010)).append_column("note", pa.array([f"n{i}" for i in range(10)]))
    frame = spark.createDataFrame(new)
    with pytest.raises(Exception, match="note"):  # without the option: the table's schema
        frame.write.format("memwal").mode("append").save(table)
    frame.write.format("memwal").mode("append").option("mergeSchema", "true").save(table)
    tbl = mw.open_table(table)
    assert tbl.schema.field("note").type == pa.string() and tbl.schema.field("note").nullable
    got = {r["id"]: r for r in tbl.to_arrow().to_pylist()}
    assert {k: got[k]["note"] for k in range(1000, 1010)} == {1000 + i: f"n{i}" for i in range(10)}
    assert all(got[k]["note"] is None for k in before)  # rows written before: NULL
    tbl.close()


def test_the_sink_applies_debezium_events(spark, table):
    import json

    def event(op: str, i: int, v: float) -> str:
        row = {"id": i, "tenant": f"t{i % 3}", "v": v}
        before, after = (row, None) if op == "d" else (None, row)
        return json.dumps({"payload": {"op": op, "before": before, "after": after,
                                       "source": {"connector": "postgresql", "lsn": i}}})  # fmt: skip

    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    values = [event("c", 2000 + i, 1.0) for i in range(20)]
    values += [event("u", 2000 + i, 2.0) for i in range(0, 20, 2)]
    values += [event("d", 2000 + i, 0.0) for i in range(0, 20, 4)] + [None]
    values += [event("d", 300, 0.0), event("u", 301, 9.0)]
    frame = spark.createDataFrame([(v,) for v in values], "value string").coalesce(1)
    frame.write.format("memwal").mode("append").option("format", "debezium").save(table)
    for i in range(20):
        model[2000 + i] = {
            "id": 2000 + i,
            "tenant": f"t{(2000 + i) % 3}",
            "v": 2.0 if i % 2 == 0 else 1.0,
        }
    for i in range(0, 20, 4):
        model.pop(2000 + i)
    model.pop(300)
    model[301] = {"id": 301, "tenant": "t1", "v": 9.0}
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)


def test_operation_update_changes_only_the_dataframes_columns(spark, table):
    model = {r["id"]: r for r in mw.open_table(table).to_arrow().to_pylist()}
    part = spark.createDataFrame([(i, float(-i)) for i in range(250, 260)] + [(5000, 1.0)],
                                 "id long, v double")  # fmt: skip
    part.write.format("memwal").mode("append").option("operation", "update").save(table)
    for i in range(250, 260):
        model[i] = {**model[i], "v": float(-i)}  # tenant kept
    model[5000] = {"id": 5000, "tenant": None, "v": 1.0}
    expect = pa.Table.from_pylist(sorted(model.values(), key=lambda r: r["id"]), schema=SCHEMA)
    assert sorted_rows(mw.open_table(table).to_arrow()).equals(expect)


def test_the_newer_rows_task_runs_first_and_a_base_task_builds_no_versions(table, monkeypatch):
    # Spark runs a reader's partitions in the order they are listed, each in some Python
    # worker. The newer rows' task (the one that finds every key's newest version) comes
    # first; a task of a base part, in a worker that has no versions, drops the base rows
    # newer sources hold (updates and deletes) by one set of their keys: no versions are
    # computed there (counted), and the tasks together return to_arrow's rows.
    import pickle

    from exec_nodes import dedup
    from exec_nodes.base_source import BaseSourceExec
    from memwal_sql.spark.source import MemWalReader

    # As for a base too big for the cached key index (no row mask: each batch is probed).
    monkeypatch.setattr(BaseSourceExec, "uses_key_index", lambda self, keys=None: False)
    computed = []
    real_of = dedup.Versions.of
    monkeypatch.setattr(
        dedup.Versions, "of", lambda *a, **k: computed.append(1) or real_of(*a, **k)
    )
    reader = MemWalReader({"path": table})
    parts = reader.partitions()
    n = pickle.loads(parts[0].value[0])[0].partitions
    assert [p.value[1] for p in parts] == [n - 1, *range(n - 1)] and n >= 2
    base_rows = [b for p in parts[1:] for b in reader.read(p)]
    assert computed == []
    newer_rows = list(reader.read(parts[0]))
    assert computed != []
    got = pa.Table.from_batches(base_rows + newer_rows)
    assert sorted_rows(got).equals(sorted_rows(mw.open_table(table).to_arrow()))
    assert not set(got.column("id").to_pylist()) & set(range(40))  # deleted in a generation


def test_a_debezium_stream_out_of_order_is_ordered_by_the_sequence_column(spark, tmp_path):
    """Micro-batches deliver older events after newer ones (a Kafka partition replayed, two
    connectors); the table's sequence column (filled from ``source.lsn``) decides."""
    import json
    import random

    uri = str(tmp_path / "seq")
    schema = pa.schema([*SCHEMA, pa.field("lsn", pa.int64())])
    mw.create_table(
        uri, schema, primary_key="id", sequence_column="lsn",
        region_spec=mw.RegionSpec.bucket("id", 2),
    ).close()  # fmt: skip
    rng = random.Random(7)
    events = []
    for lsn in range(1, 301):
        i = rng.randrange(40)
        op = rng.choice("cud")
        row = {"id": i, "tenant": f"t{i % 3}", "v": float(lsn)}
        before, after = (row, None) if op == "d" else (None, row)
        events.append({"op": op, "before": before, "after": after, "source": {"lsn": lsn}})
    newest: dict[int, dict] = {}
    for e in events:  # the model: each key's event with the highest lsn
        key = (e["after"] or e["before"])["id"]
        newest[key] = e
    expect = sorted(
        ({**e["after"], "lsn": e["source"]["lsn"]} for e in newest.values() if e["op"] != "d"),
        key=lambda r: r["id"],
    )
    rng.shuffle(events)
    src = tmp_path / "events"
    src.mkdir()
    for n in range(6):
        path = src / f"part-{n}.json"
        path.write_text("\n".join(json.dumps(e) for e in events[n * 50 : (n + 1) * 50]))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    query = (
        spark.readStream.option("maxFilesPerTrigger", 2)
        .text(str(src))
        .writeStream.format("memwal")
        .option("format", "debezium")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(uri)
    )
    query.awaitTermination(300)
    assert query.exception() is None
    got = mw.open_table(uri).to_arrow().sort_by("id").to_pylist()
    assert got == expect
    assert spark.read.format("memwal").load(uri).toArrow().sort_by("id").to_pylist() == expect
    # Deletes carry their sequence: one older than its row changes nothing.
    first, second = expect[0], expect[1]
    gone = [(first["id"], first["lsn"] - 1), (second["id"], second["lsn"] + 1)]
    frame = spark.createDataFrame(gone, "id bigint, lsn bigint")
    frame.write.format("memwal").mode("append").option("operation", "delete").save(uri)
    got = mw.open_table(uri).to_arrow().sort_by("id").to_pylist()
    assert got == [first, *expect[2:]]


def test_a_namespace_table_is_read_and_written_by_its_id(spark, tmp_path):
    ns = mw.namespace(str(tmp_path / "wh"))
    ns.create_table("sales.orders", rows(range(10)), primary_key="id").close()
    df = spark.createDataFrame(rows(range(5, 15), 3.0).to_pandas())
    df.write.format("memwal").option("namespace", ns.root).mode("append").save("sales.orders")
    got = spark.read.format("memwal").option("namespace", ns.root).load("sales.orders")
    want = ns.open_table("sales.orders")
    assert sorted_rows(got.toArrow()).equals(sorted_rows(want.to_arrow()))
    assert want.count_rows() == 15
    want.close()
