import gc
import tempfile
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import CorruptManifestError, MissingWalEntryError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.read_snapshot import _consistent_wal_tail
from memwal_sql.storage import layout
from tests.lsm import Model

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def rows(ids):
    return pa.table({"id": ids, "v": [f"v{i}" for i in ids]}, schema=SCHEMA)


def written(tmp_path, ids):
    """A table and its writer, which has put one WAL entry per id."""
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    for i in ids:
        w.upsert(rows([i]))
    return tbl, w


@pytest.mark.parametrize("kept", [False, True])
def test_a_tail_read_against_a_manifest_gc_overtook_is_read_again(tmp_path, kept):
    tbl, w = written(tmp_path, [1, 2, 3])
    reader = mw.open_table(str(tmp_path), cache=64 << 20)
    if kept:  # the reader has kept the tail as it was before the flush
        assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    manifests = RegionManifestStore(tbl.store, w.region_id)
    stale = manifests.latest()  # what a reader read just before the flush below
    w.flush()
    w.upsert(rows([4]))
    tbl.merge()
    tbl.catch_up_indexes()
    # the entries the flushed generation holds, once it is merged
    assert tbl.gc(base_versions_older_than=timedelta(0)).wal_entries == 3
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


# ---- WAL tails read once ---------------------------------------------------------------------


def count_wal_reads(table):
    """Record, in the returned list, each WAL position whose entry ``table``'s store returns."""
    read: list[int] = []
    get = table.store.get

    def counting(path, *args, **kwargs):
        data = get(path, *args, **kwargs)
        if "/wal/" in path:
            read.append(layout.parse_bitrev64(path))
        return data

    table.store.get = counting
    return read


def test_a_reader_reads_another_writers_entries_once_and_keeps_its_key_index(tmp_path):
    _, w = written(tmp_path, range(1, 6))
    reader = mw.open_table(str(tmp_path), cache=64 << 20)
    read = count_wal_reads(reader)
    assert reader.lookup([3]).column("v").to_pylist() == ["v3"]
    assert sorted(read) == [1, 2, 3, 4, 5]
    part = reader.caches.memtable
    index = [part.peek(kind, key) for kind, key in part.entries() if kind == "memtable_keys"]
    assert len(index) == 1
    w.upsert(pa.table({"id": [3], "v": ["new"]}, schema=SCHEMA))
    w.delete([4])
    for _ in range(3):
        assert reader.lookup([3, 4]).column("v").to_pylist() == ["new"]
    assert sorted(read) == [1, 2, 3, 4, 5, 6, 7]
    again = [part.peek(kind, key) for kind, key in part.entries() if kind == "memtable_keys"]
    assert again == index  # the same index, extended by the two entries
    [(_, tail)] = [part.peek(kind, key) for kind, key in part.entries() if kind == "wal_tail"]
    assert part.nbytes >= tail.nbytes > 0
    del reader
    gc.collect()
    assert not [kind for kind, _ in part.entries() if kind == "wal_tail"]  # gone with its table
    w.close()


def test_a_tail_larger_than_the_cache_is_read_whole_every_time_and_stays_right(tmp_path):
    _, w = written(tmp_path, range(1, 4))
    reader = mw.open_table(str(tmp_path), cache=0)
    read = count_wal_reads(reader)
    for _ in range(2):
        assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert sorted(read) == [1, 1, 2, 2, 3, 3]
    w.close()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(st.integers(0, 9), min_size=1, max_size=4)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
        st.tuples(st.sampled_from(["flush", "claim", "merge_gc", "read"]), st.just([])),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_a_reader_of_another_writers_wal_matches_the_model_and_reads_each_entry_once(ops):
    with tempfile.TemporaryDirectory() as d:
        tbl = mw.create_table(d, SCHEMA, primary_key="id")
        w = tbl.writer()
        reader = mw.open_table(d, cache=64 << 20)
        read = count_wal_reads(reader)
        model = Model(["id"])
        claims = 0
        for seed, (op, ks) in enumerate([*ops, ("read", [])]):
            if op == "upsert":
                batch = pa.table({"id": ks, "v": [f"{seed}.{k}" for k in ks]}, schema=SCHEMA)
                w.upsert(batch)
                model.upsert(batch)
            elif op == "delete":
                w.delete(ks)
                model.delete(pa.table({"id": ks}, schema=pa.schema([SCHEMA.field("id")])))
            elif op == "flush":
                w.flush()
            elif op == "claim":  # a new writer fences this one and replays its tail
                w = tbl.writer()
                claims += 1
            elif op == "merge_gc":
                w.flush()
                tbl.merge()
                tbl.catch_up_indexes()
                tbl.gc(base_versions_older_than=timedelta(0))
            else:
                assert reader.to_arrow().sort_by("id") == model.table(SCHEMA)
                assert reader.lookup(list(range(10))).sort_by("id") == model.table(SCHEMA)
        # Each entry once, but for the last one read before a claim, checked after it.
        assert len(read) - len(set(read)) <= claims
        w.close()
