"""The MemWAL index builder: region snapshots in the index, WAL hints, eventual reads."""

from __future__ import annotations

import os

import lance
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.formats import memwal_index as details_module
from memwal_sql.formats import region_snapshots
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.formats.region_snapshots import external_snapshot_path
from memwal_sql.maintenance.merger import merge_region
from memwal_sql.storage import layout

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])


def batch(ks, tag):
    return pa.table({"k": ks, "v": [f"{tag}{k}" for k in ks]}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        batch([100], "base"),
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 3),
    )
    tbl.upsert(batch(list(range(12)), "a"))
    tbl.flush()
    tbl.upsert(batch(list(range(6)), "b"))
    tbl.flush()
    return tbl


def latest_manifests(tbl):
    return {rid: RegionManifestStore(tbl.store, rid).latest() for rid in tbl.regions()}


def assert_snapshot_matches_manifests(tbl):
    """Every column of the snapshot schema (manifest fields, generations, region values)."""

    def rows(manifests):
        table = region_snapshots.snapshot_table(manifests, tbl.region_spec)
        return table.sort_by("region_id")

    assert rows(tbl.region_snapshots()) == rows(list(latest_manifests(tbl).values()))


def test_inline_snapshot_holds_every_region_manifest(table):
    result = table.build_region_snapshots()
    assert result.regions == 3 and result.inline and result.committed
    again = table.build_region_snapshots()  # no region changed: no new base version
    assert not again.committed and again.base_version == result.base_version
    d = table.mem_wal_details()
    assert d.num_regions == 3 and d.HasField("inline_snapshots") and d.snapshot_ts_millis > 0
    assert_snapshot_matches_manifests(table)
    assert lance.dataset(table.uri).mem_wal_index_details() is not None  # Lance still reads it


@pytest.mark.parametrize(
    "spec", [mw.RegionSpec.bucket("k", 8), mw.RegionSpec.identity("k")], ids=["bucket", "identity"]
)
@pytest.mark.parametrize("threshold", [None, 1], ids=["inline", "external"])
def test_num_regions_keeps_the_region_specs_count_after_snapshots(
    tmp_path, spec, threshold, monkeypatch
):
    """As Lance 14's initialize_mem_wal writes it (bucket N: N, identity: 0); the snapshot's
    own size is in the snapshot, and an identity table's snapshot is not taken as empty."""
    if threshold is not None:
        monkeypatch.setattr("memwal_sql.maintenance.index_builder.INLINE_THRESHOLD", threshold)
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k", region_spec=spec)
    assert tbl.mem_wal_details().num_regions == spec.num_regions
    tbl.upsert(batch([1, 2, 3, 4, 5], "a"))
    tbl.flush()
    result = tbl.build_region_snapshots()
    written = len(tbl.regions())
    assert result.committed and result.regions == written and 2 <= written != spec.num_regions
    assert tbl.mem_wal_details().num_regions == spec.num_regions
    assert len(mw.open_table(str(tmp_path)).region_snapshots()) == written
    assert tbl.to_arrow(consistency="eventual").sort_by("k") == batch([1, 2, 3, 4, 5], "a")
    tbl.close()


def test_an_external_snapshot_file_is_fsynced_before_the_commit_naming_it(table, monkeypatch):
    # The commit may reach the disk before GC syncs it; the file it names must be there then.
    monkeypatch.setattr("memwal_sql.maintenance.index_builder.INLINE_THRESHOLD", 2)
    versions = os.path.join(table.uri, "_versions")
    committed_at_sync = {}
    real = os.fsync

    def recording(fd):
        committed_at_sync.setdefault(os.readlink(f"/proc/self/fd/{fd}"), len(os.listdir(versions)))
        real(fd)

    before = len(os.listdir(versions))
    monkeypatch.setattr(os, "fsync", recording)
    result = table.build_region_snapshots()
    monkeypatch.undo()
    assert result.committed and not result.inline
    [snapshot_file] = [p for p in committed_at_sync if p.endswith("/index.lance")]
    assert committed_at_sync[snapshot_file] == before  # synced while no new version existed
    assert len(os.listdir(versions)) == before + 1


def test_eventual_reads_go_through_the_snapshot_not_the_manifests(table, monkeypatch):
    table.build_region_snapshots()
    as_built = table.to_arrow(consistency="eventual").sort_by("k")
    table.upsert(batch([50], "late"))
    table.flush()  # a generation the snapshot does not list yet

    def no_manifest_reads(self, known):
        raise AssertionError("an eventual read opened a region manifest")

    with monkeypatch.context() as m:
        m.setattr(RegionManifestStore, "refresh", no_manifest_reads)
        stale = table.to_arrow(consistency="eventual").sort_by("k")
    assert stale == as_built and 50 not in stale.column("k").to_pylist()
    table.build_region_snapshots()
    assert 50 in table.to_arrow(consistency="eventual").column("k").to_pylist()
    assert table.to_arrow(consistency="eventual").sort_by("k") == table.to_arrow().sort_by("k")


def test_beyond_the_threshold_the_snapshot_is_a_lance_file_that_survives_merges(table, monkeypatch):
    monkeypatch.setattr("memwal_sql.maintenance.index_builder.INLINE_THRESHOLD", 2)
    result = table.build_region_snapshots()
    assert not result.inline
    d = table.mem_wal_details()
    assert not d.HasField("inline_snapshots") and d.num_regions == 3
    path = external_snapshot_path(d.snapshot_ts_millis)
    assert table.store.exists(path)
    assert_snapshot_matches_manifests(table)
    ts = d.snapshot_ts_millis
    merge_region(table, table.regions()[0])  # Lance gives the MemWAL index a new uuid
    d = table.mem_wal_details()
    assert d.snapshot_ts_millis == ts and d.num_regions == 3  # kept by Lance's merge commit
    assert len(table.region_snapshots()) == 3
    table.store.delete(path)  # cleaned up: readers fall back to the manifests
    table._snapshots_cache = None
    assert table.region_snapshots() is None
    assert table.to_arrow(consistency="eventual").num_rows == table.to_arrow().num_rows


def test_the_builder_refreshes_wal_hints(table):
    for i in range(3):
        table.upsert(batch(list(range(20 + i * 10, 30 + i * 10)), f"h{i}"))  # WAL entries only

    def hints():
        out = {}
        for rid, m in latest_manifests(table).items():
            newest = max(
                layout.parse_bitrev64(e.path) for e in table.store.list(layout.wal_dir(rid) + "/")
            )
            out[rid] = (m.wal_entry_position_last_seen, newest)
        return out

    assert any(seen < newest for seen, newest in hints().values())
    assert table.build_region_snapshots().hints_refreshed >= 1
    assert all(seen == newest for seen, newest in hints().values())
    table.upsert(batch([99], "after"))
    table.flush()  # writers commit on over the builder's manifest versions
    assert 99 in table.to_arrow().column("k").to_pylist()


def test_a_merge_committed_under_the_builder_is_not_undone(table, monkeypatch):
    """Lance 14 rebases the builder's index commit over a concurrent merge; the merge's progress
    must survive (else readers and mergers would treat merged generations as new)."""
    rid = table.regions()[0]
    original = details_module.create_mem_wal_index
    raced = []

    def merge_first(ds, details, storage_options=None):
        if not raced:
            raced.append(merge_region(table, rid).merged)  # lands after the builder's read
        return original(ds, details, storage_options)

    monkeypatch.setattr(details_module, "create_mem_wal_index", merge_first)
    table.build_region_snapshots()
    assert raced and raced[0] == {rid: [1, 2]}
    assert table.merged_generations() == {rid: 2}
    assert lance.dataset(table.uri).mem_wal_index_details() is not None
    assert table.mem_wal_details().num_regions == 3


def test_snapshot_rows_round_trip_through_lance_file_bytes():
    spec = mw.RegionSpec.bucket("k", 4)
    m = region_snapshots.RegionManifest(
        version=3,
        writer_epoch=2,
        current_generation=5,
        replay_after_wal_entry_position=7,
        wal_entry_position_last_seen=9,
        region_spec_id=1,
    )
    m.region_id.uuid = b"\x01" * 16
    m.flushed_generations.add(generation=4, path="abcd1234_gen_4")
    for field_id, value in spec.field_entries((3,)):
        m.region_field_entries.add(field_id=field_id, value=value)
    rows = region_snapshots.snapshot_table([m], spec)
    assert rows.schema.field("region_field_bucket").type == pa.int32()
    back = region_snapshots.from_lance_bytes(region_snapshots.to_lance_bytes(rows))
    assert region_snapshots.manifests_from_table(back, spec) == [m]


def test_an_unreadable_snapshot_falls_back_to_the_manifests(table):
    table.build_region_snapshots()

    def corrupt(d):
        d.inline_snapshots = b"not a lance file"

    details_module.update_mem_wal_details(table.uri, table.store, corrupt)
    assert table.region_snapshots() is None
    assert table.to_arrow(consistency="eventual").sort_by("k") == table.to_arrow().sort_by("k")
