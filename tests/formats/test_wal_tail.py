"""WalTail: a reader's replay of a WAL tail, kept between reads: what it reads (counted at the
store) and what it hands out, through flushes, claims, given-up writes and damage."""

import pyarrow as pa
import pytest

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CorruptWalEntryError, MissingWalEntryError
from memwal_sql.formats.wal import TOMBSTONE, encode_fence_sentinel, encode_wal_entry
from memwal_sql.formats.wal_tail import WalTail
from memwal_sql.storage import ObjectStore, layout

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field(TOMBSTONE, pa.bool_(), False)])
R = "r"


class CountingStore(ObjectStore):
    """A local store that records the WAL positions whose entries it returned."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.read: list[int] = []

    def get(self, path, *args, **kwargs):
        data = super().get(path, *args, **kwargs)
        if "/wal/" in path:
            self.read.append(layout.parse_bitrev64(path))
        return data

    def take(self) -> list[int]:
        out, self.read = sorted(self.read), []
        return out


@pytest.fixture
def store(tmp_path):
    return CountingStore(str(tmp_path))


def put(store, position, ids, epoch=1):
    b = pa.record_batch({"id": ids, TOMBSTONE: [False] * len(ids)}, schema=SCHEMA)
    data = encode_wal_entry([b], SCHEMA, writer_epoch=epoch, generation=1, position=position)
    store.put_if_not_exists(layout.wal_entry_path(R, position), data)


def fence(store, position, epoch):
    store.put_if_not_exists(
        layout.wal_entry_path(R, position), encode_fence_sentinel(epoch, position)
    )


def manifest(replay=0, epoch=1, generation=1):
    return RegionManifest(
        replay_after_wal_entry_position=replay, writer_epoch=epoch, current_generation=generation
    )


def ids(batches):
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_a_second_read_reads_only_the_entries_put_since_and_extends_the_same_batches(store):
    for p in (1, 2, 3):
        put(store, p, [p])
    tail = WalTail(SCHEMA)
    first, _ = tail.read(store, R, manifest())
    assert ids(first) == [1, 2, 3] and store.take() == [1, 2, 3]
    again, retired = tail.read(store, R, manifest())
    assert again is first and retired is None and store.take() == []
    put(store, 4, [4])
    put(store, 5, [5, 6])
    longer, retired = tail.read(store, R, manifest())
    assert ids(longer) == [1, 2, 3, 4, 5, 6] and store.take() == [4, 5]
    assert all(a is b for a, b in zip(first, longer)) and retired is None
    assert tail.entries_read == 5


def test_a_flush_drops_the_entries_it_took_and_nothing_is_read_again(store):
    for p in (1, 2, 3, 4):
        put(store, p, [p])
    tail = WalTail(SCHEMA)
    before, _ = tail.read(store, R, manifest())
    size = tail.nbytes
    store.take()
    after, retired = tail.read(store, R, manifest(replay=2, generation=2))
    assert ids(after) == [3, 4] and store.take() == []
    assert retired is before[0] and tail.nbytes < size
    # A flush past everything read, and GC of what it took: reading resumes after it.
    put(store, 5, [5])
    put(store, 6, [6])
    put(store, 7, [7])
    for p in range(1, 7):
        store.delete(layout.wal_entry_path(R, p))
    rest, _ = tail.read(store, R, manifest(replay=6, generation=3))
    assert ids(rest) == [7] and store.take() == [7]


def test_a_new_generation_hands_out_new_batch_objects(store):
    put(store, 1, [1])
    tail = WalTail(SCHEMA)
    first, _ = tail.read(store, R, manifest())
    second, retired = tail.read(store, R, manifest(generation=2))
    assert ids(second) == [1] and second[0] is not first[0] and retired is first[0]
    assert store.take() == [1]


def test_a_claim_leaves_what_was_read_in_place_so_reading_goes_on_after_it(store):
    for p in (1, 2, 3):
        put(store, p, [p])
    tail = WalTail(SCHEMA)
    tail.read(store, R, manifest())
    store.take()
    fence(store, 4, epoch=2)
    put(store, 5, [50], epoch=2)
    batches, _ = tail.read(store, R, manifest(epoch=2))
    assert ids(batches) == [1, 2, 3, 50]
    assert store.take() == [3, 4, 5]  # the last entry read checked once, then only new ones


def test_a_claim_after_writes_were_given_up_reads_the_tail_again(store):
    for p in (1, 2, 3):
        put(store, p, [p])
    tail = WalTail(SCHEMA)
    tail.read(store, R, manifest())
    # An operator gave up the writes from position 2 on; the next writer claims and writes.
    for p in (2, 3):
        store.delete(layout.wal_entry_path(R, p))
    fence(store, 2, epoch=2)
    put(store, 3, [30], epoch=2)
    batches, _ = tail.read(store, R, manifest(epoch=2))
    assert ids(batches) == [1, 30]


def test_damage_and_holes_after_what_was_read_raise_typed_errors_every_time(store):
    put(store, 1, [1])
    put(store, 2, [2])
    tail = WalTail(SCHEMA)
    tail.read(store, R, manifest())
    store.put(layout.wal_entry_path(R, 3), b"not an entry, written since the machine started")
    put(store, 4, [4])
    for _ in range(2):
        with pytest.raises(CorruptWalEntryError):
            tail.read(store, R, manifest())
    store.delete(layout.wal_entry_path(R, 3))
    for _ in range(2):
        with pytest.raises(MissingWalEntryError, match="position 3"):
            tail.read(store, R, manifest())
    put(store, 3, [3])  # restored from a backup
    store.take()
    batches, _ = tail.read(store, R, manifest())
    assert ids(batches) == [1, 2, 3, 4] and store.take() == [3, 4]


def test_an_older_replay_position_reads_the_tail_again(store):
    for p in (1, 2, 3):
        put(store, p, [p])
    tail = WalTail(SCHEMA)
    tail.read(store, R, manifest(replay=2))
    store.take()
    batches, _ = tail.read(store, R, manifest(replay=1))
    assert ids(batches) == [2, 3] and store.take() == [2, 3]
