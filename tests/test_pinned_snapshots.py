"""Pinned snapshots and the change feed: a snapshot reads, later, exactly the state it was taken
at (after flushes, merges, compaction, crashes, reopens and GC), through every read path; and
the changes between two snapshots, applied to the first's state, give the second's."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import (
    InvalidInputError,
    InvalidSnapshotError,
    SnapshotExpiredError,
)
from tests.lsm import Model, apply_changes, apply_op

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("x", pa.int64()), pa.field("s", pa.string())])  # fmt: skip


def batch(keys: list[int], seed: int) -> pa.Table:
    return pa.table(
        {"id": keys, "x": [k * 10 + seed for k in keys], "s": [f"{k}-{seed}" for k in keys]},
        schema=SCHEMA,
    )


def state(model: Model) -> pa.Table:
    return model.table(SCHEMA)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(st.integers(0, 20), min_size=1, max_size=5, unique=True), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 20), min_size=1, max_size=3, unique=True), st.just(0)),
        st.tuples(st.sampled_from(["flush", "merge", "compact", "reopen", "crash", "gc", "snapshot", "snapshot", "tag"]), st.just([]), st.just(0)),
    ),
    min_size=1,
    max_size=18,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=ops, buckets=st.sampled_from([None, 2]))
def test_snapshots_read_their_state_and_changes_lead_from_one_to_the_next(
    tmp_path_factory, steps, buckets
):
    uri = str(tmp_path_factory.mktemp("snap") / "t")
    first = batch([0, 1, 2, 3], 0)
    tbl = mw.create_table(
        uri,
        first,
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", buckets) if buckets else None,
        writer_config=mw.WriterConfig(max_memtable_rows=4, durable_write=False),
    )
    model = Model(["id"])
    model.upsert(first)
    taken: list[tuple[str, pa.Table, bool]] = []  # token, its state, tagged
    collected = False  # a GC with no retention ran: untagged snapshots may be gone

    def check(tbl: mw.MemWalTable) -> None:
        for token, want, tagged in taken:
            snap = tbl.snapshot(token)
            try:
                assert tbl.to_arrow(as_of=snap).sort_by("id") == want
                probe = list(range(0, 21, 3))
                got = tbl.lookup(probe, as_of=snap).sort_by("id")
                assert got == want.filter(pa.compute.is_in(want["id"], pa.array(probe)))
                assert (
                    tbl.count_rows("x > 50", as_of=snap)
                    == want.filter(pa.compute.greater(want["x"], 50)).num_rows
                )
            except SnapshotExpiredError:
                assert collected and not tagged
        readable = []
        for token, want, _ in taken:
            try:
                tbl.to_arrow(as_of=tbl.snapshot(token))
                readable.append((token, want))
            except SnapshotExpiredError:
                continue
        for (a, at_a), (b, at_b) in itertools.pairwise(readable):
            for mode in ("net", "all"):
                try:
                    changes = tbl.changes(a, b, mode=mode)
                except SnapshotExpiredError:
                    assert collected
                    continue
                assert apply_changes(at_a, changes, SCHEMA) == at_b

    try:
        for op, keys, seed in steps:
            if op == "snapshot":
                taken.append((tbl.snapshot().token, state(model), False))
            elif op == "tag":
                snap = tbl.tag(f"t{len(taken)}")
                taken.append((snap.token, state(model), True))
            elif op == "gc":
                tbl.gc(base_versions_older_than=timedelta(0), keep_manifest_versions=2)
                collected = True
            else:
                tbl = apply_op(tbl, model, op, keys, seed, uri, batch)
            check(tbl)
        taken.append((tbl.snapshot().token, state(model), False))
        assert tbl.to_arrow().sort_by("id") == state(model)
        check(tbl)
    finally:
        tbl.close()


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"),
        batch([0, 1, 2], 0),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    yield tbl
    tbl.close()


def test_a_token_restores_the_snapshot_in_another_process(table, tmp_path):
    table.upsert(batch([1, 5], 1))
    token = table.snapshot().token
    table.upsert(batch([1, 6], 2))
    table.delete([0])
    table.flush()
    table.merge()
    script = textwrap.dedent(f"""
        import memwal_sql as mw
        tbl = mw.open_table({table.uri!r})
        snap = tbl.snapshot({token!r})
        print(sorted((r["id"], r["x"]) for r in tbl.to_arrow(as_of=snap).to_pylist()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([(0, 0), (1, 11), (2, 20), (5, 51)])


def test_a_snapshot_holds_every_write_acknowledged_before_it_even_unflushed_non_durable(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"), batch([0], 0), primary_key="id",
        writer_config=mw.WriterConfig(durable_write=False, max_wal_flush_interval_ms=60_000),
    )  # fmt: skip
    tbl.upsert(batch([1, 2], 1))  # buffered: not yet in the WAL
    snap = tbl.snapshot()
    tbl.upsert(batch([3], 1))
    other = mw.open_table(tbl.uri)  # reads only what is stored
    want = pa.table({"id": [0, 1, 2], "x": [0, 11, 21], "s": ["0-0", "1-1", "2-1"]}, schema=SCHEMA)
    assert other.to_arrow(as_of=other.snapshot(snap.token)).sort_by("id") == want
    other.close()
    tbl.close()


def test_sql_reads_a_registered_snapshot_and_refuses_to_write_it(table):
    snap = table.snapshot()
    table.upsert(batch([0, 7], 5))
    ctx = mw.connect(trusted=True)
    ctx.register("t", table)
    ctx.register("t_then", snap)
    then = ctx.sql("SELECT id, x FROM t_then ORDER BY id").to_arrow_table().to_pylist()
    assert then == [{"id": 0, "x": 0}, {"id": 1, "x": 10}, {"id": 2, "x": 20}]
    now = ctx.sql("SELECT count(*) AS n FROM t").to_arrow_table().to_pylist()
    assert now == [{"n": 4}]
    joined = ctx.sql(
        "SELECT t.id FROM t LEFT JOIN t_then USING (id) WHERE t_then.id IS NULL"
    ).to_arrow_table()
    assert joined.column("id").to_pylist() == [7]
    with pytest.raises(InvalidSnapshotError, match="read-only"):
        ctx.sql("DELETE FROM t_then WHERE id = 1")


def test_search_as_of_a_snapshot_sees_only_its_rows(tmp_path):
    rows = pa.table({"id": [1, 2, 3], "text": ["red fox", "blue whale", "green frog"],
                     "vec": pa.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], pa.list_(pa.float32(), 2))})  # fmt: skip
    tbl = mw.create_table(str(tmp_path / "t"), rows, primary_key="id")
    tbl.create_index("text", "INVERTED")
    snap = tbl.snapshot()
    tbl.upsert(pa.table({"id": [1, 4], "text": ["grey wolf", "red panda"],
                         "vec": pa.array([[9.0, 9.0], [1.0, 0.0]], pa.list_(pa.float32(), 2))}))  # fmt: skip
    tbl.flush()
    tbl.merge()
    assert tbl.fts("red", as_of=snap).column("id").to_pylist() == [1]
    assert sorted(tbl.fts("red").column("id").to_pylist()) == [4]
    assert tbl.vector_search([1.0, 0.0], "vec", k=1, as_of=snap).column("id").to_pylist() == [1]
    assert tbl.vector_search([9.0, 9.0], "vec", k=1).column("id").to_pylist() == [1]
    assert tbl.vector_search([9.0, 9.0], "vec", k=1, as_of=snap).column("id").to_pylist() == [3]
    tbl.close()


def test_a_tag_keeps_what_its_snapshot_reads_through_gc_until_untagged(table):
    table.upsert(batch([1, 5], 1))
    table.flush()
    kept = table.tag("before")
    untagged = table.snapshot()
    table.upsert(batch([1, 5], 2))
    table.delete([2])
    table.flush()
    table.merge()
    table.compact()
    before_gc = _gen_dirs(table)
    table.gc(base_versions_older_than=timedelta(0), keep_manifest_versions=1)
    assert _gen_dirs(table) == before_gc  # the tagged snapshot reads them
    assert table.to_arrow(as_of=table.snapshot(tag="before")).sort_by("id") == pa.table(
        {"id": [0, 1, 2, 5], "x": [0, 11, 20, 51], "s": ["0-0", "1-1", "2-0", "5-1"]}, schema=SCHEMA
    )
    assert list(table.tags()) == ["before"]
    assert table.tags()["before"].token == kept.token
    table.untag("before")
    table.gc(base_versions_older_than=timedelta(0), keep_manifest_versions=1)
    assert not _gen_dirs(table) & before_gc  # freed
    for snap in (kept, untagged):
        with pytest.raises(SnapshotExpiredError, match="tag"):
            table.to_arrow(as_of=snap)
    with pytest.raises(InvalidSnapshotError, match="no tag"):
        table.snapshot(tag="before")


def _gen_dirs(table) -> set[str]:
    import os

    root = os.path.join(table.uri, "_mem_wal")
    return {os.path.join(d, n) for d, names, _ in os.walk(root) for n in names if "_gen_" in n}


def test_snapshot_errors_are_typed(table, tmp_path):
    with pytest.raises(InvalidSnapshotError, match="not a snapshot token"):
        table.snapshot("abc")
    with pytest.raises(InvalidSnapshotError, match="damaged"):
        table.snapshot("mw1.!!!!")
    with pytest.raises(InvalidSnapshotError, match="tag name"):
        table.tag("bad name")
    table.tag("x")
    with pytest.raises(InvalidSnapshotError, match="exists already"):
        table.tag("x")
    other = mw.create_table(str(tmp_path / "o"), batch([0], 0), primary_key="id")
    with pytest.raises(InvalidSnapshotError, match="snapshot is of"):
        table.to_arrow(as_of=other.snapshot())
    with pytest.raises(InvalidSnapshotError, match="as_of takes a snapshot"):
        table.to_arrow(as_of="mw1.x")  # type: ignore[arg-type]
    a = table.snapshot()
    table.upsert(batch([9], 1))
    b = table.snapshot()
    with pytest.raises(InvalidSnapshotError, match="older first"):
        table.changes(b, a)
    with pytest.raises(InvalidInputError, match="mode"):
        table.changes(a, b, mode="some")  # type: ignore[arg-type]
    other.close()


def test_changes_read_only_the_wal_entries_in_between(table, monkeypatch):
    from memwal_sql.formats import wal

    table.upsert(batch(list(range(100)), 1))
    table.flush()
    table.merge()
    a = table.snapshot()
    table.upsert(batch([3], 2))
    table.delete([4])
    b = table.snapshot()
    read = []
    real = wal.read_wal_range

    def counting(store, region_id, after, through):
        read.append(through - after)
        return real(store, region_id, after, through)

    monkeypatch.setattr("memwal_sql.changes.read_wal_range", counting)
    changes = table.changes(a, b)
    assert sum(read) == 2  # one entry per write, not the 100-row one before
    kinds = sorted(
        zip(changes.column("id").to_pylist(), changes.column("_change_type").to_pylist())
    )
    assert kinds == [(3, "update_postimage"), (3, "update_preimage"), (4, "delete")]
