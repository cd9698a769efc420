from datetime import timedelta

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import CorruptManifestError, MissingWalEntryError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.read_snapshot import _consistent_wal_tail
from memwal_sql.storage import layout

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def rows(ids):
    return pa.table({"id": ids, "v": [f"v{i}" for i in ids]}, schema=SCHEMA)


def test_a_tail_read_against_a_manifest_gc_overtook_is_read_again(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    w.upsert(rows([3]))
    manifests = RegionManifestStore(tbl.store, w.region_id)
    stale = manifests.latest()  # what a reader read just before the flush below
    w.flush()
    w.upsert(rows([4]))
    tbl.merge()
    tbl.catch_up_indexes()
    # the entries the flushed generation holds, once it is merged
    assert tbl.gc(base_versions_older_than=timedelta(0)).wal_entries == 2
    reader = mw.open_table(str(tmp_path))
    manifest, tail = _consistent_wal_tail(reader, w.region_id, stale)
    assert manifest.version > stale.version
    assert [i for b in tail for i in b.column("id").to_pylist()] == [4]
    assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]
    w.close()


def test_a_lost_wal_entry_fails_reads_and_claims_and_deletes_nothing(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    for i in range(1, 5):
        w.upsert(rows([i]))
    rid = w.region_id
    w.release()  # as if the process died: the rows are only in the WAL
    lost = layout.wal_entry_path(rid, 2)
    tbl.store.delete(lost)
    before = sorted(m.path for m in tbl.store.list(layout.wal_dir(rid) + "/"))
    reader = mw.open_table(str(tmp_path))
    with pytest.raises(MissingWalEntryError, match="position 2"):
        reader.to_arrow()
    with pytest.raises(MissingWalEntryError, match="position 2"):
        reader.writer(region_id=rid)
    assert sorted(m.path for m in tbl.store.list(layout.wal_dir(rid) + "/")) == before


def test_every_read_path_raises_the_typed_error_through_datafusion(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    for i in range(1, 4):
        w.upsert(rows([i]))
    w.release()
    tbl.store.delete(layout.wal_entry_path(w.region_id, 1))
    reader = mw.open_table(str(tmp_path))
    for read in (
        reader.to_arrow,
        reader.count_rows,
        lambda: reader.scan().read_all(),
        lambda: reader.to_arrow(filter="id = 2"),
        reader.explain,
        lambda: reader.lookup([2]),
    ):
        with pytest.raises(MissingWalEntryError):
            read()


def test_a_region_whose_manifests_were_lost_is_an_error_not_an_empty_region(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    w.release()
    tbl.store.delete_prefix(layout.manifest_dir(w.region_id) + "/")
    with pytest.raises(CorruptManifestError, match="no manifest"):
        mw.open_table(str(tmp_path)).to_arrow()
