import os
import subprocess
import sys
import time
import uuid

import lance
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import (
    CorruptWalEntryError,
    InvalidInputError,
    PrimaryKeyError,
    SchemaMismatchError,
    StorageError,
    TableClosedError,
    TableExistsError,
    TableNotFoundError,
    UnknownRegionError,
    WriterFencedError,
    WrongRegionError,
)
from memwal_sql.storage import layout
from tests.lsm import Model, files_under, lance_latest_rows, record_fsyncs

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def rows(ids, tag="a"):
    return pa.table({"id": ids, "v": [f"{tag}{i}" for i in ids]}, schema=SCHEMA)


def test_create_sets_the_primary_key_and_the_mem_wal_index(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), rows([1, 2]), primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    ds = lance.dataset(str(tmp_path))
    assert [f.name() for f in ds.lance_schema.unenforced_primary_key()] == ["id"]
    assert ds.mem_wal_index_details()["num_shards"] == 4
    assert ds.count_rows() == 2
    again = mw.open_table(str(tmp_path))
    assert again.primary_key == ("id",) and again.region_spec == tbl.region_spec


def test_composite_primary_key(tmp_path):
    schema = pa.schema(
        [
            pa.field("a", pa.int32(), False),
            pa.field("b", pa.string(), False),
            pa.field("x", pa.float64()),
        ]
    )
    tbl = mw.create_table(
        str(tmp_path), schema, primary_key=["a", "b"], region_spec=mw.RegionSpec.bucket("b", 2)
    )
    model = Model(["a", "b"])
    data = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"], "x": [1.0, 2.0, 3.0]}, schema=schema)
    tbl.upsert(data)
    model.upsert(data)
    tbl.upsert(pa.table({"a": [1], "b": ["x"], "x": [9.0]}, schema=schema))
    model.upsert(pa.table({"a": [1], "b": ["x"], "x": [9.0]}, schema=schema))
    tbl.delete(pa.table({"a": [2], "b": ["x"]}))
    model.delete(pa.table({"a": [2], "b": ["x"]}))
    tbl.close()
    assert mw.open_table(str(tmp_path)).primary_key == ("a", "b")
    assert lance_latest_rows(str(tmp_path), ["a", "b"]) == model.table(schema)


def test_enable_mem_wal_on_an_existing_lance_table(tmp_path):
    uri = str(tmp_path / "plain")
    lance.write_dataset(rows([1, 2, 3]), uri)
    tbl = mw.create_table(uri, None, primary_key="id")
    tbl.upsert(rows([2], "new"))
    tbl.delete([3])
    tbl.close()
    got = lance_latest_rows(uri, ["id"])
    assert got.to_pylist() == [{"id": 1, "v": "a1"}, {"id": 2, "v": "new2"}]


def test_enable_mem_wal_where_the_key_column_is_nullable_but_holds_no_null(tmp_path):
    uri = str(tmp_path / "plain")
    lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}), uri)  # id: nullable int64
    tbl = mw.create_table(uri, None, primary_key="id")
    assert not lance.dataset(uri).schema.field("id").nullable
    tbl.upsert({"id": [3], "v": ["c"]})
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    tbl.close()
    with_null = str(tmp_path / "nulls")
    lance.write_dataset(pa.table({"id": [1, None], "v": ["a", "b"]}), with_null)
    with pytest.raises(PrimaryKeyError, match="holds nulls"):
        mw.create_table(with_null, None, primary_key="id")


def test_create_and_open_errors(tmp_path):
    with pytest.raises(TableNotFoundError):
        mw.open_table(str(tmp_path / "missing"))
    with pytest.raises(TableNotFoundError):
        mw.create_table(str(tmp_path / "missing"), None, primary_key="id")
    plain = str(tmp_path / "plain")
    lance.write_dataset(rows([1]), plain)
    with pytest.raises(TableNotFoundError, match="without MemWAL"):
        mw.open_table(plain)
    mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id")
    with pytest.raises(TableExistsError):
        mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id")
    with pytest.raises(PrimaryKeyError):
        mw.create_table(str(tmp_path / "u"), SCHEMA, primary_key="nope")
    with pytest.raises(PrimaryKeyError):
        mw.create_table(str(tmp_path / "w"), pa.table({"id": [1, None]}), primary_key="id")


def test_the_file_format_is_chosen_at_creation_and_kept_by_an_existing_table(tmp_path):
    with pytest.raises(InvalidInputError, match="pick one of"):
        mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", data_storage_version="3")
    assert not (tmp_path / "t").exists()
    plain = str(tmp_path / "plain")
    lance.write_dataset(rows([1]), plain, data_storage_version="2.1")
    with pytest.raises(InvalidInputError, match="keeps its format"):
        mw.create_table(plain, None, primary_key="id", data_storage_version="2.0")
    assert lance.dataset(plain).mem_wal_index_details() is None
    tbl = mw.create_table(plain, None, primary_key="id", data_storage_version="2.1")
    assert tbl.dataset().data_storage_version == "2.1"


@pytest.mark.parametrize(
    "key_type", [pa.float64(), pa.timestamp("us"), pa.date32(), pa.decimal128(10, 2)]
)
def test_a_key_lance_cannot_index_is_refused_before_anything_is_written(tmp_path, key_type):
    # Accepted once, such a key took writes that no MemTable flush could ever store.
    schema = pa.schema([pa.field("k", key_type, False), pa.field("v", pa.string())])
    with pytest.raises(PrimaryKeyError, match="integer, bool, string or binary"):
        mw.create_table(str(tmp_path / "new"), schema, primary_key="k")
    assert not (tmp_path / "new").exists()
    plain = str(tmp_path / "plain")
    lance.write_dataset(schema.empty_table(), plain)
    with pytest.raises(PrimaryKeyError, match="integer, bool, string or binary"):
        mw.create_table(plain, None, primary_key="k")
    assert lance.dataset(plain).mem_wal_index_details() is None


def test_routing_is_the_same_in_every_process(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 8)
    )
    tbl.upsert(rows(list(range(40))))
    tbl.close()
    here = sorted(tbl.regions())
    code = (
        "import sys, memwal_sql as mw, pyarrow as pa\n"
        "t = mw.open_table(sys.argv[1])\n"
        "t.upsert({'id': list(range(40)), 'v': ['b'] * 40}); t.close()\n"
        "print(','.join(sorted(t.regions())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert out.split(",") == here and len(here) == 8
    assert all(r["v"] == "b" for r in lance_latest_rows(str(tmp_path), ["id"]).to_pylist())


def test_writer_needs_a_region_on_a_sharded_table(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2)
    )
    with pytest.raises(InvalidInputError, match="region_values"):
        tbl.writer()
    with pytest.raises(UnknownRegionError):
        tbl.writer(region_id=str(uuid.uuid4()))


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-20] + bytes([b[-20] ^ 4]) + b[-19:],  # one bit changed in the rows
    ],
)
def test_damaged_wal_entry_stops_the_open_and_the_reads_and_deletes_nothing(tmp_path, damage):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1]))
    w.upsert(rows([2]))
    path = layout.wal_entry_path(w.region_id, 2)
    full = tbl.store.get(path)
    tbl.store.delete(path)
    tbl.store.put(path, damage(full))
    with pytest.raises(CorruptWalEntryError, match="position 2"):
        tbl.writer(region_id=w.region_id)
    with pytest.raises(CorruptWalEntryError, match="position 2"):
        mw.open_table(str(tmp_path)).to_arrow()
    assert tbl.store.get(path) == damage(full)
    assert tbl.store.exists(layout.wal_entry_path(w.region_id, 1))
    # Restoring the entry (the error's advice) lets the next writer recover both rows.
    tbl.store.put(path, full)
    tbl.writer(region_id=w.region_id).close()
    assert lance_latest_rows(str(tmp_path), ["id"]).column("id").to_pylist() == [1, 2]


def test_routed_writes_accept_pandas(tmp_path):
    pd = pytest.importorskip("pandas")
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 3)
    )
    tbl.upsert(pd.DataFrame({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    tbl.delete(pd.DataFrame({"id": [2]}))
    tbl.close()
    assert lance_latest_rows(str(tmp_path), ["id"]).column("id").to_pylist() == [1, 3]


def test_bad_rows_in_one_region_write_nothing_to_the_others(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("n", pa.int32(), False)])
    tbl = mw.create_table(
        str(tmp_path), schema, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    buckets = tbl.region_spec.region_values(pa.table({"id": list(range(20))})).column(0)
    ids = list(range(20))
    last_bucket = buckets[19].as_py()
    n = [None if b.as_py() == last_bucket else 1 for b in buckets]
    from memwal_sql.errors import SchemaMismatchError

    with pytest.raises(SchemaMismatchError):
        tbl.upsert(pa.table({"id": ids, "n": pa.array(n, pa.int32())}))
    assert all(w.stats()["rows_written"] == 0 for w in tbl._writers.values())
    tbl.close()
    assert lance_latest_rows(str(tmp_path), ["id"]).num_rows == 0


def _read_paths(tbl):
    """Every read path's ids: scan, lookup of every candidate key, and a filtered count."""
    scan = sorted(tbl.to_arrow().column("id").to_pylist())
    looked_up = sorted(tbl.lookup(pa.array(range(20), pa.int64())).column("id").to_pylist())
    counted = [i for i in range(20) if tbl.count_rows(f"id = {i}")]
    return scan, looked_up, counted


@pytest.mark.parametrize("key_type", [pa.int32(), pa.uint8(), pa.int16()])
def test_routing_uses_the_table_key_type_not_the_input_type(tmp_path, key_type):
    # An int32 key hashes differently from the table's int64 key: routing on the raw input
    # once put rows and tombstones in the wrong regions, and lookups, pruned to a key's region,
    # then disagreed with scans.
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 8)
    )
    tbl.upsert(pa.table({"id": pa.array(range(12), key_type), "v": ["a"] * 12}))
    tbl.delete(pa.array(range(0, 12, 3), key_type))
    expected = [i for i in range(12) if i % 3]
    assert _read_paths(tbl) == (expected, expected, expected)
    tbl.merge()
    assert _read_paths(tbl) == (expected, expected, expected)


def test_a_region_writer_refuses_to_delete_another_regions_keys(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    tbl.upsert(rows(list(range(8))))
    tbl.close()
    bucket = tbl.region_spec.region_values(pa.table({"id": list(range(8))})).column(0).to_pylist()
    other = next(i for i in range(8) if bucket[i] != bucket[0])
    with tbl.writer(region_values=(bucket[0],)) as w:
        with pytest.raises(WrongRegionError):
            w.delete([0, other])
        w.delete(pa.array([0], pa.int32()))  # its own key, in another integer type
    expected = list(range(1, 8))
    assert _read_paths(tbl) == (expected, expected, expected)


def test_deletes_need_the_region_columns_that_are_not_keys(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("country", pa.string())])
    tbl = mw.create_table(
        str(tmp_path),
        schema,
        primary_key="id",
        region_spec=mw.RegionSpec.identity("country"),
        allow_non_key_region_spec=True,
    )
    tbl.upsert(pa.table({"id": [1, 2, 3], "country": ["us", "de", "us"]}, schema=schema))
    with pytest.raises(InvalidInputError, match="country"):
        tbl.delete([1])
    tbl.close()
    with tbl.writer(region_values=("us",)) as w:
        with pytest.raises(InvalidInputError, match="country"):
            w.delete([1])
        with pytest.raises(WrongRegionError):
            w.delete(pa.table({"id": [2], "country": ["de"]}))
        w.delete(pa.table({"id": [1], "country": ["us"]}))
    tbl = mw.open_table(str(tmp_path))
    tbl.delete(pa.table({"id": [2], "country": ["de"]}))
    tbl.close()
    assert lance_latest_rows(str(tmp_path), ["id"]).column("id").to_pylist() == [3]


def test_table_flush_and_close_cover_the_writers_it_opened_explicitly(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2)
    )
    values = tbl.region_spec.region_values(pa.table({"id": [1]})).column(0)[0].as_py()
    w = tbl.writer(region_values=(values,))
    w.upsert(rows([1]))
    tbl.flush()
    assert w.stats()["memtable_rows"] == 0
    assert len(manifest_of(tbl, w.region_id).flushed_generations) == 1
    w.upsert(rows([1], "b"))
    tbl.close()
    assert not w.is_open
    assert lance_latest_rows(str(tmp_path), ["id"]).column("v").to_pylist() == ["b1"]


def manifest_of(tbl, rid):
    return dict(tbl.region_manifests())[rid]


def test_a_closed_table_refuses_routed_writes_and_keeps_what_it_took(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    tbl.upsert(rows([1, 2]))
    tbl.close()
    with pytest.raises(TableClosedError, match="open_table"):
        tbl.upsert(rows([3]))
    with pytest.raises(TableClosedError):
        tbl.delete([1])
    assert tbl.live_writers() == {}  # nothing was claimed again
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == [1, 2]  # reads go on
    with mw.open_table(str(tmp_path)) as again:
        again.upsert(rows([3]))
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_a_table_without_region_spec_keeps_one_region_across_reopens(tmp_path):
    uri = str(tmp_path)
    ds = lance.write_dataset(SCHEMA.empty_table(), uri)
    ds.initialize_mem_wal()  # Lance's spec-less MemWAL: regions are manual
    lance.dataset(uri).replace_field_metadata("id", {"lance-schema:unenforced-primary-key": "true"})
    for tag in ("first", "second"):
        tbl = mw.open_table(uri)
        assert tbl.region_spec is None
        tbl.upsert(rows([1], tag))
        tbl.close()
    tbl = mw.open_table(uri)
    assert tbl.regions() == [mw.DEFAULT_REGION_ID]
    assert tbl.to_arrow().to_pylist() == [{"id": 1, "v": "second1"}]
    with tbl.writer(region_id="b9a0ee34-0d6c-4a55-9ab4-5a1a1d1e7e01") as manual:
        manual.upsert(rows([2]))
    assert len(mw.open_table(uri).regions()) == 2
    with pytest.raises(InvalidInputError, match="not a UUID"):
        tbl.writer(region_id="bogus")


def test_a_routed_writer_fenced_by_another_is_dropped_and_the_next_write_reclaims(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2)
    )
    ids = list(range(8))
    tbl.upsert(rows(ids))
    buckets = tbl.region_spec.region_values(pa.table({"id": ids})).column(0).to_pylist()
    other = mw.open_table(str(tmp_path)).writer(region_values=(buckets[0],))  # fences ours
    fenced = tbl.live_writers()[other.region_id]
    with pytest.raises(WriterFencedError) as e:
        tbl.upsert(rows(ids, "b"))
    assert "stored their rows" in str(e.value)
    assert fenced.closed  # released, not left with its threads and MemTable
    other.close()
    tbl.upsert(rows(ids, "c"))  # claims the fenced region again
    tbl.close()
    assert lance_latest_rows(str(tmp_path), ["id"]).column("v").to_pylist() == [
        f"c{i}" for i in ids
    ]


def test_bad_writer_arguments_are_typed_errors(tmp_path):
    tbl = mw.create_table(
        str(tmp_path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4)
    )
    for values in ((4,), (-1,), ("x",)):
        with pytest.raises(InvalidInputError):
            tbl.writer(region_values=values)
    for options in (
        {"bogus": 1},
        {"max_memtable_rows": -5},
        {"max_wal_flush_interval_ms": "x"},
        {"max_unflushed_memtable_bytes": 0},
    ):
        with pytest.raises(InvalidInputError, match=next(iter(options))):
            tbl.writer(region_values=(0,), **options)
    with pytest.raises(InvalidInputError, match="durable"):
        mw.WriterConfig(durable_write="no")
    assert tbl.regions() == []  # nothing claimed by any refused call


def test_create_and_open_refuse_what_cannot_be_a_table(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StorageError):
        mw.open_table(str(tmp_path / "afile"))
    for uri in ("gs://bucket/t", "memory://t"):
        with pytest.raises(InvalidInputError, match="scheme"):
            mw.create_table(uri, SCHEMA, primary_key="id")
    reserved = pa.schema([pa.field("id", pa.int64(), False), pa.field("_tombstone", pa.bool_())])
    with pytest.raises(SchemaMismatchError, match="_tombstone"):
        mw.create_table(str(tmp_path / "t"), reserved, primary_key="id")


def test_table_flush_reports_a_writer_whose_flush_failed(tmp_path, monkeypatch):
    from memwal_sql.writer import region_writer

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    tbl.upsert(rows([1]))
    monkeypatch.setattr(
        region_writer,
        "write_generation",
        lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")),
    )
    with pytest.raises(StorageError, match="disk full"):
        tbl.flush()
    with pytest.raises(StorageError):
        tbl.flush()  # and keeps reporting it


@pytest.mark.parametrize("existing", [False, True])
def test_create_table_fsyncs_what_lance_wrote_and_its_own_name(tmp_path, monkeypatch, existing):
    # Lance commits without fsync: an acknowledged create_table must survive a power loss, all
    # of the table when MemWAL is enabled on one Lance wrote long ago.
    uri = str(tmp_path / "new" / "t")
    if existing:
        lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA), uri)
        old = time.time() - 3600
        for p in files_under(uri):
            os.utime(p, (old, old))
    synced = record_fsyncs(monkeypatch)
    mw.create_table(uri, None if existing else SCHEMA, primary_key="id")
    monkeypatch.undo()
    written = files_under(uri)
    assert any("_versions" in p for p in written) and any("_indices" in p for p in written)
    assert written <= synced and {os.path.dirname(p) for p in written} <= synced
    assert {str(tmp_path / "new"), str(tmp_path)} <= synced  # the names of the root and parents


def test_open_read_close_cycles_leave_threads_and_files_where_they_were(tmp_path):
    # Global pools (readers, snapshots, lookups) grow to a fixed size; nothing is per table.
    import gc
    import threading
    import time
    from collections import Counter

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    uri = str(tmp_path)
    with mw.create_table(uri, schema, primary_key="id") as t:
        t.upsert({"id": [1, 2], "v": ["a", "b"]})
        t.flush()

    def closed_cycle():
        tbl = mw.open_table(uri)
        tbl.to_arrow(), tbl.count_rows(), tbl.lookup([1])
        tbl.upsert({"id": [3], "v": ["c"]})
        tbl.close()

    def dropped_cycle():  # never closed: dropping it must release it all the same
        tbl = mw.open_table(uri)
        tbl.to_arrow()
        tbl.upsert({"id": [4], "v": ["d"]})

    def own_threads():
        return sorted(
            t.name
            for t in threading.enumerate()
            if not t.name.startswith(
                ("memwal-read", "memwal-snapshot", "memwal-lookup", "memwal-search")
            )
        )

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def new_threads(threads):
        # Threads other tests left behind may end meanwhile: only threads added count.
        return sorted((Counter(own_threads()) - Counter(threads)).elements())

    def settled(threads, files):
        deadline = time.monotonic() + 10
        while (new_threads(threads) or fds() > files) and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        return new_threads(threads), fds()

    closed_cycle(), dropped_cycle()
    before = None  # threads other tests left running stay: wait until nothing changes
    while before != (before := (own_threads(), fds())):
        gc.collect()
        time.sleep(0.3)
    threads, files = before
    for i in range(100):
        closed_cycle() if i % 2 else dropped_cycle()
    # A leak grows the counts; a file an earlier test left open may close meanwhile.
    added_threads, after_files = settled(threads, files)
    assert added_threads == [] and after_files <= files, (added_threads, after_files)


def test_a_writer_appends_then_waits_then_releases_through_its_public_methods(tmp_path):
    from memwal_sql.formats.wal import wal_positions

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    prepared = tbl._rows.upserts(rows([1, 2]))
    assert w.append_rows(prepared.slice(0, 0), "upserts") == 0  # nothing to wait for
    first = w.append_rows(prepared, "upserts")
    second = w.append_rows(tbl._rows.deletes([2]), "deletes")
    assert 0 < first < second
    w.wait_durable(second)  # both stored: the next writer of the region replays them
    assert len(wal_positions(tbl.store, w.region_id)) >= 1
    assert tbl.to_arrow().to_pylist() == [{"id": 1, "v": "a1"}]  # the MemTable, before a flush
    w.release()
    w.release()  # idempotent
    assert w.closed and not tbl.dataset().count_rows()  # released, not flushed
    reopened = mw.open_table(str(tmp_path))
    assert reopened.to_arrow().to_pylist() == [{"id": 1, "v": "a1"}]
    with reopened.writer() as again:  # replays the WAL
        assert again.stats()["replayed_entries"] >= 1


# ---- partial updates ---------------------------------------------------------------------------

UPD = pa.schema([pa.field("id", pa.int64(), False), ("a", pa.int64()), ("b", pa.string())])


def _partial_model(model: Model, part: pa.Table) -> None:
    """The model's partial update: the given columns over each key's row (or a new row)."""
    for row in part.to_pylist():
        old = model.rows.get((row["id"],), {f.name: None for f in UPD})
        model.rows[(row["id"],)] = {**old, **row}


def test_update_changes_only_the_given_columns_over_every_source(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, pa.table({"id": [1, 2, 3], "a": [1, 2, 3], "b": ["x", "y", "z"]},
                                        schema=UPD), primary_key="id",
                          region_spec=mw.RegionSpec.bucket("id", 2))  # fmt: skip
    model = Model(["id"])
    model.upsert(tbl.to_arrow())
    steps = [
        pa.table({"id": [1, 4, 1], "b": ["p", "q", "r"]}),  # repeated key: the last wins
        pa.table({"id": [2], "a": pa.array([None], pa.int64())}),  # an explicit NULL
        pa.table({"id": [3, 5], "a": [30, 50], "b": ["c", None]}),
    ]
    for i, part in enumerate(steps):
        tbl.update(part)
        _partial_model(model, part)
        if i == 0:
            tbl.flush()
        if i == 1:
            tbl.merge()
        assert tbl.to_arrow().sort_by("id") == model.table(UPD)
    tbl.delete([3])
    model.delete(pa.table({"id": [3]}))
    tbl.update({"id": [3], "b": ["back"]})  # a deleted key comes back with only what is given
    _partial_model(model, pa.table({"id": [3], "b": ["back"]}))
    assert tbl.lookup([3]).to_pylist() == [{"id": 3, "a": None, "b": "back"}]
    tbl.close()
    assert sorted_rows_of(lance_latest_rows(uri, ["id"])) == model.table(UPD)  # whole rows
    assert mw.open_table(uri).to_arrow().sort_by("id") == model.table(UPD)


def sorted_rows_of(t: pa.Table) -> pa.Table:
    return t.select(UPD.names).cast(UPD).sort_by("id")


def test_update_refuses_bad_input_and_writes_nothing(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("n", pa.int64(), False)])
    tbl = mw.create_table(str(tmp_path / "t"), pa.table({"id": [1], "n": [1]}, schema=schema),
                          primary_key="id")  # fmt: skip
    for data, error in [
        ({"n": [1]}, PrimaryKeyError),
        ({"id": [1], "zz": [1]}, SchemaMismatchError),
        ({"id": [1], "n": [None]}, SchemaMismatchError),  # n is not nullable
        ({"id": [2]}, SchemaMismatchError),  # a new key would need n
        ({"id": [1], "n": ["text"]}, SchemaMismatchError),
    ]:
        with pytest.raises(error):
            tbl.update(data)
    assert tbl.to_arrow().to_pylist() == [{"id": 1, "n": 1}]
    tbl.close()


def test_concurrent_updates_of_one_key_lose_no_column(tmp_path):
    """Threads each set their own column of the same keys: every column ends set (a read and
    its write are atomic with respect to the table's other writes)."""
    import threading

    schema = pa.schema(
        [pa.field("id", pa.int64(), False)] + [(f"c{i}", pa.int64()) for i in range(6)]
    )
    tbl = mw.create_table(str(tmp_path / "t"), schema, primary_key="id",
                          region_spec=mw.RegionSpec.bucket("id", 2))  # fmt: skip
    keys = list(range(20))

    def work(i: int) -> None:
        for round_ in range(5):
            tbl.update({"id": keys, f"c{i}": [round_] * len(keys)})
            if i == 0:
                tbl.upsert({"id": [100 + round_], **{f"c{j}": [j] for j in range(6)}})

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = tbl.lookup(keys).to_pylist()
    assert rows == [{"id": k, **{f"c{i}": 4 for i in range(6)}} for k in keys]
    tbl.close()
