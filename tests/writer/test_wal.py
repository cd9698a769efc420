import pyarrow as pa
import pytest

from memwal_sql.errors import CorruptWalEntryError
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.writer.wal import (
    decode_wal_entry,
    encode_fence_sentinel,
    encode_wal_entry,
    iter_wal,
    wal_schema,
)

BASE = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string(), False)])


def test_wal_schema_relaxes_non_key_columns_and_adds_tombstone():
    s = wal_schema(BASE, ["id"])
    assert s.names == ["id", "v", "_tombstone"]
    assert not s.field("id").nullable and s.field("v").nullable
    assert not s.field("_tombstone").nullable


def test_entry_is_an_ipc_stream_with_lance_metadata():
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1, 2]), pa.array(["a", None]), pa.array([False, True])], schema=s)
    data = encode_wal_entry([b, b], s, writer_epoch=4, generation=2)
    reader = pa.ipc.open_stream(pa.BufferReader(data))  # a stream, not the IPC file format
    assert reader.schema.metadata == {b"writer_epoch": b"4", b"generation": b"2"}
    e = decode_wal_entry(data, 9)
    assert (e.writer_epoch, e.generation, e.num_rows, e.is_sentinel) == (4, 2, 4, False)


def test_sentinel_matches_lance_shape():
    data = encode_fence_sentinel(7)
    reader = pa.ipc.open_stream(pa.BufferReader(data))
    assert len(reader.schema) == 0 and list(reader) == []
    e = decode_wal_entry(data, 3)
    assert e.is_sentinel and e.writer_epoch == 7


@pytest.mark.parametrize("cut", [1, 8, 50, -8])
def test_truncated_entry_is_a_typed_error(cut):
    s = wal_schema(BASE, ["id"])
    b = pa.record_batch([pa.array([1]), pa.array(["a"]), pa.array([False])], schema=s)
    data = encode_wal_entry([b], s, writer_epoch=1, generation=1)
    with pytest.raises(CorruptWalEntryError):
        decode_wal_entry(data[:cut], 1)


def test_entry_without_epoch_is_rejected():
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("id", pa.int64())])):
        pass
    with pytest.raises(CorruptWalEntryError, match="writer_epoch"):
        decode_wal_entry(sink.getvalue().to_pybytes(), 1)


def test_iter_wal_stops_at_first_gap(tmp_path):
    store = ObjectStore(str(tmp_path))
    for pos in (1, 2, 3, 5):
        store.put(layout.wal_entry_path("r", pos), encode_fence_sentinel(pos))
    assert [e.position for e in iter_wal(store, "r", 0)] == [1, 2, 3]
    assert [e.position for e in iter_wal(store, "r", 4)] == [5]
