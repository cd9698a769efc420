"""A reader's replay of one region's WAL tail, kept from one read to the next.

A process that reads a region without writing it sees the region's unflushed rows by replaying
the WAL entries after the region manifest's ``replay_after_wal_entry_position``. Replaying the
whole tail on every read costs what the tail holds; :class:`WalTail` keeps what it replayed and
reads only the entries put since, so a read costs what changed.

What it keeps stays right because a WAL position, once it holds a whole entry, never holds
another:

- **Writes** go to the next free position with a put that fails if the position is taken.
- **A flush** moves the replay position forward and GC then deletes the entries at or before
  it: the kept rows of those entries are dropped, nothing is read again.
- **A claim** (a new writer epoch) fences the previous writer with a sentinel at the first free
  position and replays the entries below it *in place*: it neither moves nor rewrites them, and
  its own entries follow its sentinel. What was read stays valid, and reading goes on after it.
  The one way a read position gets new contents is an operator giving up lost writes (deleting
  the entries from a hole on, as :class:`~memwal_sql.errors.MissingWalEntryError` suggests)
  before the next claim writes there again. A new epoch is therefore when the entry last read
  is checked (one read): if it is gone or was put by another epoch, the tail is read afresh.
- **Damage** is never kept: a torn last entry ends the replay before it (a claim later puts a
  sentinel there, which the next read finds), and any other damaged entry raises
  :class:`~memwal_sql.errors.CorruptWalEntryError`, as a fresh replay would.

Example:
    >>> import tempfile
    >>> from memwal_sql._proto.memwal_pb2 import RegionManifest
    >>> from memwal_sql.formats.wal import TOMBSTONE, encode_wal_entry
    >>> from memwal_sql.storage import ObjectStore, layout
    >>> store, b = ObjectStore(tempfile.mkdtemp()), pa.record_batch({"id": [1], TOMBSTONE: [False]})
    >>> put = lambda p: store.put_if_not_exists(layout.wal_entry_path("r", p), encode_wal_entry(
    ...     [b], b.schema, writer_epoch=1, generation=1, position=p))
    >>> put(1); put(2)
    >>> tail, manifest = WalTail(b.schema), RegionManifest(writer_epoch=1, current_generation=1)
    >>> len(tail.read(store, "r", manifest)[0]), tail.entries_read
    (2, 2)
    >>> put(3)
    >>> len(tail.read(store, "r", manifest)[0]), tail.entries_read
    (3, 3)
"""

from __future__ import annotations

import bisect
import threading

import pyarrow as pa

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CorruptWalEntryError
from memwal_sql.formats.wal import conform_batch, iter_wal, read_wal_entry
from memwal_sql.storage import ObjectStore

# What a kept batch costs beyond its buffers (its Python and Arrow objects, its position).
_BATCH_OVERHEAD = 512


class WalTail:
    """The rows of one region's WAL entries after a replay position, as far as read, in the
    table's WAL schema; :meth:`read` brings them up to date with a region manifest.

    The batches are kept as the same objects from one read to the next, extended at the end,
    so structures derived from them (a MemTable leaf's key index, cached by its first batch)
    are extended rather than rebuilt. They are new objects whenever the generation they are
    read as changes, so nothing derived for one generation is taken for another.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.entries_read = 0
        """How many WAL entries this tail has read in all (sentinels included)."""
        self._lock = threading.Lock()  # two queries of one process read a tail once
        self._reset(0, 0)

    def _reset(self, start: int, epoch: int) -> None:
        self.start = start  # the replay position the kept entries follow
        self.last = start  # the last position read
        self._epoch = epoch  # the manifest's writer epoch as of the last read
        self._last_epoch: int | None = None  # the writer epoch of the entry at `last`
        self._batches: list[pa.RecordBatch] = []
        self._positions: list[int] = []  # the position of each batch's entry
        self._generation: int | None = None
        self._handed: tuple[pa.RecordBatch, ...] = ()
        self.nbytes = 0

    def read(
        self, store: ObjectStore, region_id: str, manifest: RegionManifest
    ) -> tuple[tuple[pa.RecordBatch, ...], pa.RecordBatch | None]:
        """The tail after ``manifest``'s replay position, reading only the entries not read
        before; and the first batch of the tail handed out before if it is no longer the first
        (what was derived from the old tail can go), else None.

        Raises what :func:`~memwal_sql.formats.wal.iter_wal` raises (a hole before later
        entries, a damaged entry); the entries read before it are kept.
        """
        with self._lock:
            start = manifest.replay_after_wal_entry_position
            if start > self.start:
                self._drop_through(start)
            if start < self.start or not self._still_written(store, region_id, manifest):
                self._reset(start, manifest.writer_epoch)
            last_seen = manifest.wal_entry_position_last_seen
            for entry in iter_wal(store, region_id, self.last, last_seen=last_seen):
                self.entries_read += 1
                self.last, self._last_epoch = entry.position, entry.writer_epoch
                if entry.is_sentinel:
                    continue
                for b in entry.batches:
                    batch = conform_batch(b, self.schema)
                    self._batches.append(batch)
                    self._positions.append(entry.position)
                    self.nbytes += _size(batch)
            if manifest.current_generation != self._generation:
                if self._generation is not None:
                    self._batches = [b.slice(0) for b in self._batches]
                self._generation = manifest.current_generation
            before = self._handed
            if len(before) != len(self._batches) or (before and before[0] is not self._batches[0]):
                self._handed = tuple(self._batches)
            first = self._handed[0] if self._handed else None
            return self._handed, before[0] if before and before[0] is not first else None

    def _still_written(self, store: ObjectStore, region_id: str, manifest: RegionManifest) -> bool:
        """Whether what was read is still in the WAL: checked when the writer epoch changed
        (see the module's docstring), by the epoch of the entry read last."""
        if manifest.writer_epoch == self._epoch:
            return True
        if self.last > self.start and self._last_epoch is not None:
            try:
                entry = read_wal_entry(store, region_id, self.last)
            except CorruptWalEntryError:
                return False  # a fresh read reports it
            if entry is None or entry.writer_epoch != self._last_epoch:
                return False
        self._epoch = manifest.writer_epoch  # only once checked: a failed check is retried
        return True

    def _drop_through(self, start: int) -> None:
        """Forget the entries at or before ``start`` (a flush committed them to a generation)."""
        n = bisect.bisect_right(self._positions, start)
        self.nbytes -= sum(_size(b) for b in self._batches[:n])
        del self._batches[:n], self._positions[:n]
        self.start = start
        if self.last < start:
            self.last, self._last_epoch = start, None


def _size(batch: pa.RecordBatch) -> int:
    return batch.get_total_buffer_size() + _BATCH_OVERHEAD


__all__ = ["WalTail"]
