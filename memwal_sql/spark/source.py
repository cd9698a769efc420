"""The ``memwal`` Python Data Source: MemWAL tables as a Spark source and batch sink.

Read: the driver takes one snapshot of the table and plans the scan (pushed filters become the
planner's predicate tree: region pruning, exact filtering of every source); each Spark input
partition carries that plan and one of its partitions (the newer sources, or a group of base
fragments), so every executor reads the same snapshot. Write: each task upserts (or deletes)
its Arrow batches through the routed writer, durably, and returns only once they are stored;
a task fenced by another task writing the same region claims the region again and goes on.

Options: ``consistency`` (``strong``/``eventual``), ``asOf`` (a snapshot token: the rows of
that pinned snapshot), ``partitions`` (base fragment groups),
``columns`` (a comma-separated list: only those are read; PySpark's Python data sources get no
column pruning from Spark), ``operation`` (``upsert``/``update``/``delete``: ``update`` changes
only the DataFrame's columns, see ``MemWalTable.update``), ``mergeSchema`` (``true``:
a write first adds the DataFrame's columns the table lacks, nullable), ``format``
(``debezium``: each row is a change event, JSON in ``value_column``, default ``value``, or the
envelope's own ``op``/``before``/``after`` columns); ``readChangeFeed`` (``true``: the change
feed, streamed or read in one batch, see :mod:`memwal_sql.spark.stream`); every other option
is a storage option (``aws_*``...).

Example:
    ``memwal_sql.spark.register(spark); spark.read.format("memwal").load(uri)``
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from memwal_sql.errors import InvalidInputError, ObjectExistsError, WriterFencedError
from memwal_sql.expressions.predicate import And, Predicate
from memwal_sql.spark.arrow import spark_compatible, to_spark_batch
from memwal_sql.spark.filters import spark_predicate
from memwal_sql.spark.options import open_table as _open
from memwal_sql.spark.options import option
from memwal_sql.spark.options import read_schema as _read_schema
from memwal_sql.spark.stream import (
    MemWalChangeReader,
    MemWalStreamReader,
    change_schema,
    reads_change_feed,
)

if TYPE_CHECKING:
    from memwal_sql.read_snapshot import ReadAt
    from memwal_sql.table import MemWalTable

_FENCED_RETRIES = 30
_log = logging.getLogger(__name__)


class MemWalDataSource(DataSource):
    """``format("memwal")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "memwal"

    def schema(self) -> StructType:
        options = dict(self.options)
        columns = _read_schema(_open(options), options)
        if reads_change_feed(options):
            columns = change_schema(columns)
        return from_arrow_schema(spark_compatible(columns))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = dict(self.options)
        if reads_change_feed(options):
            return MemWalChangeReader(options)
        return MemWalReader(options)

    def streamReader(self, schema: StructType) -> MemWalStreamReader:
        options = dict(self.options)
        if not reads_change_feed(options):
            # Spark asks a Python source for its schema before it says whether it streams it.
            raise InvalidInputError(
                "a memwal stream is the table's change feed: add "
                ".option('readChangeFeed', 'true') to spark.readStream"
            )
        return MemWalStreamReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> MemWalStreamWriter:
        if overwrite:
            raise InvalidInputError(
                "outputMode('complete') is not supported: a MemWAL table "
                "takes upserts and deletes; use outputMode('append')"
            )
        if _change_format(dict(self.options)) is None:
            _merge_schema(dict(self.options), schema)
        return MemWalStreamWriter(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MemWalWriter:
        if overwrite:
            raise InvalidInputError(
                "mode('overwrite') is not supported: a MemWAL table takes upserts and deletes; "
                "use mode('append') (upsert) or .option('operation', 'delete')"
            )
        options = dict(self.options)
        operation = options.get("operation", "upsert")
        if operation not in ("upsert", "update", "delete"):
            raise InvalidInputError(
                f"operation must be 'upsert', 'update' or 'delete', not {operation!r}"
            )
        change_format = _change_format(options)
        if change_format is not None:
            operation = change_format
        elif operation != "delete":
            _merge_schema(options, schema)
        return MemWalWriter(options, operation)


def _change_format(options: dict[str, str]) -> str | None:
    """The ``format`` of change events the sink applies (``debezium``), if any."""
    change_format = options.get("format")
    if change_format not in (None, "debezium"):
        raise InvalidInputError(f"format must be 'debezium', not {change_format!r}")
    return change_format


def _merge_schema(options: dict[str, str], schema: StructType) -> None:
    """With ``mergeSchema`` true, add the DataFrame's columns the table lacks (nullable, in
    Arrow's types for Spark's), once on the driver before any task writes (Delta's option)."""
    merge = options.get("mergeSchema", options.get("mergeschema", "false")).lower()
    if merge not in ("true", "false"):
        raise InvalidInputError(f"mergeSchema must be 'true' or 'false', not {merge!r}")
    if merge == "false":
        return
    table = _open(options)
    try:
        new = [f for f in to_arrow_schema(schema) if f.name not in table.schema.names]
        if new:
            table.add_columns([f.with_nullable(True) for f in new])
    finally:
        table.close()


class MemWalReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.predicate: Predicate | None = None

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        schema = _open(self.options).schema
        taken = []
        for f in filters:
            p = spark_predicate(f, schema)
            if p is None:
                yield f  # Spark applies it
            else:
                taken.append(p)
        if taken:
            self.predicate = taken[0] if len(taken) == 1 else And(tuple(taken))

    def partitions(self) -> Sequence[InputPartition]:
        from memwal_sql.read_snapshot import take_read_snapshot
        from planner.scan import plan_scan

        table = _open(self.options)
        snapshot = take_read_snapshot(table, _read_at(table, self.options))
        fragments = len(snapshot.dataset.get_fragments())
        parts = int(self.options.get("partitions", max(1, min(fragments, 32))))
        plan = plan_scan(
            snapshot, table.region_spec, table.schema, self.predicate, partitions=parts
        )
        columns = _read_schema(table, self.options)
        # A task may run in a Python worker that reads base parts only: it probes the newer
        # rows' keys rather than building their newest versions (see DeduplicateExec).
        plan.root.base_probes_keys = True
        shipped = pickle.dumps((plan.root, columns))
        return [InputPartition((shipped, i)) for i in task_order(plan.root.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        shipped, i = partition.value
        root, columns = pickle.loads(shipped)
        schema = spark_compatible(columns)
        for batch in root.execute_columns(i, columns):
            yield to_spark_batch(batch, schema)


def _read_at(table: MemWalTable, options: dict[str, str]) -> ReadAt:
    """What a batch read reads: the pinned snapshot ``asOf`` names (a token), else the latest
    rows at the ``consistency`` option's level."""
    token = option(options, "asOf")
    if token is None:
        return cast("ReadAt", options.get("consistency", "strong"))  # take_read_snapshot checks
    if "consistency" in options:
        raise InvalidInputError("give asOf or consistency, not both: a snapshot is exact")
    return table.snapshot(token)


def task_order(partitions: int) -> list[int]:
    """The plan's partitions in the order Spark should run them: the newer rows' (the last,
    see DeduplicateExec) first. It alone builds the newest versions of every newer key, the
    longest task; started last it would run alone while the other cores idle.

    Example:
        >>> task_order(4)
        [3, 0, 1, 2]
    """
    return [partitions - 1, *range(partitions - 1)]


@dataclass
class MemWalCommit(WriterCommitMessage):
    """What one task wrote (for a stream: of which query; ``skipped``: the micro-batch was
    applied before, so nothing was written)."""

    rows: int
    regions: tuple[str, ...]
    query_id: str = ""
    skipped: bool = False


@dataclass
class WriteSummary:
    """What a Spark write stored (on the driver, after the job's commit)."""

    rows: int
    regions: tuple[str, ...]
    tasks: int
    regions_per_task: tuple[int, ...]


class MemWalWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], operation: str) -> None:
        self.options = options
        self.operation = operation

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommit:
        table = _open(self.options)
        rows, regions = 0, set()
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                regions |= _write_batch(table, batch, self.operation, self.options)
                rows += batch.num_rows
        finally:
            table.close()  # flushes: the rows are stored before the task reports them
        return MemWalCommit(rows, tuple(sorted(regions)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Runs on the driver's machine (in a Python worker): reports what the tasks wrote,
        in the log and, if the ``summary_path`` option names a file, there as JSON."""
        done = _task_commits(messages)
        summary = WriteSummary(
            rows=sum(m.rows for m in done),
            regions=tuple(sorted({r for m in done for r in m.regions})),
            tasks=len(done),
            regions_per_task=tuple(len(m.regions) for m in done),
        )
        _log.info(
            "memwal write of %s: %d rows into %d region(s) by %d task(s)",
            self.options.get("path"),
            summary.rows,
            len(summary.regions),
            summary.tasks,
        )
        path = self.options.get("summary_path")
        if path:
            with open(path, "w") as f:
                json.dump(asdict(summary), f)


def _task_commits(messages: Sequence[WriterCommitMessage | None]) -> list[MemWalCommit]:
    """The tasks' messages that are not None: what the writers' ``write`` returned."""
    out = []
    for m in messages:
        if m is not None:
            assert isinstance(m, MemWalCommit)  # the writers' write() returns nothing else
            out.append(m)
    return out


def _write_batch(
    table: Any, batch: pa.RecordBatch, operation: str, options: dict[str, str] | None = None
) -> set[str]:
    """Write ``batch`` durably; return the regions the table has writers of. (Durably: a
    non-durable writer learns it was fenced only after its later writes, whose WAL entries
    were then never stored, and a task could not tell which of its batches to write again.) A writer fenced by
    another task's claim is dropped by the table, and the batch is written again through a
    new claim (the fenced writer's acknowledged writes are in the WAL, and writing a batch
    twice leaves the same rows)."""
    for attempt in range(_FENCED_RETRIES):
        try:
            if operation == "upsert":
                table.upsert(batch)
            elif operation == "update":  # only the batch's columns change
                table.update(batch)
            elif operation == "debezium":
                table.apply_changes(_change_events(batch, options), format="debezium")
            else:
                given = [c for c in table.delete_columns if c in batch.schema.names]
                table.delete(pa.Table.from_batches([batch]).select(given))
            return set(table.live_writers())
        except WriterFencedError:
            if attempt == _FENCED_RETRIES - 1:
                raise
            # Two tasks writing one region take it from each other: a random pause lets
            # one of them write its batch before the other claims the region back.
            time.sleep(random.uniform(0, min(2.0, 0.02 * 2**attempt)))
    return set()


def _change_events(batch: pa.RecordBatch, options: dict[str, str] | None) -> list[Any]:
    """A batch's Debezium events: its ``value_column`` (JSON text or bytes, a Kafka value),
    or, for a DataFrame of parsed envelopes, its rows."""
    column = (options or {}).get("value_column", "value")
    if column in batch.schema.names:
        return batch.column(column).to_pylist()
    if "op" in batch.schema.names:
        return batch.to_pylist()
    raise InvalidInputError(
        f"format 'debezium' reads change events from column {column!r} (JSON, as Kafka "
        "gives it) or from the envelope's op/before/after columns; the DataFrame has "
        f"{batch.schema.names}: name the column with option('value_column', ...)"
    )


class MemWalStreamWriter(DataSourceStreamArrowWriter):
    """Micro-batches of upserts, or of changes with an ``operation_column`` (``upsert`` /
    ``delete``), applied exactly once.

    When every task of micro-batch ``n`` has stored its rows, the commit records ``n`` under
    ``_mem_wal/_spark_sinks/{query id}/``. A task of a micro-batch already recorded writes
    nothing: Spark re-runs a batch whose own commit it lost, and an older value must not come
    back over a newer batch. A batch that fails before its record is written again in full on
    replay; its rows are the same (Spark replays the same offsets), so writing them twice
    leaves what writing them once does.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.operation_column = options.get("operation_column")
        self.changes = _change_format(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommit:
        query_id, batch_id = stream_batch()
        table = _open(self.options)
        try:
            if batch_applied(table.store, query_id, batch_id):
                for _ in iterator:
                    pass
                return MemWalCommit(0, (), query_id, skipped=True)
            rows, regions = 0, set()
            for batch in iterator:
                if self.changes is not None:
                    regions |= _write_batch(table, batch, self.changes, self.options)
                else:
                    for operation, part in _operations(batch, self.operation_column):
                        regions |= _write_batch(table, part, operation)
                rows += batch.num_rows
        finally:
            table.close()
        return MemWalCommit(rows, tuple(sorted(regions)), query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        queries = {m.query_id for m in _task_commits(messages) if m.query_id}
        if not queries:
            return  # no task ran (an empty micro-batch)
        table = _open(self.options)
        for query_id in queries:
            record_batch(table.store, query_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # what the tasks stored is written again when Spark retries the batch


def stream_batch() -> tuple[str, int]:
    """The streaming query id and micro-batch id of the task running (Spark sets both as
    local properties of every micro-batch job)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
    batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    if not query_id or batch_id is None:
        raise InvalidInputError(
            "the memwal stream writer runs only inside a Spark streaming "
            "query (no query or batch id in the task)"
        )
    return query_id, int(batch_id)


def _batch_path(query_id: str, batch_id: int) -> str:
    # Imported here: importing memwal_sql.spark must not load Lance, whose at-fork hook warns
    # when a Spark session started after it launches the JVM.
    from memwal_sql.storage.layout import MEM_WAL_DIR

    return f"{MEM_WAL_DIR}/_spark_sinks/{query_id}/{batch_id:020d}.json"


def batch_applied(store: Any, query_id: str, batch_id: int) -> bool:
    """Whether micro-batch ``batch_id`` of ``query_id`` was applied."""
    return bool(store.exists(_batch_path(query_id, batch_id)))


def record_batch(store: Any, query_id: str, batch_id: int) -> None:
    """Record micro-batch ``batch_id`` of ``query_id`` as applied (once)."""
    try:
        store.put_if_not_exists(
            _batch_path(query_id, batch_id), json.dumps({"batch_id": batch_id}).encode()
        )
    except ObjectExistsError:
        pass


def _operations(batch: pa.RecordBatch, column: str | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``batch`` as runs of one operation each, in row order (a key changed twice in one
    batch ends as its last change says); the operation column itself is dropped."""
    if column is None:
        yield "upsert", batch
        return
    if column not in batch.schema.names:
        raise InvalidInputError(
            f"no operation column {column!r} in the stream's columns {batch.schema.names}"
        )
    ops = batch.column(column)
    bad = pc.invert(pc.is_in(ops, pa.array(["upsert", "delete"])))
    if pc.any(pc.fill_null(bad, True)).as_py():
        raise InvalidInputError(
            f"operation column {column!r} holds a value other than 'upsert' or 'delete'"
        )
    rows = batch.drop_columns([column])
    is_delete = pc.equal(ops, "delete").to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.diff(is_delete.astype(np.int8), prepend=-1))
    ends = np.append(starts[1:], len(is_delete))
    for start, end in zip(starts, ends):
        yield ("delete" if is_delete[start] else "upsert"), rows.slice(start, end - start)
