"""GC deletes only what no reader, recovering writer or fenced writer can need."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import google_crc32c
import lance
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import WriterFencedError
from memwal_sql.formats.region_manifest import RegionManifestStore, commit_change
from memwal_sql.formats.wal import iter_wal, read_wal_entry, wal_positions
from memwal_sql.storage import layout
from memwal_sql.storage.checksums import CHECKSUMS, recorded_wal_entry_position
from tests.lsm import Model, files_under, lance_latest_rows, record_fsyncs

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
NOW = timedelta(0)


def batch(ks, seed):
    return pa.table({"k": ks, "v": [f"v{k}-{seed}" for k in ks]}, schema=SCHEMA)


def data_entries(store, rid):
    """Positions of the WAL data entries still stored (fence sentinels aside)."""
    return [p for p in wal_positions(store, rid) if not read_wal_entry(store, rid, p).is_sentinel]


def gen_dirs(tbl, rid):
    return [d for d in tbl.store.list_dirs(layout.region_dir(rid)) if "_gen_" in d]


def test_a_long_run_shrinks_back_to_the_base_table_plus_live_generations(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch(list(range(20)), 0), primary_key="k")
    model = Model(["k"])
    model.upsert(batch(list(range(20)), 0))
    w = tbl.writer(max_memtable_rows=15)
    for i in range(10):
        w.upsert(batch(list(range(i * 5, i * 5 + 15)), i + 1))
        model.upsert(batch(list(range(i * 5, i * 5 + 15)), i + 1))
        w.delete([i * 5 + 2])
        model.delete(pa.table({"k": [i * 5 + 2]}))
    w.flush()
    w.upsert(batch([1000], 99))  # a live, unflushed row
    model.upsert(batch([1000], 99))
    rid = w.region_id
    flushed = len(RegionManifestStore(tbl.store, rid).latest().flushed_generations)
    assert flushed >= 5 and len(gen_dirs(tbl, rid)) == flushed

    wal_before = len(data_entries(tbl.store, rid))
    # Not merged yet: GC keeps every generation and, as the spec says, the WAL entries their
    # rows came from; it says why.
    first = tbl.gc(base_versions_older_than=NOW)
    assert first.generations == {} and first.wal_entries == 0
    assert len(data_entries(tbl.store, rid)) == wal_before
    assert [k.what for k in first.kept] == [
        f"generations 1-{flushed}",
        f"{wal_before - 1} flushed WAL entries",
    ]
    assert "not merged" in first.kept[0].reason and "(merge, or maintain)" in first.summary()
    assert len(gen_dirs(tbl, rid)) == flushed
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)
    tbl.merge()
    # Merged, but older base versions still list the generations: kept.
    retained = tbl.gc()
    assert retained.generations == {} and retained.wal_entries == 0
    assert "base_versions_older_than" in retained.kept[0].reason
    # Merged in every retained version, but the key index does not cover the merged rows yet
    # (indexed reads go through the generations): kept, and reads stay exact.
    lagging = tbl.gc(base_versions_older_than=NOW)
    assert lagging.generations == {} and lagging.wal_entries == 0
    assert "'k_pk_btree'" in lagging.kept[0].reason
    assert len(gen_dirs(tbl, rid)) == flushed
    assert tbl.lookup(list(range(1001))).sort_by("k") == model.table(SCHEMA)
    assert tbl.catch_up_indexes().optimized == ["k_pk_btree"]
    result = tbl.gc(base_versions_older_than=NOW)
    assert sorted(result.generations[rid]) == list(range(1, flushed + 1))
    assert result.wal_entries == wal_before - 1 and result.kept == []
    assert gen_dirs(tbl, rid) == []
    m = RegionManifestStore(tbl.store, rid).latest()
    assert list(m.flushed_generations) == []
    remaining = list(iter_wal(tbl.store, rid, m.replay_after_wal_entry_position))
    assert [e.num_rows for e in remaining] == [1]  # only the live row's entry is left
    assert len(RegionManifestStore(tbl.store, rid).list_versions()) <= 10
    # Reads are unchanged, through every path.
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)
    assert tbl.lookup(list(range(1001))).sort_by("k") == model.table(SCHEMA)
    w.close()
    assert lance_latest_rows(str(tmp_path), ["k"]) == model.table(SCHEMA)
    # A recovering writer still finds what it needs.
    with tbl.writer(region_id=rid) as w2:
        w2.upsert(batch([5000], 1))
    model.upsert(batch([5000], 1))
    assert tbl.to_arrow().sort_by("k") == model.table(SCHEMA)


def test_wal_entries_go_with_the_generation_holding_their_rows(tmp_path):
    """Merging some generations frees exactly their WAL entries; a generation that recorded no
    WAL position (as Lance writes them) holds every entry until no generation is left."""
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    with tbl.writer() as w:
        for g in range(4):  # four generations of two WAL entries each
            w.upsert(batch([g * 10], g))
            w.upsert(batch([g * 10 + 1], g))
            w.flush()
    rid = w.region_id
    store = tbl.store
    m = RegionManifestStore(store, rid).latest()
    gens = sorted(m.flushed_generations, key=lambda g: g.generation)
    bounds = [
        recorded_wal_entry_position(store, f"{layout.region_dir(rid)}/{g.path}") for g in gens
    ]
    assert bounds == sorted(bounds) and len(set(bounds)) == 4
    tbl.merge(max_generations_per_region=2)
    tbl.catch_up_indexes()
    result = tbl.gc(base_versions_older_than=NOW)
    assert sorted(result.generations[rid]) == [1, 2]
    left = data_entries(store, rid)
    assert left and min(left) > bounds[1] and result.wal_entries == 4
    assert [k.what for k in result.kept] == ["generations 3-4", f"{len(left)} flushed WAL entries"]

    # Generation 3 without its WAL position (its record rewritten, and the manifest's
    # checksum of it): nothing more goes until generation 4 is merged too.
    path = f"{layout.region_dir(rid)}/{gens[2].path}/{CHECKSUMS}"
    record = json.loads(store.get(path))
    del record["wal_entry_position"]
    store.put(path, json.dumps(record).encode())

    def new_record(m: RegionManifest) -> bool:
        [g] = [g for g in m.flushed_generations if g.path == gens[2].path]
        g.checksums_crc32c = google_crc32c.value(store.get(path))
        return True

    commit_change(RegionManifestStore(store, rid), new_record)
    tbl.merge(max_generations_per_region=1)
    tbl.catch_up_indexes()
    assert tbl.gc(base_versions_older_than=NOW).wal_entries == 0
    assert data_entries(store, rid) == left
    tbl.merge()
    tbl.catch_up_indexes()
    assert tbl.gc(base_versions_older_than=NOW).wal_entries == len(left)
    assert tbl.to_arrow().sort_by("k").column("k").to_pylist() == [0, 1, 10, 11, 20, 21, 30, 31]


def test_gc_never_lets_a_fenced_writer_succeed(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    a = tbl.writer()
    a.upsert(batch([1], 1))
    b = tbl.writer(region_id=a.region_id)  # fences a: sentinel at a's next position
    sentinel_pos = a.stats()["next_wal_position"]
    assert read_wal_entry(tbl.store, a.region_id, sentinel_pos).is_sentinel
    b.upsert(batch([2], 2))
    b.flush()  # replay_after moves past the sentinel
    tbl.merge()
    tbl.catch_up_indexes()
    tbl.gc(base_versions_older_than=NOW)
    assert read_wal_entry(tbl.store, a.region_id, sentinel_pos).is_sentinel  # kept
    assert read_wal_entry(tbl.store, a.region_id, 1) is None  # data entry collected
    with pytest.raises(WriterFencedError):
        a.upsert(batch([3], 3))
    b.close()
    assert tbl.to_arrow().sort_by("k").column("k").to_pylist() == [1, 2]


def test_orphans_of_failed_flushes_are_collected(tmp_path, failing_first_flush):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    calls = failing_first_flush
    with tbl.writer() as w:
        w.upsert(batch([1, 2], 0))
    assert len(gen_dirs(tbl, w.region_id)) == 2
    result = tbl.gc()
    assert result.orphan_directories == 1
    (left,) = gen_dirs(tbl, w.region_id)
    assert calls[1].endswith(left)
    assert tbl.to_arrow().num_rows == 2
    assert lance.dataset(str(tmp_path)).count_rows() == 0  # nothing merged: gen 1 is needed


def test_temp_files_of_crashed_puts_are_collected(tmp_path):
    import os

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1], 0))
    wal = tmp_path / layout.wal_dir(w.region_id)
    old, fresh = wal / ".x.1.tmp", wal / ".x.2.tmp"
    for p in (old, fresh):
        p.write_bytes(b"partial")
    os.utime(old, (0, 0))
    before = tbl.gc().objects
    assert not old.exists() and fresh.exists()  # a fresh one may be a put in progress
    assert before >= 1 and tbl.to_arrow().num_rows == 1


def test_each_gc_pass_syncs_the_base_files_written_since_the_last_one_began(tmp_path, monkeypatch):
    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")

    def base_files():
        return {p for p in files_under(tmp_path) if "_mem_wal" not in p}

    def gc_syncs():
        synced = record_fsyncs(monkeypatch)
        tbl.gc()
        monkeypatch.undo()
        return synced & base_files()

    assert gc_syncs() == base_files()  # no marker yet: everything
    old = time.time() - 3600
    for p in base_files():
        os.utime(p, (old, old))
    assert gc_syncs() == set()  # nothing written since the last pass began
    with tbl.writer() as w:
        w.upsert(batch([3], 1))
    tbl.merge()
    written = {p for p in base_files() if os.stat(p).st_mtime > old + 1}
    assert any("/data/" in p for p in written)
    assert gc_syncs() == written  # the merge's commit (and the hint Lance rewrote), nothing older
    tbl.store.put(layout.BASE_SYNCED, b"garbage")  # a lost or damaged marker: everything again
    assert gc_syncs() == base_files()


def test_a_merge_committed_while_gc_runs_is_synced_before_gc_acts_on_it(tmp_path, monkeypatch):
    from memwal_sql.storage import ObjectStore

    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([3], 1))
    tbl.gc()  # the marker: the next pass syncs only what is new
    real_sync = ObjectStore.sync_written_since
    calls = []

    def merge_right_after_the_first_sync(self, since):
        n = real_sync(self, since)
        if not calls:  # another process merges just after the pass's first walk
            tbl.merge()
            tbl.catch_up_indexes()
        calls.append(since)
        return n

    before = files_under(tmp_path)
    monkeypatch.setattr(ObjectStore, "sync_written_since", merge_right_after_the_first_sync)
    synced = record_fsyncs(monkeypatch)
    at_first_delete = []
    real_delete = ObjectStore.delete_prefix
    monkeypatch.setattr(
        ObjectStore,
        "delete_prefix",
        lambda self, prefix: (at_first_delete.append(set(synced)), real_delete(self, prefix))[1],
    )
    result = tbl.gc(base_versions_older_than=timedelta(0))
    monkeypatch.undo()
    assert result.generations == {w.region_id: [1]}  # on the word of the merge's version
    committed = {p for p in files_under(tmp_path) - before if "_mem_wal" not in p}
    assert any("/data/" in p for p in committed) and committed <= at_first_delete[0]


def test_a_read_of_a_generation_gc_collected_after_its_snapshot_is_retryable(tmp_path):
    # Not damage: the snapshot is older than the GC pass. A new read sees the merged rows.
    from memwal_sql.errors import GenerationCollectedError, RetryableError
    from memwal_sql.read_snapshot import take_read_snapshot
    from planner.scan import plan_scan

    tbl = mw.create_table(
        str(tmp_path),
        pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())]),
        primary_key="id",
    )
    tbl.upsert({"id": [1, 2], "v": ["a", "b"]})
    tbl.flush()
    plan = plan_scan(take_read_snapshot(tbl), tbl.region_spec, tbl.schema, None)
    assert tbl.maintain(base_versions_older_than=timedelta(0)).gc.generations
    tbl.caches.clear()
    with pytest.raises(GenerationCollectedError, match="read again") as e:
        plan.root.to_table()
    assert isinstance(e.value, RetryableError)
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == [1, 2]
    tbl.close()


def test_a_version_another_maintainer_cleans_up_while_gc_reads_it_is_read_again(
    tmp_path, monkeypatch
):
    # Another maintainer's cleanup (base_versions_older_than=0) lands between this pass's
    # listing of base versions and its reading of the oldest: a lost race, not a failure.
    tbl = mw.create_table(str(tmp_path), batch([1, 2], 0), primary_key="k")
    with tbl.writer() as w:
        w.upsert(batch([1], 1))
        rid = w.region_id
    tbl.merge()
    tbl.catch_up_indexes()
    other = mw.open_table(str(tmp_path))
    real = lance.LanceDataset.versions
    cleaned = []

    def versions(ds):
        listed = real(ds)
        if not cleaned:
            cleaned.append(other.dataset().cleanup_old_versions(older_than=NOW).old_versions)
        return listed

    monkeypatch.setattr(lance.LanceDataset, "versions", versions)
    result = tbl.gc()
    assert cleaned[0] >= 2  # the oldest version listed was gone when it was read
    assert result.generations == {rid: [1]}  # merged as of the oldest version left
    assert sorted(tbl.to_arrow().column("v").to_pylist()) == ["v1-1", "v2-0"]
