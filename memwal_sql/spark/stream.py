"""The change feed as a Spark source: ``readStream.format("memwal")`` and batch change reads.

Offsets are pinned snapshots (``{"token": ...}``, see :mod:`memwal_sql.read_snapshot`): a
micro-batch from offset ``a`` to ``b`` emits ``tbl.changes(a, b, mode)``. The rows between two
snapshots are fixed once both are taken (WAL entries never change), so a batch Spark replays
after a failure emits the same rows, and a query restarted from its checkpoint goes on from
the last offset it logged.

``maxRowsPerTrigger`` ends a micro-batch at a *partial cut*
(:func:`memwal_sql.read_snapshot.partial_cut`): each region's WAL advanced only part way
towards the latest snapshot, at an entry boundary, built from the start offset (its base
version, generations and flushed position) with a later ``wal_position``. That is a state
the table really had, region by region: the start's state plus the region's next writes in WAL
order (a key lives in one region, so no key sees two moments), with the generations flushed
since that hold only writes up to the cut read in place of their WAL entries. It is read only
as the next batch's start, for the rows before each change.

Example:
    ``spark.readStream.format("memwal").option("readChangeFeed", "true").load(uri)``
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from memwal_sql.errors import InvalidInputError, SnapshotExpiredError
from memwal_sql.spark.options import open_table, option, read_schema

if TYPE_CHECKING:
    from memwal_sql.changes import ChangeMode
    from memwal_sql.formats.snapshot_token import SnapshotCut
    from memwal_sql.read_snapshot import PinnedSnapshot
    from memwal_sql.table import MemWalTable

CHANGE_COLUMNS = (("_change_type", pa.string()), ("_commit_position", pa.int64()))
#: The offset of a stream that starts at its first snapshot (``startingSnapshot`` "latest"):
#: a constant, so a first batch Spark replays plans the same (empty) range again.
LATEST = {"start": "latest"}


def reads_change_feed(options: dict[str, str]) -> bool:
    """Whether ``options`` ask for the change feed (``readChangeFeed``, Delta's name)."""
    value = (option(options, "readChangeFeed", "false") or "").lower()
    if value not in ("true", "false"):
        raise InvalidInputError(f"readChangeFeed must be 'true' or 'false', not {value!r}")
    return value == "true"


def change_schema(columns: pa.Schema) -> pa.Schema:
    """The change feed's columns: ``columns`` plus ``_change_type`` and ``_commit_position``."""
    return pa.schema([*columns, *(pa.field(n, t) for n, t in CHANGE_COLUMNS)])


def _mode(options: dict[str, str]) -> ChangeMode:
    mode = options.get("mode", "net")
    if mode not in ("net", "all"):
        raise InvalidInputError(f"the mode option is 'net' or 'all', not {mode!r}")
    return cast("ChangeMode", mode)


def _max_rows(options: dict[str, str]) -> int | None:
    given = option(options, "maxRowsPerTrigger")
    if given is None:
        return None
    if not given.isdigit() or int(given) < 1:
        raise InvalidInputError(f"maxRowsPerTrigger is a positive number of rows, not {given!r}")
    return int(given)


def starting_offset(table: MemWalTable, options: dict[str, str]) -> dict[str, str]:
    """Where a change feed starts: ``startingSnapshot`` (a token, or ``latest``, the default:
    the first snapshot the stream takes), or ``startingTimestamp``: the newest tagged snapshot
    taken at or before it (a tag is the only snapshot that stays; the feed then holds every
    change since the timestamp, and those between the tag and it).

    Example:
        ``starting_offset(tbl, {"startingSnapshot": snap.token})  # {"token": ...}``
    """
    token = option(options, "startingSnapshot")
    when = option(options, "startingTimestamp")
    if token is not None and when is not None:
        raise InvalidInputError("give startingSnapshot or startingTimestamp, not both")
    if when is not None:
        return {"token": _tag_at(table, when).token}
    if token is None or token == "latest":
        return LATEST
    return {"token": table.snapshot(token).token}  # a damaged token fails here, not in a task


def _tag_at(table: MemWalTable, when: str) -> PinnedSnapshot:
    """The newest tagged snapshot of ``table`` taken at or before ``when`` (ISO 8601, UTC
    unless it says otherwise)."""
    try:
        at = datetime.datetime.fromisoformat(when)
    except ValueError as e:
        raise InvalidInputError(
            f"startingTimestamp is an ISO 8601 time such as 2026-01-31T12:00:00Z, not {when!r}"
        ) from e
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.timezone.utc)
    earlier = [s for s in table.tags().values() if s.taken_at <= at]
    if not earlier:
        raise InvalidInputError(
            f"no tagged snapshot of {table.uri} was taken at or before {when}: a change feed "
            "starts only from a snapshot that is kept. Tag snapshots as you go "
            "(tbl.tag('daily-...')), or start from a token (startingSnapshot)"
        )
    return max(earlier, key=lambda s: s.cut.taken_at_millis)


def _unchanged(a: SnapshotCut, b: SnapshotCut) -> bool:
    """Whether cut ``b`` adds no write to ``a`` and reads the same base version (a newer
    base version is worth an empty batch: the stream's start then stays readable)."""
    if a.base_version != b.base_version:
        return False
    return all(a.wal_position_of(r.region_id) == r.wal_position for r in b.regions)


def change_partitions(start: SnapshotCut, end: SnapshotCut, parts: int) -> list[InputPartition]:
    """The work from cut ``start`` to ``end`` as at most ``parts`` input partitions, each a
    group of regions with about as many WAL entries (a key's changes are in one region).

    Example:
        ``change_partitions(a.cut, b.cut, 4)``
    """
    work = []
    for rc in end.regions:
        entries = rc.wal_position - start.wal_position_of(rc.region_id)
        if entries > 0:
            work.append((entries, rc.region_id))
    groups: list[list[str]] = [[] for _ in range(min(parts, len(work)))]
    loads = [0] * len(groups)
    for entries, rid in sorted(work, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(rid)
        loads[i] += entries
    return [InputPartition((start.token, end.token, tuple(g))) for g in groups]


def read_changes(options: dict[str, str], partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """What one task of a change read emits: the changes of its regions between its two cuts,
    as the Spark schema's batches."""
    from memwal_sql.formats.snapshot_token import decode_token
    from memwal_sql.read_snapshot import PinnedSnapshot
    from memwal_sql.spark.arrow import spark_compatible, to_spark_batch

    start_token, end_token, regions = partition.value
    table = open_table(options)
    try:
        schema = spark_compatible(change_schema(read_schema(table, options)))

        def only(token: str) -> PinnedSnapshot:
            cut = decode_token(token)
            kept = tuple(r for r in cut.regions if r.region_id in regions)
            return PinnedSnapshot(table, dataclasses.replace(cut, regions=kept))

        try:
            changes = table.changes(only(start_token), only(end_token), mode=_mode(options))
        except SnapshotExpiredError as e:
            raise SnapshotExpiredError(
                f"{e}. The change read starts at an offset garbage collection has removed: "
                "restart the stream with a new checkpoint (from startingSnapshot or a tag), "
                "and raise base_versions_older_than (MaintenanceConfig) above the longest "
                "time a stream stops, or tag the snapshot it starts from"
            ) from e
        for batch in changes.to_batches():
            if batch.num_rows:
                yield to_spark_batch(batch, schema)
    finally:
        table.close()


def _parts(options: dict[str, str]) -> int:
    given = options.get("partitions", "32")
    if not given.isdigit() or int(given) < 1:
        raise InvalidInputError(f"partitions is a positive number, not {given!r}")
    return int(given)


class MemWalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``readStream.format("memwal")``: the change feed, offset by pinned snapshots (see the
    module docstring). Runs in a Python worker that lives as long as the query."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        _mode(options)  # checked before the query starts
        self.max_rows = _max_rows(options)
        self.target: str | None = None  # availableNow: the last offset this run reads
        self._table: MemWalTable | None = None

    @property
    def table(self) -> MemWalTable:
        if self._table is None:
            self._table = open_table(self.options)
        return self._table

    def initialOffset(self) -> dict[str, str]:
        return starting_offset(self.table, self.options)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.table.snapshot().token

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        from memwal_sql.formats.snapshot_token import decode_token

        latest = decode_token(self.target) if self.target else self.table.snapshot().cut
        if start == LATEST:
            return {"token": latest.token}
        begin = decode_token(start["token"])
        if _unchanged(begin, latest):
            return start
        if isinstance(limit, ReadMaxRows):
            from memwal_sql.read_snapshot import partial_cut

            latest = partial_cut(self.table, begin, latest, limit.max_rows)
        return {"token": latest.token}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        from memwal_sql.formats.snapshot_token import decode_token

        if start in (LATEST, end):
            return []  # a stream from "latest" emits nothing up to its first snapshot
        return change_partitions(
            decode_token(start["token"]), decode_token(end["token"]), _parts(self.options)
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_changes(self.options, partition)

    def commit(self, end: dict[str, str]) -> None:
        pass  # nothing is held for an offset: garbage collection's retention keeps it

    def stop(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None


class MemWalChangeReader(DataSourceReader):
    """``read.format("memwal").option("readChangeFeed", "true")``: the changes from
    ``startingSnapshot`` to ``endingSnapshot`` (now, if not given) in one batch read."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        _mode(options)
        if option(options, "asOf") is not None:
            raise InvalidInputError(
                "a change read reads from startingSnapshot to endingSnapshot, not asOf"
            )

    def partitions(self) -> Sequence[InputPartition]:
        table = open_table(self.options)
        try:
            start = starting_offset(table, self.options)
            if start == LATEST:
                raise InvalidInputError(
                    "a batch change read needs a start: startingSnapshot (a token) or "
                    "startingTimestamp"
                )
            ending = option(self.options, "endingSnapshot")
            end = table.snapshot(ending)
            return change_partitions(
                table.snapshot(start["token"]).cut, end.cut, _parts(self.options)
            )
        finally:
            table.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_changes(self.options, partition)


__all__: Sequence[str] = [
    "MemWalChangeReader",
    "MemWalStreamReader",
    "change_partitions",
    "starting_offset",
]
