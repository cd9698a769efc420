"""The ``memwal`` Python Data Source: MemWAL tables as a Spark source and batch sink.

Read: the driver takes one snapshot of the table and plans the scan (pushed filters become the
planner's predicate tree: region pruning, exact filtering of every source); each Spark input
partition carries that plan and one of its partitions (the newer sources, or a group of base
fragments), so every executor reads the same snapshot. Write: each task upserts (or deletes)
its Arrow batches through the routed writer, durably, and returns only once they are stored;
a task fenced by another task writing the same region claims the region again and goes on.

Options: ``consistency`` (``strong``/``eventual``), ``partitions`` (base fragment groups),
``operation`` (``upsert``/``delete``); every other option is a storage option (``aws_*``...).

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
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from memwal_sql.errors import InvalidInputError, WriterFencedError
from memwal_sql.spark.arrow import spark_compatible, to_spark_batch
from memwal_sql.spark.filters import spark_predicate
from planner.predicate import And, Predicate

_OPTIONS = {"path", "consistency", "partitions", "operation", "version", "summary_path"}
_FENCED_RETRIES = 30
_log = logging.getLogger(__name__)


def _open(options: dict[str, str]) -> Any:
    import memwal_sql as mw

    uri = options.get("path")
    if not uri:
        raise InvalidInputError("no table uri: use .load(uri) or .save(uri)")
    if "version" in options:
        raise InvalidInputError("reading an older version is not supported by MemWAL reads; "
                                "read the latest rows, or the base table with Lance")
    storage = {k: v for k, v in options.items() if k not in _OPTIONS}
    return mw.open_table(uri, storage or None)


class MemWalDataSource(DataSource):
    """``format("memwal")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "memwal"

    def schema(self) -> StructType:
        table = _open(dict(self.options))
        return from_arrow_schema(spark_compatible(table.schema))

    def reader(self, schema: StructType) -> MemWalReader:
        return MemWalReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MemWalWriter:
        if overwrite:
            raise InvalidInputError(
                "mode('overwrite') is not supported: a MemWAL table takes upserts and deletes; "
                "use mode('append') (upsert) or .option('operation', 'delete')")
        operation = dict(self.options).get("operation", "upsert")
        if operation not in ("upsert", "delete"):
            raise InvalidInputError(f"operation must be 'upsert' or 'delete', not {operation!r}")
        return MemWalWriter(dict(self.options), operation)


class MemWalReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.predicate: Predicate | None = None

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's name
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
        from memwal_sql.snapshot import take_snapshot
        from planner.scan import plan_scan

        table = _open(self.options)
        consistency = self.options.get("consistency", "strong")
        snapshot = take_snapshot(table, consistency)  # type: ignore[arg-type]
        fragments = len(snapshot.dataset.get_fragments())
        parts = int(self.options.get("partitions", max(1, min(fragments, 32))))
        plan = plan_scan(snapshot, table.region_spec, table.schema, self.predicate,
                         partitions=parts)
        shipped = pickle.dumps(plan.root)
        return [InputPartition((shipped, i)) for i in range(plan.root.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        shipped, i = partition.value
        root = pickle.loads(shipped)
        schema = spark_compatible(root.schema)
        for batch in root.execute_partition(i):
            yield to_spark_batch(batch, schema)


@dataclass
class MemWalCommit(WriterCommitMessage):
    """What one task wrote."""

    rows: int
    regions: tuple[str, ...]


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
                regions |= _write_batch(table, batch, self.operation)
                rows += batch.num_rows
        finally:
            table.close()  # flushes: the rows are stored before the task reports them
        return MemWalCommit(rows, tuple(sorted(regions)))

    def commit(self, messages: list[MemWalCommit | None]) -> None:
        """Runs on the driver's machine (in a Python worker): reports what the tasks wrote,
        in the log and, if the ``summary_path`` option names a file, there as JSON."""
        done = [m for m in messages if m is not None]
        summary = WriteSummary(
            rows=sum(m.rows for m in done),
            regions=tuple(sorted({r for m in done for r in m.regions})),
            tasks=len(done),
            regions_per_task=tuple(len(m.regions) for m in done),
        )
        _log.info("memwal write of %s: %d rows into %d region(s) by %d task(s)",
                  self.options.get("path"), summary.rows, len(summary.regions), summary.tasks)
        path = self.options.get("summary_path")
        if path:
            with open(path, "w") as f:
                json.dump(asdict(summary), f)


def _write_batch(table: Any, batch: pa.RecordBatch, operation: str) -> set[str]:
    """Write ``batch``; return the regions the table has writers of. A writer fenced by
    another task's claim is dropped by the table, and the batch is written again through a
    new claim (the fenced writer's acknowledged writes are in the WAL, and writing a batch
    twice leaves the same rows)."""
    for attempt in range(_FENCED_RETRIES):
        try:
            if operation == "upsert":
                table.upsert(batch)
            else:
                table.delete(pa.Table.from_batches([batch]).select(list(table.primary_key)))
            return set(table.live_writers())
        except WriterFencedError:
            if attempt == _FENCED_RETRIES - 1:
                raise
            # Two tasks writing one region take it from each other: a random pause lets
            # one of them write its batch before the other claims the region back.
            time.sleep(random.uniform(0, min(2.0, 0.02 * 2**attempt)))
    return set()
