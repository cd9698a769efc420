"""The WAL writer: appends WAL entries at consecutive positions with group commit.

The entry format, and everything that reads a WAL, is in :mod:`memwal_sql.formats.wal`; this
module is the write side only, used by the region writer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from memwal_sql.errors import (
    CorruptWalEntryError,
    MemWalError,
    ObjectExistsError,
    StorageError,
    StorageUnavailableError,
    SyncFailedError,
    WriterFencedError,
)
from memwal_sql.formats.wal import WalEntryEncoder, read_wal_entry
from memwal_sql.storage import ObjectStore, layout

_PUT_ATTEMPTS = 4


class WalWriter:
    """Appends WAL entries at consecutive positions with group commit.

    Every appended batch gets a sequence number. A caller that needs durability calls
    :meth:`wait` with its sequence number: if no flush is running it becomes the leader and writes
    one entry holding *every* pending batch (of one generation) itself; otherwise it waits for the
    running flush and checks again. Concurrent durable puts therefore share one put, and a lone
    durable put pays for exactly one put, never a timer tick. Non-durable appends are written by a
    background thread when the buffer reaches ``max_buffer_bytes`` or ``max_buffer_batches`` or
    the oldest pending batch is ``max_flush_interval`` seconds old.

    A put that finds its position taken means another writer claimed the region (it put a fence
    sentinel there): the writer is fenced and every later call raises.
    """

    def __init__(
        self,
        store: ObjectStore,
        region_id: str,
        schema: pa.Schema,
        *,
        writer_epoch: int,
        next_position: int,
        on_entry_written: Callable[[int, int], None],
        max_buffer_bytes: int = 8 << 20,
        max_buffer_batches: int = 256,
        max_flush_interval: float = 0.1,
        background: bool = True,
    ) -> None:
        self.store = store
        self.region_id = region_id
        self.schema = schema
        self.writer_epoch = writer_epoch
        self.next_position = next_position
        self._on_entry_written = on_entry_written
        self._encoder = WalEntryEncoder(schema, writer_epoch=writer_epoch)
        store.keep_spare_files(layout.wal_dir(region_id))
        self.max_buffer_bytes = max_buffer_bytes
        self.max_buffer_batches = max_buffer_batches
        self.max_flush_interval = max_flush_interval
        # Entered as ``with self._mutex``: a Condition's own ``with`` is a Python-level call,
        # and this lock is taken several times per durable put.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._pending: list[tuple[int, int, pa.RecordBatch, int]] = []  # seq, gen, batch, bytes
        self._pending_bytes = 0
        self._oldest_pending = 0.0
        self._seq = 0
        self.flushed_seq = 0
        self._writing = False
        self._closing = False
        self.error: BaseException | None = None
        self.entries_written = 0
        self.bytes_written = 0
        self.put_seconds = 0.0
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._background, name=f"memwal-wal-{region_id[:8]}", daemon=True
            )
            self._thread.start()

    def append(self, batch: pa.RecordBatch, generation: int, nbytes: int) -> int:
        """Queue ``batch`` (``nbytes`` in memory) for the WAL; return its sequence number."""
        with self._mutex:
            self._raise_if_failed()
            self._seq += 1
            first = not self._pending
            if first:
                self._oldest_pending = time.monotonic()
            self._pending.append((self._seq, generation, batch, nbytes))
            self._pending_bytes += nbytes
            if self._thread is not None and (
                first  # the background thread starts the flush-interval clock
                or self._pending_bytes >= self.max_buffer_bytes
                or len(self._pending) >= self.max_buffer_batches
            ):
                self._cond.notify_all()
            return self._seq

    def wait(self, seq: int) -> None:
        """Block until batch ``seq`` is in a stored WAL entry; raise if the WAL failed first."""
        while True:
            with self._mutex:
                while True:
                    if self.flushed_seq >= seq:
                        return
                    self._raise_if_failed()
                    if not self._writing:
                        group = self._take_group()
                        break
                    self._cond.wait()
            self._write_group(group)

    def flush(self) -> None:
        """Write everything appended so far and wait for it."""
        with self._mutex:
            seq = self._seq
        self.wait(seq)

    def close(self) -> None:
        """Flush what is pending (unless the WAL failed) and stop the background thread."""
        try:
            if self.error is None:
                self.flush()
        finally:
            with self._mutex:
                self._closing = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join()
            self.store.release_spare_files(layout.wal_dir(self.region_id))

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _take_group(self) -> list[tuple[int, int, pa.RecordBatch, int]]:
        # Caller holds the lock. An entry never spans MemTable generations (Lance 14 relies on
        # it to map WAL positions to generations), so stop at the first generation change.
        gen = self._pending[0][1]
        if self._pending[-1][1] == gen:  # the common case: one generation pending
            group, self._pending, self._pending_bytes = self._pending, [], 0
        else:
            n = 0
            while self._pending[n][1] == gen:
                n += 1
            group, self._pending = self._pending[:n], self._pending[n:]
            self._pending_bytes -= sum(g[3] for g in group)
        # What stays pending (the next generation's batches) keeps the clock of the oldest
        # batch taken, which is no younger than it: it is written next, never past its interval.
        self._writing = True
        return group

    def _write_group(self, group: list[tuple[int, int, pa.RecordBatch, int]]) -> None:
        generation = group[0][1]
        position = self.next_position
        try:
            # Parts, not one buffer: a large entry is written from its batches' memory.
            data = self._encoder.parts([g[2] for g in group], generation, position)
            t0 = time.perf_counter()
            self._put(position, data)
            elapsed = time.perf_counter() - t0
            # Inside the try: a failing callback must become the WAL's error, or the waiters
            # (and a dead background thread) would never learn the entry's fate.
            self._on_entry_written(generation, position)
        except BaseException as e:
            with self._mutex:
                self.error = e
                self._writing = False
                self._cond.notify_all()
            raise
        with self._mutex:
            self.next_position = position + 1
            self.flushed_seq = group[-1][0]
            self.entries_written += 1
            self.bytes_written += sum(len(p) for p in data)
            self.put_seconds += elapsed
            self._writing = False
            self._cond.notify_all()

    def _put(self, position: int, data: Sequence[bytes | memoryview]) -> None:
        path = layout.wal_entry_path(self.region_id, position)
        for attempt in range(_PUT_ATTEMPTS):
            try:
                self.store.put_if_not_exists(path, data, checksummed=True)
                return
            except ObjectExistsError:
                # A retried put whose first attempt landed (its reply lost) finds its own bytes.
                if attempt and self._holds(position, data):
                    return
                raise self._fenced_at(position) from None
            except (SyncFailedError, StorageUnavailableError):
                raise  # never retry an fsync; the store already retried what it did not answer
            except StorageError:
                if attempt == _PUT_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * 2**attempt)

    def _holds(self, position: int, data: Sequence[bytes | memoryview]) -> bool:
        try:
            return self.store.get(layout.wal_entry_path(self.region_id, position)) == b"".join(data)
        except StorageError:
            return False

    def _fenced_at(self, position: int) -> MemWalError:
        try:
            other = read_wal_entry(self.store, self.region_id, position)
        except CorruptWalEntryError:
            other = None
        epoch = other.writer_epoch if other is not None else "unknown"
        return WriterFencedError(
            f"region {self.region_id}: WAL position {position} was taken by writer epoch "
            f"{epoch} (this writer has epoch {self.writer_epoch}); a newer writer claimed the "
            "region. Acknowledged writes are safe; reopen a writer to continue"
        )

    def _background(self) -> None:
        while True:
            with self._mutex:
                while True:
                    if self._closing or self.error is not None:
                        return
                    if self._pending and not self._writing:
                        due = self._oldest_pending + self.max_flush_interval
                        now = time.monotonic()
                        if (
                            now >= due
                            or self._pending_bytes >= self.max_buffer_bytes
                            or len(self._pending) >= self.max_buffer_batches
                        ):
                            group = self._take_group()
                            break
                        self._cond.wait(due - now)
                    else:
                        self._cond.wait()
            try:
                self._write_group(group)
            except BaseException:
                return
