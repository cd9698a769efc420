"""The change feed as a Spark source (readStream, batch change reads) and asOf batch reads."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError, SnapshotExpiredError
from memwal_sql.read_snapshot import partial_cut
from memwal_sql.spark.stream import LATEST, MemWalStreamReader

pytestmark = pytest.mark.spark

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("tenant", pa.string()),
        pa.field("v", pa.float64()),
    ]
)
# _commit_position orders a key's changes (positions of different regions may be equal).
KEY_ORDER = [("id", "ascending"), ("_commit_position", "ascending"), ("_change_type", "ascending")]


def rows(ids, tag: float = 0.0) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {"id": ids, "tenant": [f"t{i % 3}" for i in ids], "v": ids * 1.5 + tag}, schema=SCHEMA
    )


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri, rows(range(100)), primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    tbl.upsert(rows(range(90, 120), 1.0))
    tbl.close()
    return uri


def apply_changes(state: dict[int, dict], changes: pa.Table) -> dict[int, dict]:
    """``state`` (rows by id) after ``changes``, checking each change against it: a preimage
    or a delete must be the key's row, an insert must find none."""
    state = dict(state)
    rank = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}
    ordered = changes.to_pylist()
    for change in sorted(ordered, key=lambda c: (c["_commit_position"], rank[c["_change_type"]])):
        kind = change.pop("_change_type")
        change.pop("_commit_position")
        key = change["id"]
        if kind in ("update_preimage", "delete"):
            assert state.get(key) == change, (kind, change, state.get(key))
            if kind == "delete":
                del state[key]
        elif kind == "insert":
            assert key not in state, change
            state[key] = change
        else:
            assert key in state, change
            state[key] = change
    return state


def by_id(t: pa.Table) -> dict[int, dict]:
    return {r["id"]: r for r in t.select(SCHEMA.names).cast(SCHEMA).to_pylist()}


def canonical(changes: pa.Table) -> pa.Table:
    names = [*SCHEMA.names, "_change_type", "_commit_position"]
    schema = pa.schema(
        [*SCHEMA, pa.field("_change_type", pa.string()), pa.field("_commit_position", pa.int64())]
    )
    return changes.select(names).cast(schema).sort_by(KEY_ORDER)


# ---- the stream reader as Spark drives it (no session) -----------------------------------------


def drain(reader: MemWalStreamReader, start: dict, limit) -> tuple[list[pa.Table], dict, list]:
    """Micro-batches as Spark plans them until the source has nothing new: each batch's
    changes, the last offset, and every offset."""
    batches, offsets = [], []
    while (end := reader.latestOffset(start, limit)) != start:
        got = [b for p in reader.partitions(start, end) for b in reader.read(p)]
        batches.append(pa.Table.from_batches(got) if got else None)
        offsets.append(end)
        start = end
    return batches, start, offsets


def test_partial_cuts_read_states_the_table_had_and_their_changes_chain(table):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    tbl = mw.open_table(table)
    a = tbl.snapshot()
    state_a = by_id(tbl.to_arrow(as_of=a))
    rng = np.random.default_rng(7)
    for i in range(12):
        tbl.upsert(rows(rng.choice(200, 15, replace=False), float(i)))
        tbl.delete([int(k) for k in rng.choice(200, 3, replace=False)])
        if i in (3, 5, 8):  # generations flushed (and merged) past the start's positions
            tbl.flush()
        if i == 5:
            tbl.merge()
    for mode in ("all", "net"):
        reader = MemWalStreamReader(
            {"path": table, "readchangefeed": "true", "startingsnapshot": a.token, "mode": mode}
        )
        start = reader.initialOffset()
        batches, _, offsets = drain(reader, start, ReadMaxRows(40))
        assert len(batches) > 5  # about 216 writes, 40 a batch
        state = state_a
        for batch, offset in zip(batches, offsets):
            state = apply_changes(state, batch)
            # The cut a batch ends at is a state the table had: what its changes lead to.
            cut = tbl.snapshot(offset["token"])
            assert by_id(tbl.to_arrow(as_of=cut)) == state
        assert state == by_id(tbl.to_arrow())
        # Cuts read the generations flushed since the start, not their WAL entries.
        cuts = [tbl.snapshot(o["token"]).cut for o in offsets]
        assert any(
            rc.flushed_position > a.cut.region(rc.region_id).flushed_position
            for c in cuts
            for rc in c.regions
        )
        assert all(c.base_version == a.base_version for c in cuts[:-1])
        if mode == "all":
            got = canonical(pa.concat_tables(batches))
            assert got.equals(canonical(tbl.changes(a, mode="all")))  # none lost, none twice
    tbl.close()


def test_a_partial_cut_takes_whole_entries_and_at_least_one(table):
    tbl = mw.open_table(table)
    a = tbl.snapshot()
    tbl.upsert(rows(range(1000, 1100)))  # one entry of 100 rows per region it touches
    b = tbl.snapshot()
    cut = partial_cut(tbl, a.cut, b.cut, 1)  # the first region's entry (sentinels: no rows)
    taken = tbl.changes(a, tbl.snapshot(cut.token), mode="all").num_rows
    assert 0 < taken < 100
    assert partial_cut(tbl, a.cut, b.cut, taken + 1) == cut  # the next entry would exceed it
    assert partial_cut(tbl, a.cut, b.cut, 10_000) == b.cut
    tbl.close()


def test_a_stream_from_latest_emits_only_what_follows_its_first_snapshot(table):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    tbl = mw.open_table(table)
    reader = MemWalStreamReader({"path": table, "readchangefeed": "true"})
    assert reader.initialOffset() == LATEST  # a constant: a replayed first batch plans the same
    first = reader.latestOffset(LATEST, ReadAllAvailable())
    assert reader.partitions(LATEST, first) == []
    assert reader.latestOffset(first, ReadAllAvailable()) == first  # nothing new
    tbl.upsert(rows([5, 500], 9.0))
    batches, _, _ = drain(reader, first, ReadAllAvailable())
    got = pa.concat_tables(batches).sort_by("id")
    assert got.column("_change_type").to_pylist() == [
        "update_preimage",
        "update_postimage",
        "insert",
    ]
    # availableNow: the run reads up to the snapshot taken when it starts, not what follows.
    reader.prepareForTriggerAvailableNow()
    tbl.upsert(rows([6], 9.0))
    target = reader.latestOffset(first, ReadAllAvailable())
    assert {r["id"] for r in tbl.changes(first["token"], target["token"]).to_pylist()} == {5, 500}
    tbl.close()


def test_starting_timestamp_starts_at_the_newest_tag_taken_before_it(table):
    tbl = mw.open_table(table)
    options = {"path": table, "readchangefeed": "true"}
    with pytest.raises(InvalidInputError, match="tag"):
        MemWalStreamReader({**options, "startingtimestamp": "2020-01-01"}).initialOffset()
    old = tbl.tag("old")
    time.sleep(0.01)
    between = datetime.datetime.now(datetime.timezone.utc).isoformat()
    time.sleep(0.01)
    tbl.upsert(rows([7], 3.0))
    tbl.tag("new")
    start = MemWalStreamReader({**options, "startingtimestamp": between}).initialOffset()
    assert start == {"token": old.token}
    with pytest.raises(InvalidInputError, match="ISO 8601"):
        MemWalStreamReader({**options, "startingtimestamp": "yesterday"}).initialOffset()
    with pytest.raises(InvalidInputError, match="not both"):
        MemWalStreamReader(
            {**options, "startingtimestamp": between, "startingsnapshot": old.token}
        ).initialOffset()
    tbl.close()


def test_an_offset_gc_removed_is_an_error_naming_the_retention(table):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    tbl = mw.open_table(table)
    a = tbl.snapshot()
    tbl.upsert(rows(range(50), 4.0))
    tbl.flush()
    tbl.merge()
    tbl.gc(base_versions_older_than=timedelta(0), keep_manifest_versions=1)
    reader = MemWalStreamReader(
        {"path": table, "readchangefeed": "true", "startingsnapshot": a.token}
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    with pytest.raises(SnapshotExpiredError, match="base_versions_older_than") as e:
        for p in reader.partitions(start, end):
            list(reader.read(p))
    assert "tag" in str(e.value) and "checkpoint" in str(e.value)
    tbl.close()


def test_stream_options_are_checked(table):
    from memwal_sql.spark.source import MemWalDataSource, MemWalReader

    with pytest.raises(InvalidInputError, match="readChangeFeed"):
        MemWalDataSource({"path": table}).streamReader(None)
    with pytest.raises(InvalidInputError, match="'net' or 'all'"):
        MemWalDataSource({"path": table, "readchangefeed": "true", "mode": "some"}).streamReader(
            None
        )
    with pytest.raises(InvalidInputError, match="maxRowsPerTrigger"):
        MemWalStreamReader({"path": table, "maxrowspertrigger": "0"})
    with pytest.raises(InvalidInputError, match="not both"):
        MemWalReader({"path": table, "asof": "mw1.x", "consistency": "strong"}).partitions()
    with pytest.raises(InvalidInputError, match="asOf"):
        MemWalDataSource({"path": table, "version": "3"}).schema()
    with pytest.raises(InvalidInputError, match="endingSnapshot"):
        MemWalDataSource({"path": table, "readchangefeed": "true", "asof": "mw1.x"}).reader(None)
    with pytest.raises(InvalidInputError, match="needs a start"):
        MemWalDataSource({"path": table, "readchangefeed": "true"}).reader(None).partitions()


# ---- Spark ---------------------------------------------------------------------------------------


def test_a_batch_read_as_of_a_token_reads_that_snapshot(spark, table):
    tbl = mw.open_table(table)
    snap = tbl.snapshot()
    tbl.upsert(rows(range(50, 150), 8.0))
    tbl.delete(list(range(10)))
    tbl.flush()
    tbl.merge()
    tbl.compact()
    tbl.upsert(rows([1000], 1.0))
    got = spark.read.format("memwal").option("asOf", snap.token).load(table).toArrow()
    assert by_id(got) == by_id(tbl.to_arrow(as_of=snap))
    assert by_id(got) != by_id(tbl.to_arrow())
    # And the changes from it to now, in one batch read.
    changes = (
        spark.read.format("memwal")
        .option("readChangeFeed", "true")
        .option("startingSnapshot", snap.token)
        .option("mode", "all")
        .load(table)
        .toArrow()
    )
    assert canonical(changes).equals(canonical(tbl.changes(snap, mode="all")))
    tbl.close()


def all_changes_stream(spark, table: str, token: str, max_rows: int):
    return (
        spark.readStream.format("memwal")
        .option("readChangeFeed", "true")
        .option("startingSnapshot", token)
        .option("mode", "all")
        .option("maxRowsPerTrigger", max_rows)
        .load(table)
    )


def test_max_rows_per_trigger_bounds_each_micro_batch(spark, table, tmp_path):
    tbl = mw.open_table(table)
    a = tbl.snapshot()
    for i in range(12):
        tbl.upsert(rows(range(1000 + 10 * i, 1010 + 10 * i)))  # new keys: 1 row each
    sizes: dict[int, int] = {}
    got: list[pa.Table] = []

    def collect(df, batch_id):
        t = df.toArrow()
        sizes[batch_id] = t.num_rows
        got.append(t)

    query = (
        all_changes_stream(spark, table, a.token, 25)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    assert max(sizes.values()) <= 25 and len([n for n in sizes.values() if n]) >= 5
    assert canonical(pa.concat_tables(got)).equals(canonical(tbl.changes(a, mode="all")))
    tbl.close()


WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np, pyarrow as pa
    import memwal_sql as mw
    uri, done = sys.argv[1], sys.argv[2]
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("tenant", pa.string()),
                        pa.field("v", pa.float64())])
    rng = np.random.default_rng(11)
    tbl = mw.open_table(uri)
    for i in range(60):
        ids = np.sort(rng.choice(400, 20, replace=False)).astype(np.int64)
        tbl.upsert(pa.table({"id": ids, "tenant": [f"w{i}"] * 20, "v": ids + i / 100}, schema=schema))
        tbl.delete([int(k) for k in rng.choice(400, 4, replace=False)])
        if i % 10 == 9:
            tbl.maintain()  # flush, merge, compact, GC (the retention keeps the stream's offsets)
        time.sleep(0.1)
    tbl.close()
    open(done, "w").write("done")
    """
)


@pytest.mark.slow
def test_a_stream_killed_mid_batch_and_restarted_emits_every_change_once(spark, table, tmp_path):
    """Another process upserts, deletes and runs maintain() while the stream reads; a
    micro-batch dies part way (its tasks fail after emitting rows) and the query stops; the
    query restarted from its checkpoint goes on. The Parquet sink's committed rows are then
    exactly the feed: the table rebuilt from them, and no change twice."""
    tbl = mw.open_table(table)
    a = tbl.snapshot()
    out, checkpoint, flag, done = (str(tmp_path / n) for n in ("out", "ck", "crash", "done"))
    open(flag, "w").close()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, table, done],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )

    def crash_mid_batch(batches):
        from pyspark import TaskContext

        batch_id = int(TaskContext.get().getLocalProperty("streaming.sql.batchId"))
        for b in batches:
            yield b
            if batch_id >= 2 and os.path.exists(flag):
                raise RuntimeError("the stream dies mid-batch")

    def start():
        stream = all_changes_stream(spark, table, a.token, 60)
        return (
            stream.mapInArrow(crash_mid_batch, stream.schema)
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    try:
        query = start()
        with pytest.raises(Exception, match="dies mid-batch"):
            query.awaitTermination(300)
        offsets = sorted(
            int(n) for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit()
        )
        commits = sorted(
            int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()
        )
        assert offsets[-1] == commits[-1] + 1  # the last batch was planned, never committed
        os.remove(flag)
        query = start()
        assert writer.wait(300) == 0 and os.path.exists(done)
        query.processAllAvailable()
        query.stop()
    finally:
        if writer.poll() is None:
            writer.kill()
    emitted = spark.read.parquet(out).toArrow()
    feed = tbl.changes(a, mode="all")
    assert feed.num_rows > 1000
    got = canonical(emitted)
    assert got.equals(canonical(feed))  # nothing lost, nothing twice
    keys = pc.binary_join_element_wise(
        *(pc.cast(got[c], pa.string()) for c in ("id", "_commit_position", "_change_type")), "/"
    )
    assert len(pc.unique(keys)) == got.num_rows
    rebuilt = apply_changes(by_id(tbl.to_arrow(as_of=a)), emitted)
    assert rebuilt == by_id(tbl.to_arrow())
    tbl.close()
