import os
import subprocess
import sys
import threading
import time

import lance
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import StorageError, WriterClosedError, WrongRegionError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.formats.wal import iter_wal, read_wal_entry, wal_positions
from memwal_sql.storage import layout
from tests.lsm import Model, lance_latest_rows

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), False), pa.field("v", pa.string()), pa.field("n", pa.float64())]
)


def rows(ids, tag="a"):
    return pa.table(
        {"id": ids, "v": [f"{tag}{i}" for i in ids], "n": [float(i) for i in ids]}, schema=SCHEMA
    )


@pytest.fixture
def table(table_root):
    uri, opts = table_root
    return mw.create_table(uri, SCHEMA, primary_key="id", storage_options=opts)


def table_root_key(table_root, key):
    """lance_latest_rows arguments for the table at ``table_root``."""
    return table_root[0], key, table_root[1]


def manifest(tbl, rid):
    return RegionManifestStore(tbl.store, rid).latest()


def wait_for(condition, timeout=5.0):
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := condition()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ok


def test_close_flushes_a_generation_lance_reads(table):
    with table.writer() as w:
        w.upsert(rows([1, 2, 3]))
        w.upsert(rows([2], "b"))
        w.delete([3])
    m = manifest(table, w.region_id)
    assert [g.generation for g in m.flushed_generations] == [1]
    assert m.current_generation == 2 and m.replay_after_wal_entry_position == 3
    gen = lance.dataset(
        table.store.uri_for(f"{layout.region_dir(w.region_id)}/{m.flushed_generations[0].path}"),
        storage_options=table.storage_options or None,
    ).to_table()
    # Deduplicated inside the generation, tombstone kept, insertion order of the last writes.
    assert gen.column("id").to_pylist() == [1, 2, 3]
    assert gen.column("_tombstone").to_pylist() == [False, False, True]
    got = lance_latest_rows(table.uri, ["id"], table.storage_options or None)
    assert got.to_pylist() == [{"id": 1, "v": "a1", "n": 1.0}, {"id": 2, "v": "b2", "n": 2.0}]


def test_reopen_replays_the_unflushed_wal_tail(table):
    w = table.writer()
    w.upsert(rows([1, 2]))
    w.delete([1])
    # Abandon the writer without closing (as a crash would); its entries are durable.
    w2 = table.writer()
    assert w2.stats()["replayed_rows"] == 3 and w2.epoch == w.epoch + 1
    w2.upsert(rows([5]))
    w2.close()
    got = lance_latest_rows(table.uri, ["id"], table.storage_options or None)
    assert got.column("id").to_pylist() == [2, 5]


def test_memtable_thresholds_flush_in_the_background(table):
    model = Model(["id"])
    with table.writer(max_memtable_rows=50) as w:
        for i in range(10):
            batch = rows(list(range(i * 20, i * 20 + 30)), tag=f"t{i}")
            w.upsert(batch)
            model.upsert(batch)
    m = manifest(table, w.region_id)
    gens = [g.generation for g in m.flushed_generations]
    assert gens == list(range(1, len(gens) + 1)) and len(gens) >= 4
    assert lance_latest_rows(table.uri, ["id"], table.storage_options or None) == model.table(
        SCHEMA
    )
    # An entry never spans generations: the generation in each entry's metadata only grows.
    entry_gens = [e.generation for e in iter_wal(table.store, w.region_id, 0) if not e.is_sentinel]
    assert entry_gens == sorted(entry_gens)


def test_memtable_is_frozen_at_the_byte_threshold(table_root):
    # Far below max_memtable_rows: only max_memtable_size can freeze these MemTables. Each
    # batch is ~490 bytes in memory, so the third one of a MemTable crosses 1200.
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    with tbl.writer(max_memtable_size=1200) as w:
        for i in range(6):
            w.upsert(rows(list(range(100 + 20 * i, 120 + 20 * i))))
        s = w.stats()
    assert s["generation"] == 3 and s["memtable_rows"] == 0
    m = manifest(tbl, w.region_id)
    assert [(g.generation, g.physical_rows) for g in m.flushed_generations] == [(1, 60), (2, 60)]


def test_durable_puts_group_commit(table_root):
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    with tbl.writer() as w:
        barrier = threading.Barrier(8)

        def put(t):
            barrier.wait()
            for i in range(25):
                w.upsert(rows([t * 1000 + i]))

        threads = [threading.Thread(target=put, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = w.stats()
    assert s["rows_written"] == 200
    assert s["wal_entries_written"] < 200  # concurrent durable puts shared WAL entries
    assert lance_latest_rows(*table_root_key(table_root, ["id"])).num_rows == 200


def test_a_durable_put_does_not_wait_for_the_flush_interval(table_root):
    # The flush interval is for buffered (non-durable) writes: a durable caller leads the WAL
    # put itself, so a lone durable write costs one put, never a timer tick.
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    with tbl.writer(max_wal_flush_interval_ms=5_000) as w:
        for i in range(3):
            t0 = time.perf_counter()
            w.upsert(rows([i]))
            assert time.perf_counter() - t0 < 1.0
            assert w.stats()["wal_entries_written"] == i + 1  # stored before the call returned


def test_non_durable_puts_are_buffered_into_few_entries(table_root):
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    with tbl.writer(durable_write=False, max_wal_flush_interval_ms=10_000) as w:
        for i in range(100):
            w.upsert(rows([i]))
        assert w.stats()["wal_entries_written"] == 0  # nothing forced a put yet
    assert w.stats()["wal_entries_written"] == 1
    assert lance_latest_rows(*table_root_key(table_root, ["id"])).num_rows == 100


@pytest.mark.parametrize("limit", [{"max_wal_buffer_size": 1000}, {"max_wal_buffer_batches": 3}])
def test_a_full_non_durable_buffer_is_put_without_waiting_for_the_interval(table_root, limit):
    # Two small batches stay buffered; the third fills the buffer (by bytes, or by count), and
    # the background thread puts all three as one entry at once, not when the 60 s are up.
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    with tbl.writer(durable_write=False, max_wal_flush_interval_ms=60_000, **limit) as w:
        w.upsert(rows([1]))
        w.upsert(rows([2]))
        assert w.stats()["wal_entries_written"] == 0
        w.upsert(rows(list(range(10, 60))))  # ~1150 bytes in memory
        assert wait_for(lambda: w.stats()["wal_entries_written"] == 1)
        assert wal_positions(tbl.store, w.region_id) == [1]
        assert read_wal_entry(tbl.store, w.region_id, 1).num_rows == 52


def test_non_durable_puts_reach_the_wal_within_the_interval(table_root):
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    w = tbl.writer(durable_write=False, max_wal_flush_interval_ms=50)
    w.upsert(rows([1]))
    import time

    deadline = time.monotonic() + 5
    while w.stats()["wal_entries_written"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.stats()["wal_entries_written"] == 1
    w.close()


def test_closed_writer_refuses_writes(table):
    w = table.writer()
    w.close()
    w.close()  # idempotent
    with pytest.raises(WriterClosedError):
        w.upsert(rows([1]))


def test_rows_of_another_region_are_refused_and_nothing_is_written(table_root):
    tbl = mw.create_table(
        table_root[0],
        SCHEMA,
        primary_key="id",
        storage_options=table_root[1],
        region_spec=mw.RegionSpec.bucket("id", 4),
    )
    spec = tbl.region_spec
    buckets = spec.region_values(rows(list(range(20)))).column(0).to_pylist()
    mine = [i for i, b in enumerate(buckets) if b == 0]
    other = [i for i, b in enumerate(buckets) if b != 0]
    with tbl.writer(region_values=(0,)) as w:
        w.upsert(rows(mine))
        with pytest.raises(WrongRegionError):
            w.upsert(rows(mine[:1] + other[:1]))
        assert w.stats()["rows_written"] == len(mine)
    assert lance_latest_rows(*table_root_key(table_root, ["id"])).column(
        "id"
    ).to_pylist() == sorted(mine)
    m = manifest(tbl, w.region_id)
    assert m.region_spec_id == spec.spec_id
    assert [(e.field_id, e.value) for e in m.region_field_entries] == spec.field_entries((0,))
    # Reopened by id, the region still knows its values from its manifest.
    with tbl.writer(region_id=w.region_id) as again, pytest.raises(WrongRegionError):
        again.upsert(rows(other[:1]))


def test_backpressure_blocks_until_flushes_catch_up(table_root, monkeypatch):
    # Slowed flushes fall behind the writer. With max_unflushed_memtable_bytes=1, a write must wait until
    # no frozen MemTable is left, so each write leaves at most the one MemTable it froze itself.
    from memwal_sql.writer import flush

    real = flush.write_pk_index

    def slow(uri, keys, opts=None):
        time.sleep(0.01)
        real(uri, keys, opts)

    monkeypatch.setattr(flush, "write_pk_index", slow)
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    model = Model(["id"])
    most_frozen = 0
    with tbl.writer(durable_write=False, max_memtable_rows=10, max_unflushed_memtable_bytes=1) as w:
        for i in range(30):
            batch = rows(list(range(i * 7, i * 7 + 10)), tag=str(i))
            w.upsert(batch)
            model.upsert(batch)
            most_frozen = max(most_frozen, w.stats()["frozen_memtables"])
        s = w.stats()
    assert s["backpressure_waits"] > 0 and s["backpressure_seconds"] > 0
    assert most_frozen == 1
    assert lance_latest_rows(*table_root_key(table_root, ["id"])) == model.table(SCHEMA)


def test_failed_flush_retries_into_a_new_directory(table_root, failing_first_flush):
    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    calls = failing_first_flush
    with tbl.writer() as w:
        w.upsert(rows([1, 2]))
    m = manifest(tbl, w.region_id)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert calls[1].endswith(m.flushed_generations[0].path)
    dirs = [d for d in tbl.store.list_dirs(layout.region_dir(w.region_id)) if "_gen_" in d]
    assert len(dirs) == 2  # the orphan of the failed attempt is left for GC, unreferenced
    assert lance_latest_rows(*table_root_key(table_root, ["id"])).num_rows == 2


def test_a_writer_left_open_at_exit_stores_its_writes_and_exits_cleanly(tmp_path):
    # Non-durable writes and MemTable flushes still running when the interpreter exits: the
    # process must neither crash (a flush thread inside Lance at finalization did) nor drop
    # the buffered WAL entries; the next writer replays them.
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="id")
    script = (
        "import sys, pyarrow as pa, memwal_sql as mw\n"
        "from tests.writer.test_region_writer import rows\n"
        f"w = mw.open_table({uri!r}).writer(durable_write=False, max_memtable_rows=3000,\n"
        "                                   max_wal_flush_interval_ms=60_000)\n"
        "for i in range(40):\n"
        "    w.upsert(rows(list(range(i * 1000, i * 1000 + 1000))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert done.returncode == 0, done.stderr
    tbl = mw.open_table(uri)
    tbl.writer().close()  # replays what no generation holds yet, then flushes it
    got = lance_latest_rows(uri, ["id"])
    assert got.column("id").to_pylist() == list(range(40_000))


def test_opening_a_writer_removes_temp_files_a_crash_left(tmp_path):
    tbl = mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id")
    with tbl.writer() as w:
        w.upsert(rows([1]))
    leftovers = [
        tmp_path / "t" / d / ".x.1.tmp"
        for d in (layout.wal_dir(w.region_id), layout.manifest_dir(w.region_id))
    ]
    for p in leftovers:
        p.write_bytes(b"partial")
        os.utime(p, (0, 0))
    with tbl.writer(region_id=w.region_id) as w2:
        w2.upsert(rows([2]))
    assert not any(p.exists() for p in leftovers)
    assert lance_latest_rows(tbl.uri, ["id"]).column("id").to_pylist() == [1, 2]


def test_a_failed_flush_is_a_typed_error_and_the_next_writer_recovers(table_root, monkeypatch):
    from memwal_sql.writer import region_writer

    tbl = mw.create_table(table_root[0], SCHEMA, primary_key="id", storage_options=table_root[1])
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    monkeypatch.setattr(
        region_writer,
        "write_generation",
        lambda *a, **k: (_ for _ in ()).throw(OSError("LanceError(IO): denied")),
    )
    with pytest.raises(StorageError, match="Acknowledged writes are safe in the WAL") as e:
        w.flush()
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(StorageError):
        w.upsert(rows([3]))
    monkeypatch.undo()
    tbl.writer(region_id=w.region_id).close()
    assert lance_latest_rows(*table_root_key(table_root, ["id"])).column("id").to_pylist() == [1, 2]


def _finishes(fn, timeout=60):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not return."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} still waiting after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def test_a_flush_tells_the_readers_what_it_made_obsolete(tmp_path, monkeypatch):
    # The writer once found the reader module through sys.modules, where a query importing it
    # put it before ``forget`` existed: the flush thread died and close() waited forever.
    # Readers now register a listener once it exists.
    import memwal_sql.writer.memtable_indexes  # registers its listener
    from memwal_sql.writer import memtable

    assert memwal_sql.writer.memtable_indexes.forget in memtable._FLUSH_LISTENERS
    told: list[list] = []
    monkeypatch.setattr(memtable, "_FLUSH_LISTENERS", [told.append])
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    _finishes(w.flush)
    w.upsert(rows([3]))
    _finishes(w.close)
    assert [pa.Table.from_batches(b).column("id").to_pylist() for b in told] == [[1, 2], [3]]
    assert lance_latest_rows(str(tmp_path), ["id"]).column("id").to_pylist() == [1, 2, 3]


def test_a_failure_after_the_flush_is_the_writers_error_not_a_hang(tmp_path, monkeypatch):
    from memwal_sql.writer import region_writer

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    monkeypatch.setattr(
        region_writer, "flushed", lambda m: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    with pytest.raises(StorageError, match="Acknowledged writes are safe in the WAL"):
        _finishes(w.flush)  # the generation itself was written and committed first
    with pytest.raises(StorageError):
        w.upsert(rows([3]))
    with pytest.raises(StorageError):
        _finishes(w.close)  # reports the failure, and returns
    monkeypatch.undo()
    assert manifest(tbl, w.region_id).flushed_generations
    tbl.writer(region_id=w.region_id).close()
    assert lance_latest_rows(str(tmp_path), ["id"]).column("id").to_pylist() == [1, 2]


def test_a_slow_flush_is_reported_while_flush_waits(tmp_path, monkeypatch, caplog):
    import logging

    from memwal_sql.writer import region_writer

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1, 2]))
    real = region_writer.flushed

    def slow_flushed(memtable):
        time.sleep(0.5)
        real(memtable)

    monkeypatch.setattr(region_writer, "_SLOW_FLUSH_SECONDS", 0.1)
    monkeypatch.setattr(region_writer, "flushed", slow_flushed)
    with caplog.at_level(logging.WARNING, logger=region_writer.__name__):
        _finishes(w.flush)
    waits = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert waits and "generation 1 to flush" in waits[0] and "flush thread running" in waits[0]
    _finishes(w.close)
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == [1, 2]


def test_slices_of_a_large_batch_count_and_keep_only_their_own_rows(tmp_path):
    # to_batches(max_chunksize) and slice() share the parent's buffers: counted whole, 1,000 rows
    # of a 100,000-row table looked 100x larger and froze a MemTable every few writes.
    big = pa.table(
        {"id": range(100_000), "v": [f"value-{i:09d}" for i in range(100_000)], "n": [1] * 100_000},
        schema=SCHEMA,
    )
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    with tbl.writer(durable_write=False, max_memtable_size=8 << 20) as w:
        for batch in big.to_batches(max_chunksize=1_000):
            w.upsert(batch)
        held = w.stats()["memtable_bytes"]
    assert held < 2 * big.nbytes
    assert len(w.stats()["generations"]) == 1


def test_slices_after_a_wide_row_are_still_copied(tmp_path):
    # Whether a batch is a slice is told by its buffers, not by its size per row compared
    # with earlier batches: after one wide row, small slices of large tables looked normal.
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    with tbl.writer(durable_write=False) as w:
        w.upsert(pa.table({"id": [-1], "v": ["w" * 1_000_000], "n": [0.0]}, schema=SCHEMA))
        before = w.stats()["memtable_bytes"]
        for k in range(5):
            result = rows(list(range(k * 50_000, (k + 1) * 50_000)))
            w.upsert(result.slice(0, 10))
        assert w.stats()["memtable_bytes"] - before < 5 * 10_000


def test_a_writer_released_by_another_thread_wakes_its_waiters(tmp_path, monkeypatch):
    # A table releases a fenced or failed writer; a thread waiting in flush() or in
    # backpressure on it must then get an error, not wait forever for a flush thread that
    # stopped.
    from memwal_sql.writer import flush

    started, proceed = threading.Event(), threading.Event()
    real = flush.write_pk_index

    def stalled(uri, keys, opts=None):
        started.set()
        proceed.wait(10)
        real(uri, keys, opts)

    monkeypatch.setattr(flush, "write_pk_index", stalled)
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer(max_memtable_rows=2)
    w.upsert(rows([1, 2]))  # frozen: its flush stalls
    started.wait(10)
    w.upsert(rows([3, 4]))  # frozen too, waiting behind it
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(_raised(w.flush)))
    waiter.start()
    time.sleep(0.1)
    releaser = threading.Thread(target=w.release)
    releaser.start()
    time.sleep(0.1)
    proceed.set()  # the flush in progress commits; the next one never starts
    waiter.join(10)
    releaser.join(10)
    assert not waiter.is_alive() and outcome == [WriterClosedError]


def _raised(call):
    try:
        call()
    except Exception as e:
        return type(e)
    return None


def test_a_failed_manifest_fsync_fails_the_flush_and_is_not_retried(tmp_path, monkeypatch):
    from memwal_sql.errors import SyncFailedError
    from memwal_sql.storage import store as store_module

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1]))
    real = store_module._fsync_path

    def manifest_dir_fails(path):
        if path.endswith("/manifest"):
            raise SyncFailedError("injected")
        real(path)

    monkeypatch.setattr(store_module, "_fsync_path", manifest_dir_fails)
    with pytest.raises(SyncFailedError):
        w.flush()


def test_small_slices_of_a_batch_count_only_their_rows(table_root):
    uri, opts = table_root
    parent = pa.table(
        {"id": range(20_000), "v": [f"value-{i:09d}" for i in range(20_000)], "n": [1.0] * 20_000},
        schema=SCHEMA,
    )
    tbl = mw.create_table(uri, SCHEMA, primary_key="id", storage_options=opts)
    with tbl.writer(durable_write=False, max_memtable_size=4 << 20) as w:
        for i in range(2_000):
            w.upsert(parent.slice(i, 1))
        assert w.stats()["memtable_bytes"] < 10 * parent.slice(0, 2_000).nbytes
    assert w.stats()["memtable_flushes"] == 1


def region_with_torn_tail(tmp_path):
    """A region whose writer acknowledged ids 1-3, then died with the machine during the put of
    its last entry (torn). Returns the table, the region id and the torn position."""
    from tests.formats.test_wal import torn

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    for i in range(1, 5):
        w.upsert(rows([i]))
    rid, last = w.region_id, w.stats()["next_wal_position"] - 1
    w.release()
    torn(tbl.store, rid, last)
    return tbl, rid, last


def test_a_torn_last_wal_entry_is_left_out_by_reads_and_set_aside_by_the_next_writer(tmp_path):
    # A crash of the machine during a put can leave its entry torn (name and data are made
    # durable in one flush). That put never returned: reads leave it out, and the next writer
    # moves it aside, takes its position and goes on.
    from memwal_sql.errors import TornWalEntryWarning

    tbl, rid, last = region_with_torn_tail(tmp_path)
    reader = mw.open_table(str(tmp_path))
    with pytest.warns(TornWalEntryWarning, match=f"position {last}"):
        assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    with pytest.warns(TornWalEntryWarning, match="moved it to .*torn_wal"):
        w2 = reader.writer(region_id=rid)
    assert w2.stats()["torn_entries_set_aside"] == 1 and w2.stats()["replayed_rows"] == 3
    sentinel = read_wal_entry(tbl.store, rid, last)
    assert sentinel.is_sentinel and sentinel.writer_epoch == w2.epoch
    kept = [m.path for m in tbl.store.list(f"{layout.region_dir(rid)}/torn_wal/")]
    assert len(kept) == 1  # kept for inspection, outside the WAL
    w2.upsert(rows([4, 5], "again"))
    w2.close()
    got = mw.open_table(str(tmp_path)).to_arrow().sort_by("id")
    assert got.column("id").to_pylist() == [1, 2, 3, 4, 5]
    assert got.column("v").to_pylist() == ["a1", "a2", "a3", "again4", "again5"]


@pytest.mark.parametrize("meanwhile", ["set aside", "sentinel put", "write acknowledged"])
def test_a_reader_racing_the_recovery_of_a_torn_tail_reads_on(tmp_path, meanwhile):
    # The reader holds the torn bytes while the next writer sets them aside (and puts its
    # sentinel, and acknowledges a write): the reader looks again instead of failing.
    import warnings

    from memwal_sql.formats.wal import set_aside_torn_entry

    _tbl, rid, last = region_with_torn_tail(tmp_path)
    reader = mw.open_table(str(tmp_path))
    real_get, fired = reader.store.get, []

    def get(path):
        data = real_get(path)
        if path == layout.wal_entry_path(rid, last) and not fired:
            fired.append(path)
            other = mw.open_table(str(tmp_path))
            if meanwhile == "set aside":
                set_aside_torn_entry(other.store, rid, last)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    w2 = other.writer(region_id=rid)
                if meanwhile == "write acknowledged":
                    w2.upsert(rows([9], "w2"))
                w2.release()
        return data

    reader.store.get = get
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = sorted(reader.to_arrow().column("id").to_pylist())
    assert fired and got == [1, 2, 3] + ([9] if meanwhile == "write acknowledged" else [])


@pytest.mark.parametrize("slow_dies_after_its_move", [False, True])
def test_a_claimer_that_sets_aside_another_writers_sentinel_puts_it_back(
    tmp_path, monkeypatch, slow_dies_after_its_move
):
    # Two writers recover one torn tail at once. The slower one judged the entry torn; by the
    # time it moves it, the faster one has set it aside, put its own sentinel there and
    # acknowledged a write. The slower one checks what it moved and puts it back; if it dies
    # right after the move, readers and the next writer put it back from torn_wal/ (the
    # checksum says which position an entry was written for).
    import warnings

    from memwal_sql.errors import WriterFencedError
    from memwal_sql.storage.store import ObjectStore

    tbl, rid, last = region_with_torn_tail(tmp_path)
    slow = mw.open_table(str(tmp_path))
    real_move = ObjectStore.move

    class Died(BaseException):
        pass

    def move(self, path, to):
        if self is slow.store and path.endswith(layout.wal_entry_path(rid, last)):
            fast = mw.open_table(str(tmp_path)).writer(region_id=rid)  # claims meanwhile
            fast.upsert(rows([42], "acked"))
            fast.release()
            real_move(self, path, to)
            if slow_dies_after_its_move:
                raise Died()
            return
        real_move(self, path, to)

    monkeypatch.setattr(ObjectStore, "move", move)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Died if slow_dies_after_its_move else WriterFencedError):
            slow.writer(region_id=rid)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
            1,
            2,
            3,
            42,
        ]
    kept = read_wal_entry(tbl.store, rid, last)  # the faster writer's sentinel, back in place
    assert kept.is_sentinel and kept.writer_epoch == manifest(tbl, rid).writer_epoch
    w = mw.open_table(str(tmp_path)).writer(region_id=rid)
    w.upsert(rows([43]))
    w.close()
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
        1,
        2,
        3,
        42,
        43,
    ]


@pytest.mark.parametrize("older_acts", ["sets it aside", "claims and puts its sentinel"])
def test_the_newest_of_two_writers_recovering_a_torn_tail_opens(tmp_path, monkeypatch, older_acts):
    # The newer claimer (epoch 3) is about to move the torn entry when the older one (epoch 2)
    # has set it aside (and put its own sentinel there): the newer one takes the position or
    # replays the older sentinel; it is not fenced by a writer older than itself.
    import warnings

    from memwal_sql.formats.region_manifest import claim_region
    from memwal_sql.formats.wal import encode_fence_sentinel, set_aside_torn_entry
    from memwal_sql.storage.store import ObjectStore

    _tbl, rid, last = region_with_torn_tail(tmp_path)
    older = mw.open_table(str(tmp_path))
    older_epoch = claim_region(RegionManifestStore(older.store, rid), region_spec_id=0).writer_epoch
    newer = mw.open_table(str(tmp_path))
    real_move, fired = ObjectStore.move, []

    def move(self, path, to):
        if self is newer.store and path.endswith(layout.wal_entry_path(rid, last)) and not fired:
            fired.append(path)
            set_aside_torn_entry(older.store, rid, last)
            if older_acts == "claims and puts its sentinel":
                older.store.put_if_not_exists(
                    layout.wal_entry_path(rid, last),
                    encode_fence_sentinel(older_epoch, last),
                    checksummed=True,
                )
        return real_move(self, path, to)

    monkeypatch.setattr(ObjectStore, "move", move)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = newer.writer(region_id=rid)
    monkeypatch.undo()
    assert fired and w.epoch > older_epoch
    w.upsert(rows([7]))
    w.close()
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [1, 2, 3, 7]


def test_a_wal_position_taken_by_something_unreadable_fails_the_claim(tmp_path):
    # A stray directory (or a dangling link) at the next WAL position: the sentinel's put finds
    # the position taken but nothing there can be read. The claim gives up with a typed error
    # instead of trying forever.
    from memwal_sql.errors import CorruptWalEntryError

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1]))
    rid, nxt = w.region_id, w.stats()["next_wal_position"]
    w.close()
    os.makedirs(os.path.join(tbl.store.uri, layout.wal_entry_path(rid, nxt)))
    with pytest.raises(CorruptWalEntryError, match=f"position {nxt} is taken"):
        mw.open_table(str(tmp_path)).writer(region_id=rid)


def test_a_sentinel_left_in_torn_wal_still_fences_its_older_writer(tmp_path):
    # Writer B recovered a torn tail (sentinel at p); a third writer, racing, moved that
    # sentinel into torn_wal/ and died. The next claimer C must put it back and take p + 1,
    # so that B's next put collides with C's sentinel (B is fenced, not C).
    import time as time_module
    import warnings

    from memwal_sql.errors import WriterFencedError

    tbl, rid, last = region_with_torn_tail(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = mw.open_table(str(tmp_path)).writer(region_id=rid)
    tbl.store.move(
        layout.wal_entry_path(rid, last),
        layout.torn_wal_entry_path(rid, last, time_module.time_ns()),
    )
    c = mw.open_table(str(tmp_path)).writer(region_id=rid)
    assert read_wal_entry(tbl.store, rid, last).writer_epoch == b.epoch  # put back
    with pytest.raises(WriterFencedError):
        b.upsert(rows([100]))
    c.upsert(rows([200]))
    c.close()
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
        1,
        2,
        3,
        200,
    ]


def test_a_failing_flush_listener_leaves_the_flush_done(table, monkeypatch, caplog):
    from memwal_sql.writer import memtable

    def broken(batches):
        raise RuntimeError("listener bug")

    monkeypatch.setattr(memtable, "_FLUSH_LISTENERS", [broken, *memtable._FLUSH_LISTENERS])
    with table.writer() as w:
        w.upsert(rows([1, 2]))
        w.flush()
        w.upsert(rows([3]))  # the writer took no failure from the listener
    assert [g.generation for g in manifest(table, w.region_id).flushed_generations] == [1, 2]
    assert table.to_arrow().sort_by("id").column("id").to_pylist() == [1, 2, 3]
    assert "flush listener failed after generation 1" in caplog.text


def test_a_large_wal_entry_is_put_without_a_copy_of_its_rows(tmp_path, monkeypatch):
    # The entry goes to disk from its batches' own memory: while its put runs, the writer holds
    # no serialized copy of it (in Arrow's pool) and no joined one (in Python's heap), only
    # what the MemTable holds once the write is done.
    import tracemalloc

    import numpy as np

    from memwal_sql.storage import ObjectStore

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([0]))
    n = 300_000
    ids = np.arange(1, n + 1)
    data = pa.table({"id": ids, "v": pa.array(np.char.add("v", ids.astype(str))), "n": ids / 3})
    data = data.cast(SCHEMA)
    real, at_put = ObjectStore.put_if_not_exists, []

    def put(self, path, payload, **kw):
        if "/wal/" in path:
            size = len(payload) if isinstance(payload, bytes) else sum(len(p) for p in payload)
            at_put.append((held(), size))
        return real(self, path, payload, **kw)

    def held():
        return pa.total_allocated_bytes() + tracemalloc.get_traced_memory()[0]

    monkeypatch.setattr(ObjectStore, "put_if_not_exists", put)
    tracemalloc.start()
    try:
        w.upsert(data)
        after = held()
    finally:
        tracemalloc.stop()
    [(during, size)] = at_put
    assert size > data.nbytes  # the whole write is one entry
    assert during - after < size / 20
    monkeypatch.undo()
    w.close()
    assert mw.open_table(str(tmp_path)).count_rows() == n + 1
