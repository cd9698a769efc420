"""The merger: generations folded into the base table in order, exactly once, crash-safe."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import lance
import pyarrow as pa
import pyarrow.compute
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.formats.region_manifest import RegionManifestStore
from tests.lsm import (
    Model,
    apply_op,
    files_under,
    lance_latest_rows,
    op_sequences,
    record_fsyncs,
    seeded_table,
)

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
ops = op_sequences(
    20, 6, ["flush", "merge", "gc", "reindex", "catchup", "snapshot", "crash", "reopen", "compact"]
)


def batch(ks, seed):
    return pa.table({"k": ks, "v": [f"v{k}-{seed}" for k in ks]}, schema=SCHEMA)


def assert_reads(tbl, model, d):
    want = model.table(SCHEMA)
    assert tbl.to_arrow().sort_by("k") == want
    assert tbl.lookup(list(range(21))).sort_by("k") == want
    assert tbl.to_arrow(filter="k >= 7").sort_by("k") == want.filter(pa.compute.field("k") >= 7)

    # While no region manifest changed since the region snapshot, eventual reads through it
    # see what they would see through the manifests.
    # A writer's flush may commit a manifest in the background meanwhile: compare only when no
    # manifest changed from before the first read to after the second.
    def versions(manifests):
        return sorted((m.region_id.uuid, m.version) for m in manifests)

    def latest():
        return versions(RegionManifestStore(tbl.store, r).latest() for r in tbl.regions())

    snapshotted = tbl.region_snapshots()
    before = latest()
    direct = mw.open_table(d)
    direct.region_snapshots = lambda dataset=None: None
    through_snapshot = tbl.to_arrow(consistency="eventual").sort_by("k")
    through_manifests = direct.to_arrow(consistency="eventual").sort_by("k")
    if snapshotted is not None and versions(snapshotted) == before == latest():
        assert through_snapshot == through_manifests


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, bucketed=st.booleans())
def test_merges_and_gc_interleaved_with_writes_keep_the_latest_rows(ops, bucketed):
    with tempfile.TemporaryDirectory() as d:
        tbl, model = seeded_table(
            d,
            batch(list(range(0, 21, 3)), 0),
            "k",
            buckets=2 if bucketed else None,
            max_memtable_rows=4,
        )
        for op, ks, seed in ops:
            tbl = apply_op(tbl, model, op, ks, seed, d, batch)
            assert_reads(tbl, model, d)
        tbl.close()
        tbl = mw.open_table(d)
        for rid in tbl.regions():  # replay abandoned WAL tails into generations
            tbl.writer(region_id=rid).close()
        tbl.maintain(base_versions_older_than=timedelta(0))
        assert_reads(tbl, model, d)
        assert tbl.to_arrow(consistency="eventual").sort_by("k") == model.table(SCHEMA)
        assert lance_latest_rows(d, ["k"]) == model.table(SCHEMA)  # Lance reads it too
        # Everything flushed is merged: the base table alone holds the latest rows.
        assert lance.dataset(d).to_table().sort_by("k") == model.table(SCHEMA)


def test_a_merger_that_dies_before_its_commit_leaves_nothing(tmp_path, monkeypatch):
    tbl = mw.create_table(str(tmp_path), batch([1, 2, 3], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1], 5))
        w.delete([2])
    real = lance.LanceDataset.merge_insert

    def dying(self, on):
        raise RuntimeError("merger killed before its commit")

    monkeypatch.setattr(lance.LanceDataset, "merge_insert", dying)
    with pytest.raises(RuntimeError):
        tbl.merge()
    monkeypatch.setattr(lance.LanceDataset, "merge_insert", real)
    assert tbl.merged_generations() == {}
    assert tbl.to_arrow().sort_by("k").to_pydict() == {"k": [1, 3], "v": ["v1-5", "v3-0"]}
    result = tbl.merge()
    assert result.merged == {w.region_id: [1]} and result.rows_deleted == 1
    assert lance.dataset(str(tmp_path)).to_table().sort_by("k").to_pydict() == {
        "k": [1, 3],
        "v": ["v1-5", "v3-0"],
    }
    assert tbl.merge().merged == {}  # appendix 2, scenario 2: nothing is merged twice


def test_a_stale_merger_cannot_undo_a_later_reinsert(tmp_path):
    """Merger B read the progress before merger A merged generations 1 and 2; B's late attempt
    at generation 1 (which deleted k=2; generation 2 re-inserts it) must change nothing."""
    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")
    with tbl.writer() as w:
        w.delete([2])
        w.flush()
        w.upsert(batch([2], 7))
    stale = tbl.dataset()  # what B read
    tbl.merge()  # A merges generations 1 and 2
    from lance.mem_wal import CompactedSsTable

    from memwal_sql.maintenance.merger import sql_key_predicate

    gen1 = tbl.store.uri_for(
        f"_mem_wal/{w.region_id}/"
        + __import__("memwal_sql.formats.region_manifest", fromlist=["x"])
        .RegionManifestStore(tbl.store, w.region_id)
        .latest()
        .flushed_generations[0]
        .path
    )
    rows = lance.dataset(gen1).to_table()
    with pytest.raises(OSError, match="Stale"):
        (
            stale.merge_insert("k")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(sql_key_predicate(rows.select(["k"])))
            .mark_sstables_as_compacted([CompactedSsTable(w.region_id, 1)])
            .execute(rows.filter(pa.compute.invert(rows.column("_tombstone"))).select(["k", "v"]))
        )
    assert tbl.to_arrow().sort_by("k").to_pydict() == {"k": [1, 2], "v": ["v1-0", "v2-7"]}
    assert lance.dataset(str(tmp_path)).to_table().sort_by("k").to_pydict() == {
        "k": [1, 2],
        "v": ["v1-0", "v2-7"],
    }


def test_a_merger_over_a_superset_of_a_concurrent_merge_inserts_each_key_once(tmp_path):
    """Merger B read the base table before merger A merged generations 1 and 2, and merges 1 to 3:
    its progress record is newer than A's, so Lance accepts it, and its inserts of the keys A
    already inserted must be re-joined, not appended a second time (with a key index too)."""
    tbl = mw.create_table(str(tmp_path), batch([0], 0), primary_key="k")
    tbl.dataset().create_scalar_index("k", "BTREE")
    with tbl.writer() as w:
        for g in range(3):
            w.upsert(batch([10 + g, 20 + g], g))
            w.flush()
    stale = tbl.dataset()  # what B read
    from memwal_sql.maintenance.merger import merge_region

    assert merge_region(tbl, w.region_id, max_generations=2).merged == {w.region_id: [1, 2]}
    reads = iter([stale])
    tbl.dataset = lambda version=None: next(reads, None) or lance.dataset(str(tmp_path))
    merge_region(tbl, w.region_id)
    base = lance.dataset(str(tmp_path)).to_table().sort_by("k")
    assert base.column("k").to_pylist() == [0, 10, 11, 12, 20, 21, 22]
    assert tbl.merged_generations() == {w.region_id: 3}


RACER = """
import sys, memwal_sql as mw
r = mw.open_table(sys.argv[1]).merge()
print(sum(len(g) for g in r.merged.values()), r.conflicts)
"""


@pytest.mark.slow
def test_racing_mergers_merge_each_generation_exactly_once(tmp_path):
    uri = str(tmp_path)
    tbl = mw.create_table(uri, batch(list(range(50)), 0), primary_key="k")
    model = Model(["k"])
    model.upsert(batch(list(range(50)), 0))
    with tbl.writer(max_memtable_rows=10) as w:
        for i in range(12):
            w.upsert(batch(list(range(i * 4, i * 4 + 10)), i + 1))
            model.upsert(batch(list(range(i * 4, i * 4 + 10)), i + 1))
            w.delete([i * 4 + 1])
            model.delete(pa.table({"k": [i * 4 + 1]}))
    gens = len(tbl.to_arrow(["k"], with_system_columns=True))  # noqa: F841 - reads work before
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    merged_counts = [int(o[0].split()[0]) for o in outs]
    (rid,) = tbl.regions()
    from memwal_sql.formats.region_manifest import RegionManifestStore

    flushed = len(RegionManifestStore(tbl.store, rid).latest().flushed_generations)
    assert sum(merged_counts) == flushed  # each generation merged by exactly one merger
    assert tbl.merged_generations() == {rid: flushed}
    assert lance.dataset(uri).to_table().sort_by("k") == model.table(SCHEMA)
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)


KILLED_AFTER_COMMIT = """
import os, signal, sys
from lance.dataset import MergeInsertBuilder
import memwal_sql as mw

real = MergeInsertBuilder.execute

def execute_then_die(self, data):
    out = real(self, data)  # the merge and its progress are committed
    os.kill(os.getpid(), signal.SIGKILL)
    return out

MergeInsertBuilder.execute = execute_then_die
mw.open_table(sys.argv[1]).merge(max_generations_per_region=1)
"""


@pytest.mark.slow
def test_a_merger_killed_right_after_its_commit_is_not_merged_twice(tmp_path):
    uri = str(tmp_path)
    tbl = mw.create_table(uri, batch([1, 2, 3], 0), primary_key="k")
    model = Model(["k"])
    model.upsert(batch([1, 2, 3], 0))
    with tbl.writer(max_memtable_rows=2) as w:
        for i in range(3):
            w.upsert(batch([i, i + 10], i + 1))
            model.upsert(batch([i, i + 10], i + 1))
        w.delete([2])
        model.delete(pa.table({"k": [2]}))
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_COMMIT, uri],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    committed = tbl.merged_generations()
    assert list(committed.values()) == [1]  # the killed merger's commit landed...
    versions = tbl.dataset().version
    rest = tbl.merge()  # ...and the next merger goes on after it, never before
    assert next(g for gens in rest.merged.values() for g in gens) == 2
    assert tbl.dataset().version == versions + 1  # one commit for the rest
    assert lance.dataset(uri).to_table().sort_by("k") == model.table(SCHEMA)
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)
    assert lance_latest_rows(uri, ["k"]) == model.table(SCHEMA)


@pytest.mark.slow
def test_maintain_watch_runs_beside_a_live_writer(tmp_path):
    uri = str(tmp_path)
    tbl = mw.create_table(
        uri, batch(list(range(30)), 0), primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    model = Model(["k"])
    model.upsert(batch(list(range(30)), 0))
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memwal_sql.cli",
            "maintain",
            uri,
            "--watch",
            "0.05",
            "--base-versions-older-than",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for i in range(40):
            ks = [(i * 7 + j) % 60 for j in range(5)]
            tbl.upsert(batch(ks, i + 1))
            model.upsert(batch(ks, i + 1))
            tbl.delete([(i * 11) % 60])
            model.delete(pa.table({"k": [(i * 11) % 60]}))
            if i % 4 == 3:
                tbl.flush()
                assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)
                assert tbl.lookup(list(range(60))).sort_by("k") == model.table(SCHEMA)
        # However fast the writes were, let the watcher finish a pass (it prints each one).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and " pass " not in watcher.stdout.readline():
            assert watcher.poll() is None, watcher.stderr.read()[-3000:]
    finally:
        watcher.terminate()
        _, err = watcher.communicate(timeout=60)
    assert "Traceback" not in err and "memwal: error" not in err, err[-3000:]
    assert tbl.merged_generations() and tbl.region_snapshots() is not None  # it did its work
    tbl.close()
    result = tbl.maintain()
    assert result.ok, result.failures
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)
    assert tbl.to_arrow(consistency="eventual").sort_by("k") == model.table(SCHEMA)
    assert lance_latest_rows(uri, ["k"]) == model.table(SCHEMA)
    assert result.merge.conflicts == 0


def test_gc_fsyncs_the_merge_commit_before_deleting_what_it_merged(tmp_path, monkeypatch):
    # Lance commits without fsync. GC deletes generations and WAL entries on the word of the
    # base version that merged them, so it makes that version durable first, whoever wrote it
    # (merges and index catch-ups do not sync: as if each had died right after its commit).
    from memwal_sql.storage import ObjectStore

    tbl = mw.create_table(str(tmp_path), batch([1, 2, 3], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1, 4], 5))
        w.delete([2])
    tbl.merge()
    tbl.catch_up_indexes()  # GC also waits for the key index to cover the merged rows
    merged = files_under(tmp_path) - files_under(tmp_path / "_mem_wal")
    events = []
    synced = record_fsyncs(monkeypatch)
    real_delete = ObjectStore.delete_prefix
    monkeypatch.setattr(
        ObjectStore,
        "delete_prefix",
        lambda self, prefix: (events.append(set(synced)), real_delete(self, prefix))[1],
    )
    result = tbl.gc(base_versions_older_than=timedelta(0))
    monkeypatch.undo()
    assert result.generations == {w.region_id: [1]}
    assert events and merged <= events[0]  # every file of the merge, before the first deletion
    assert {os.path.dirname(p) for p in merged} <= events[0]
