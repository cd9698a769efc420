import os

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import CorruptWalEntryError, MissingWalEntryError, StorageError
from memwal_sql.formats.wal import (
    WalEntryEncoder,
    decode_wal_entry,
    encode_fence_sentinel,
    encode_wal_entry,
    iter_wal,
    wal_schema,
)
from memwal_sql.storage import ObjectStore, layout

BASE = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string(), False)])


def test_wal_schema_relaxes_non_key_columns_and_adds_tombstone():
    s = wal_schema(BASE, ["id"])
    assert s.names == ["id", "v", "_tombstone"]
    assert not s.field("id").nullable and s.field("v").nullable
    assert not s.field("_tombstone").nullable


def test_entry_is_an_ipc_stream_with_lance_metadata():
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch(
        [pa.array([1, 2]), pa.array(["a", None]), pa.array([False, True])], schema=s
    )
    data = encode_wal_entry([b, b], s, writer_epoch=4, generation=2, position=9)
    reader = pa.ipc.open_stream(pa.BufferReader(data))  # a stream, not the IPC file format
    meta = reader.schema.metadata
    assert {k: meta[k] for k in (b"writer_epoch", b"generation")} == {
        b"writer_epoch": b"4",
        b"generation": b"2",
    }
    assert list(reader) == [b, b]
    e = decode_wal_entry(data, 9)
    assert (e.writer_epoch, e.generation, e.num_rows, e.is_sentinel) == (4, 2, 4, False)


def changed_bits(data: bytes):
    """``data`` with one bit flipped, for every byte."""
    for i in range(len(data)):
        yield i, data[:i] + bytes([data[i] ^ (1 << (i % 8))]) + data[i + 1 :]


def same_entry(a, b) -> bool:
    return (a.writer_epoch, a.generation, a.is_sentinel, a.batches) == (
        b.writer_epoch,
        b.generation,
        b.is_sentinel,
        b.batches,
    )


@pytest.mark.parametrize("kind", ["rows", "dictionary rows", "sentinel"])
def test_a_changed_bit_anywhere_is_a_typed_error(kind):
    # A changed column name, type, epoch or value must not replay as a different row: every
    # single-bit change raises CorruptWalEntryError, except in the checksum key's own name
    # (the entry then reads unchecked, as Lance's do, and is otherwise unchanged).
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch(
        [
            pa.array(range(20)),
            pa.array([f"v{i}" for i in range(20)]),
            pa.array([False] * 19 + [True]),
        ],
        schema=s,
    )
    if kind == "rows":
        data = bytes(WalEntryEncoder(s, writer_epoch=2).encode([b, b.slice(5)], 1, 4))
    elif kind == "dictionary rows":
        ds = wal_schema(
            pa.schema(
                [
                    pa.field("id", pa.int64(), False),
                    pa.field("v", pa.dictionary(pa.int8(), pa.string())),
                ]
            ),
            ["id"],
        )
        data = encode_wal_entry([b.cast(ds)], ds, writer_epoch=2, generation=1, position=4)
    else:
        data = encode_fence_sentinel(9, 4)
    original = decode_wal_entry(data, 4)
    unchecked = []
    for i, bad in changed_bits(data):
        try:
            e = decode_wal_entry(bad, 4)
        except CorruptWalEntryError:
            continue
        assert same_entry(e, original), f"byte {i} changed, read as a different entry"
        unchecked.append(i)
    key = data.index(b"memwal_crc32c")
    assert set(unchecked) <= set(range(key - 4, key + len("memwal_crc32c") + 1))


def test_entries_without_a_checksum_are_read_as_lance_writes_them():
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1]), pa.array(["a"]), pa.array([False])], schema=s)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, s.with_metadata({b"writer_epoch": b"3"})) as w:
        w.write_batch(b)
    e = decode_wal_entry(sink.getvalue().to_pybytes(), 2)
    assert (e.writer_epoch, e.generation, e.batches) == (3, None, (b,))


@pytest.mark.parametrize(
    "types",
    [
        (pa.int64(), pa.string()),
        (pa.int32(), pa.list_(pa.struct([("x", pa.float32()), ("y", pa.large_string())]))),
        (pa.string(), pa.dictionary(pa.int8(), pa.string())),  # dictionaries: the stream writer
        (pa.int64(), pa.struct([("d", pa.dictionary(pa.int16(), pa.utf8()))])),
    ],
)
def test_encoder_writes_the_same_bytes_as_the_stream_writer(types):
    s = wal_schema(pa.schema([pa.field("id", types[0], False), pa.field("v", types[1])]), ["id"])
    values = {
        pa.string(): ["a", None, "c"],
        pa.list_(pa.struct([("x", pa.float32()), ("y", pa.large_string())])): [
            [{"x": 1.0, "y": "p"}],
            None,
            [],
        ],
        pa.dictionary(pa.int8(), pa.string()): ["u", "u", None],
        pa.struct([("d", pa.dictionary(pa.int16(), pa.utf8()))]): [{"d": "k"}, None, {"d": "k"}],
    }[types[1]]
    ids = ["1", "2", "3"] if types[0] == pa.string() else [1, 2, 3]
    b = pa.record_batch(
        [pa.array(ids, types[0]), pa.array(values, types[1]), pa.array([False, True, False])],
        schema=s,
    )
    enc = WalEntryEncoder(s, writer_epoch=3)
    for generation, batches in ((1, [b]), (1, [b, b.slice(1)]), (2, [b.slice(2), b])):
        got = bytes(enc.encode(batches, generation, 1))
        assert got == bytes(
            encode_wal_entry(batches, s, writer_epoch=3, generation=generation, position=1)
        )
        e = decode_wal_entry(got, 1)
        assert (e.generation, e.num_rows) == (generation, sum(x.num_rows for x in batches))


def test_sentinel_matches_lance_shape():
    data = encode_fence_sentinel(7, 3)
    reader = pa.ipc.open_stream(pa.BufferReader(data))
    assert len(reader.schema) == 0 and list(reader) == []
    e = decode_wal_entry(data, 3)
    assert e.is_sentinel and e.writer_epoch == 7


@pytest.mark.parametrize("cut", [1, 8, 50, -8])
def test_truncated_entry_is_a_typed_error(cut):
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1]), pa.array(["a"]), pa.array([False])], schema=s)
    data = encode_wal_entry([b], s, writer_epoch=1, generation=1, position=1)
    with pytest.raises(CorruptWalEntryError):
        decode_wal_entry(data[:cut], 1)


def test_entry_without_epoch_is_rejected():
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("id", pa.int64())])):
        pass
    with pytest.raises(CorruptWalEntryError, match="writer_epoch"):
        decode_wal_entry(sink.getvalue().to_pybytes(), 1)


def test_iter_wal_stops_at_the_tail(tmp_path):
    store = ObjectStore(str(tmp_path))
    for pos in (1, 2, 3):
        store.put(layout.wal_entry_path("r", pos), encode_fence_sentinel(1, pos))
    assert [e.position for e in iter_wal(store, "r", 0)] == [1, 2, 3]
    assert [e.position for e in iter_wal(store, "r", 2)] == [3]
    assert list(iter_wal(store, "r", 3)) == []


def test_a_lost_entry_before_the_tail_is_an_error_not_a_short_replay(tmp_path):
    store = ObjectStore(str(tmp_path))
    for pos in (1, 2, 3, 5):
        store.put(layout.wal_entry_path("r", pos), encode_fence_sentinel(1, pos))
    store.put(layout.wal_entry_path("r", 8), encode_fence_sentinel(1, 8))
    for list_for_gaps in (False, True):
        seen = []
        with pytest.raises(MissingWalEntryError, match="position 4 but has entries up to"):
            seen.extend(e.position for e in iter_wal(store, "r", 0, list_for_gaps=list_for_gaps))
        assert seen == [1, 2, 3]
    # A reader checks the next position only; a claiming writer lists the whole WAL.
    assert [e.position for e in iter_wal(store, "r", 4)] == [5]
    with pytest.raises(MissingWalEntryError, match="position 6 but has entries up to 8"):
        list(iter_wal(store, "r", 4, list_for_gaps=True))
    assert [e.position for e in iter_wal(store, "r", 4)] == [5]


def test_a_retried_put_that_finds_its_own_entry_succeeds(tmp_path):
    # On S3 a put can land while its reply is lost; the retry then finds the object. Only bytes
    # of another writer mean a fence.
    tbl = mw.create_table(str(tmp_path), BASE, primary_key="id")
    w = tbl.writer()
    store = w._wal.store
    real = store.put_if_not_exists
    failures = iter([True])

    def reply_lost(path, data, **kwargs):
        real(path, data, **kwargs)
        if "/wal/" in path and next(failures, False):
            raise StorageError("connection reset after the object was stored")

    store.put_if_not_exists = reply_lost
    w.upsert({"id": [1], "v": ["a"]})
    assert w.is_open
    w.upsert({"id": [2], "v": ["b"]})
    w.close()
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("one_flush", [True, False])
def test_a_failed_fsync_fails_the_write_and_is_not_retried(tmp_path, monkeypatch, one_flush):
    # After an fsync error the kernel may have dropped the data and a second fsync can still
    # succeed, so a retry that finds the entry's bytes must not acknowledge it (fsyncgate).
    import errno

    from memwal_sql.errors import SyncFailedError
    from memwal_sql.storage import store as store_module

    monkeypatch.setattr(store_module, "_file_sync_writes_new_name", lambda d: one_flush)
    tbl = mw.create_table(str(tmp_path), BASE, primary_key="id")
    w = tbl.writer()
    real, puts = store_module.ObjectStore._publish, []

    def wal_entry_fails(fd):
        if "/wal/" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, "Input/output error")
        return os.fsync(fd)

    monkeypatch.setattr(
        store_module.ObjectStore,
        "_publish",
        staticmethod(lambda *a: (puts.append(a[3]), real(*a))[1]),
    )
    monkeypatch.setattr(store_module.os, "fsync", wal_entry_fails)
    with pytest.raises(SyncFailedError, match=r"fsync of .*wal.* failed"):
        w.upsert({"id": [1], "v": ["a"]})
    assert len(puts) == 1  # never a retry
    monkeypatch.undo()
    with pytest.raises(SyncFailedError):
        w.upsert({"id": [2], "v": ["b"]})  # the writer stays failed


def test_the_checksum_binds_the_entry_to_its_position():
    # After a power loss a file system without a journal can show a file's name over blocks of
    # an older file: a whole, valid entry of another position must not replay there.
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1]), pa.array(["a"]), pa.array([False])], schema=s)
    for data in (
        bytes(WalEntryEncoder(s, writer_epoch=1).encode([b], 1, 5)),
        encode_fence_sentinel(1, 5),
    ):
        assert decode_wal_entry(data, 5).writer_epoch == 1
        for other in (4, 6, 5 + (1 << 32)):
            with pytest.raises(CorruptWalEntryError, match="another position"):
                decode_wal_entry(data, other)


def test_entries_checksummed_without_their_position_still_read():
    # memwal-sql before the position was in the checksum: CRC32C of the entry alone.
    import google_crc32c

    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1]), pa.array(["a"]), pa.array([False])], schema=s)
    from memwal_sql.formats.wal import _entry_metadata, _header_template

    data = encode_wal_entry([b], s, writer_epoch=1, generation=1, position=3)
    header, at = _header_template(s, _entry_metadata(1, 1))  # where the digits are
    zeroed = header + data[len(header) :]
    old = data[:at] + b"%08x" % google_crc32c.value(zeroed) + data[at + 8 :]
    assert old != data
    assert decode_wal_entry(old, 9).batches == (b,)
    with pytest.raises(CorruptWalEntryError):
        decode_wal_entry(old[:-9] + bytes([old[-9] ^ 1]) + old[-8:], 9)


def torn(store: ObjectStore, region: str, position: int, *, before_boot: bool = True) -> None:
    """Replace the entry at ``position`` with the first half of it, as a crash of the machine
    during its put can leave it; dated before the machine started unless told otherwise."""
    from memwal_sql.storage.store import _boot_time

    path = layout.wal_entry_path(region, position)
    data = store.get(path)
    store.delete(path)
    store.put(path, data[: len(data) // 2])
    if before_boot:
        when = _boot_time() - 60
        os.utime(os.path.join(store.uri, path), (when, when))


def test_iter_wal_ends_before_a_torn_last_entry(tmp_path):
    from memwal_sql.errors import TornWalEntryWarning

    store = ObjectStore(str(tmp_path))
    for pos in (1, 2, 3):
        store.put(layout.wal_entry_path("r", pos), encode_fence_sentinel(1, pos))
    torn(store, "r", 3)
    for list_for_gaps in (False, True):
        with pytest.warns(TornWalEntryWarning, match="position 3\\) is torn"):
            assert [e.position for e in iter_wal(store, "r", 0, list_for_gaps=list_for_gaps)] == [
                1,
                2,
            ]


def test_a_damaged_entry_that_is_not_a_torn_tail_is_an_error(tmp_path):
    store = ObjectStore(str(tmp_path))
    for pos in (1, 2, 3, 6):
        store.put(layout.wal_entry_path("r", pos), encode_fence_sentinel(1, pos))
    torn(store, "r", 2)  # has a successor: it was acknowledged before position 3 was written
    with pytest.raises(CorruptWalEntryError):
        list(iter_wal(store, "r", 0))
    torn(store, "r", 3, before_boot=False)  # written since the machine started: no crash
    with pytest.raises(CorruptWalEntryError):
        list(iter_wal(store, "r", 2))
    torn(store, "r", 3)  # the last before a gap: a claiming writer sees the entry after it
    with pytest.raises(CorruptWalEntryError):
        list(iter_wal(store, "r", 2, list_for_gaps=True))


def test_a_put_whose_directory_cannot_be_synced_is_not_acknowledged(tmp_path, monkeypatch):
    # Where a put fsyncs the directory after the rename (file systems that do not write a new
    # name with the file's fsync), failing to open the directory (too many open files) must
    # fail the write: a retry would find the name and acknowledge a put whose name may be lost.
    import errno

    from memwal_sql.errors import SyncFailedError
    from memwal_sql.storage import store as store_module

    monkeypatch.setattr(store_module, "_file_sync_writes_new_name", lambda d: False)
    tbl = mw.create_table(str(tmp_path), BASE, primary_key="id")
    w = tbl.writer()
    real_open, armed = os.open, [True]

    def open_fails_once_for_the_wal_directory(path, flags, *args, **kwargs):
        if armed[0] and str(path).endswith("/wal") and flags == os.O_RDONLY:
            armed[0] = False
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store_module.os, "open", open_fails_once_for_the_wal_directory)
    with pytest.raises(SyncFailedError, match="Too many open files"):
        w.upsert({"id": [1], "v": ["a"]})
    assert not armed[0]


@pytest.mark.parametrize("durable", [True, False])
def test_a_failure_after_the_put_fails_the_writer(tmp_path, durable):
    # Whatever fails once the entry is stored (here the bookkeeping that follows the put) must
    # reach the waiting put and every later call as the WAL's error; a waiter left without it
    # would wait forever, and a background thread that died of it would write nothing again.
    import threading

    tbl = mw.create_table(str(tmp_path), BASE, primary_key="id")
    w = tbl.writer(durable_write=durable)

    def bookkeeping_fails(generation, position):
        raise RuntimeError("bookkeeping failed")

    w._wal._on_entry_written = bookkeeping_fails
    outcome: list[BaseException | None] = []

    def write_and_flush():
        try:
            w.upsert({"id": [1], "v": ["a"]})
            w._wal.flush()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=write_and_flush, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the put is still waiting"
    assert isinstance(outcome[0], RuntimeError)
    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        w.upsert({"id": [2], "v": ["b"]})
    assert [e.num_rows for e in iter_wal(w._wal.store, w._wal.region_id, 0)] == [1]  # stored once


def _run_fixture():
    """WAL entries of every kind a claim replays, by position (None: missing)."""
    import google_crc32c

    from memwal_sql.formats.wal import _entry_metadata, _header_template

    s = wal_schema(BASE, ["id"])

    def batch(*ids):
        return pa.record_batch(
            [pa.array(ids), pa.array([f"v{i}" for i in ids]), pa.array([False] * len(ids))],
            schema=s,
        )

    one, two = WalEntryEncoder(s, writer_epoch=1), WalEntryEncoder(s, writer_epoch=2)
    lance = pa.BufferOutputStream()
    with pa.ipc.new_stream(lance, s.with_metadata({"writer_epoch": "2"})) as w:
        w.write_batch(batch(70))
    old = encode_wal_entry([batch(100)], s, writer_epoch=2, generation=3, position=10)
    header, at = _header_template(s, _entry_metadata(2, 3))
    old = old[:at] + b"%08x" % google_crc32c.value(header + old[len(header) :]) + old[at + 8 :]
    damaged = bytearray(two.encode([batch(90)], 3, 9))
    damaged[-12] ^= 1
    return {
        1: bytes(one.encode([batch(1)], 1, 1)),
        2: bytes(one.encode([batch(2)], 1, 2)),
        3: bytes(one.encode([batch(3), batch(4, 5)], 1, 3)),  # a group of two puts
        4: bytes(one.encode([batch(6)], 2, 4)),  # the next generation: a new run
        5: encode_fence_sentinel(2, 5),
        6: encode_fence_sentinel(2, 6),
        7: lance.getvalue().to_pybytes(),  # Lance's: no checksum
        8: None,
        9: bytes(damaged),
        10: old,  # checksummed before the position was included
        11: bytes(two.encode([batch(110)], 3, 12)),  # written for another position
        12: bytes(one.encode([batch(120)], 1, 12)),
    }


def test_runs_decode_what_each_entry_decodes_to():
    from memwal_sql.formats.wal import decode_wal_runs

    datas = _run_fixture()
    runs = decode_wal_runs(list(datas.values()), 1)
    by_position, position = {}, 1
    for run in runs:
        if run is None:
            by_position[position] = None
            position += 1
            continue
        for p in range(run.first, run.last + 1):
            by_position[p] = run
        position = run.last + 1
    assert position == 13
    assert [p for p, r in by_position.items() if r is None] == [7, 8, 9, 11]
    assert [(r.first, r.count) for r in runs if r] == [(1, 3), (4, 1), (5, 2), (10, 1), (12, 1)]
    for run in filter(None, runs):
        entries = [decode_wal_entry(datas[p], p) for p in range(run.first, run.last + 1)]
        assert {(e.writer_epoch, e.generation, e.is_sentinel) for e in entries} == {
            (run.writer_epoch, run.generation, run.is_sentinel)
        }
        rows = [r for b in run.batches for r in b.to_pylist()]
        assert rows == [r for e in entries for b in e.batches for r in b.to_pylist()]
        assert run.checksummed
    with pytest.raises(CorruptWalEntryError):
        decode_wal_entry(datas[9], 9)
    with pytest.raises(CorruptWalEntryError):
        decode_wal_entry(datas[11], 11)


def test_a_changed_bit_in_a_run_leaves_its_entry_to_be_looked_at_alone():
    # Entries decoded in runs are checked as decode_wal_entry checks them: a changed bit never
    # replays as different rows; the entry is left to decode_wal_entry, which says what is wrong.
    from memwal_sql.formats.wal import decode_wal_runs

    datas = _run_fixture()
    for i, changed in changed_bits(datas[2]):
        runs = decode_wal_runs([datas[1], changed, datas[3]], 1)
        assert runs[1] is None, i
        assert [(r.first, r.count) for r in runs if r] == [(1, 1), (3, 1)], i


@pytest.mark.parametrize("dictionary", [False, True])
def test_a_large_entry_is_parts_viewing_its_batches_with_the_same_bytes(dictionary):
    # Over COPY_BELOW a batch is not serialized into a buffer of its own: the entry's parts
    # view its columns' memory, and they join to exactly the stream writer's bytes.
    import numpy as np

    vt = pa.dictionary(pa.int8(), pa.string()) if dictionary else pa.string()
    s = wal_schema(pa.schema([pa.field("id", pa.int64(), False), pa.field("v", vt)]), ["id"])
    n = 200_000
    b = pa.record_batch(
        [
            pa.array(np.arange(n)),
            pa.array(["a", None, "ccc", "d"] * (n // 4)).cast(vt),
            pa.array(np.zeros(n, bool)),
        ],
        schema=s,
    )
    assert b.nbytes > WalEntryEncoder.COPY_BELOW
    enc = WalEntryEncoder(s, writer_epoch=4)
    batches = [b.slice(3, n - 10), b, b.slice(0, 5)]
    data = b"".join(enc.parts(batches, 2, 9))
    assert data == encode_wal_entry(batches, s, writer_epoch=4, generation=2, position=9)
    before = pa.total_allocated_bytes()
    parts = enc.parts([b], 2, 10)
    copied = pa.total_allocated_bytes() - before
    copied += sum(len(p) for p in parts if isinstance(p, bytes))
    assert copied < b.nbytes / 100  # message headers and padding only
    assert decode_wal_entry(data, 9).num_rows == 2 * n - 5


def test_a_put_of_parts_survives_short_writes(tmp_path, monkeypatch):
    import memwal_sql.storage.store as store_module

    real = os.writev
    monkeypatch.setattr(store_module.os, "writev", lambda fd, bufs: real(fd, [bytes(bufs[0])[:3]]))
    store = store_module.ObjectStore(str(tmp_path))
    parts = [b"abcdefg", memoryview(b""), memoryview(b"hi"), b"jklmnopqrstu"]
    store.put_if_not_exists("w/a", parts, checksummed=True)
    assert store.get("w/a") == b"abcdefghijklmnopqrstu"
